// The L1 memory region: one anonymous mapping of a fixed size (cache.l1_size),
// allocated once at start, from which chunk slots of any size are carved on
// demand (one chunk of one rank per slot).
//
// One sidecar serves several models and layouts at once, so chunks of
// different byte sizes share the region: a slot is a run of whole
// slot_align units, as long as its chunk (rounded up). Free space is kept as
// address-ordered runs that merge with their neighbours when a slot is
// freed, and alloc() takes the smallest run that fits (best fit), so slots
// of one size reuse each other's holes and a run freed by a larger chunk is
// not chipped away while an exact fit exists. Which chunk to evict when no
// run fits is the index's business (chunk_index::reserve); the pool answers
// the question it needs: how long a run would freeing this slot open?
//
// Single-threaded: the store actor owns it. data(slot) stays valid for the
// pool's lifetime; whether the bytes in it are still the chunk's is the
// index's business (locks), not timing.
#pragma once

#include "core/error.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace kvs {

using slot_id = uint32_t;
inline constexpr slot_id invalid_slot = UINT32_MAX;

struct pool_options {
  /// Bytes to map. Rounded up to the mapping alignment.
  size_t capacity_bytes = 0;
  /// Fault every page in at start (MAP_POPULATE): slower start, no page
  /// faults on the first copies, and a start-up failure instead of an OOM
  /// kill later when memory is short.
  bool populate = false;
  /// Align the region to 2 MiB and madvise(MADV_HUGEPAGE) it, so transparent
  /// huge pages can back it (fewer TLB misses, faster cudaHostRegister).
  bool hugepages = true;
  /// Every slot starts at a multiple of this (power of two) and is a whole
  /// number of these long. 256 keeps slots friendly to DMA and vectorized
  /// copies.
  size_t slot_align = 256;
};

class slot_pool {
public:
  /// Maps the region. On failure error kind "bad_option" (slot_align) or
  /// "mmap" (mapping or populating it), the detail saying why.
  static expected<std::unique_ptr<slot_pool>> create(const pool_options& opts);
  ~slot_pool();
  slot_pool(const slot_pool&) = delete;
  slot_pool& operator=(const slot_pool&) = delete;

  /// O(log runs). A slot of at least `bytes` bytes, or invalid_slot when no
  /// free run is that long (or bytes is 0 or larger than the region).
  slot_id alloc(size_t bytes);
  /// O(log runs). Returns false (and changes nothing) for an invalid or free
  /// slot. The slot's run merges with free neighbours.
  bool free(slot_id s);

  std::byte* data(slot_id s) const { return base_ + slots_[s].offset; }
  size_t offset(slot_id s) const { return slots_[s].offset; }
  bool in_use(slot_id s) const { return s < slots_.size() && slots_[s].used; }
  /// Usable bytes of a slot (what alloc() was asked for).
  size_t slot_bytes(slot_id s) const { return slots_[s].bytes; }
  /// Bytes a slot occupies (slot_bytes rounded up to slot_align).
  size_t slot_stride(slot_id s) const { return slots_[s].stride; }
  /// What alloc(bytes) would occupy; 0 when it overflows.
  size_t stride_for(size_t bytes) const;

  /// Length of the free run that freeing `s` (in use) would leave: its own
  /// bytes plus the free runs right before and after it.
  size_t run_if_freed(slot_id s) const;
  /// The longest free run (0 when full).
  size_t largest_free_run() const;

  size_t slots_used() const { return used_count_; }
  /// Slot ids handed out so far are < slot_ids() (ids are recycled).
  size_t slot_ids() const { return slots_.size(); }
  /// Bytes occupied by slots in use (strides).
  size_t bytes_used() const { return bytes_used_; }
  size_t slot_align() const { return align_; }

  /// The whole mapping (for cudaHostRegister and the like): base() ..
  /// base() + mapped_bytes(), capacity rounded up to the page (or 2 MiB).
  std::byte* base() const { return base_; }
  size_t mapped_bytes() const { return map_len_; }
  /// Faults [offset, offset + len) of the mapping in (clipped to it) without
  /// changing a byte: MADV_POPULATE_WRITE fills page tables, it writes no
  /// data, so this is safe while slots are in use and from another thread
  /// (it reads only base() and mapped_bytes(), fixed after create). Error
  /// kind "unsupported" on kernels without it (before Linux 5.14: the
  /// fallback of writing each page could overwrite a chunk being stored),
  /// "mmap" when the kernel refuses (ENOMEM: the memory is not there).
  status prefault(size_t offset, size_t len) const;

  /// End of the highest slot ever handed out: every byte at or past it has
  /// never been written through a slot, every new slot that is not a reused
  /// hole starts at or below it (best fit carves the start of a run). The
  /// fault-ahead (actors/cache/l1_prefault.hpp) keeps [high_water,
  /// high_water + its window) resident; readable from any thread.
  size_t high_water() const { return high_water_.load(std::memory_order_relaxed); }

  /// The capacity asked for (what fill fractions are relative to); slots
  /// are carved from [0, capacity rounded down to slot_align).
  size_t capacity_bytes() const { return capacity_; }

private:
  slot_pool() = default;
  void add_run(size_t offset, size_t len);
  void drop_run(std::map<size_t, size_t>::iterator it);

  struct slot_rec {
    size_t offset = 0;
    size_t stride = 0;
    size_t bytes = 0;
    bool used = false;
  };

  std::byte* base_ = nullptr;     // aligned start of the mapping
  size_t map_len_ = 0;
  size_t capacity_ = 0;
  size_t align_ = 256;
  std::vector<slot_rec> slots_;
  std::vector<slot_id> free_ids_;          // recycled slot ids
  std::map<size_t, size_t> runs_;          // free runs: offset -> length
  std::set<std::pair<size_t, size_t>> by_len_;  // (length, offset): best fit
  size_t used_count_ = 0;
  size_t bytes_used_ = 0;
  std::atomic<size_t> high_water_{0}; // written by the owner, read by the prefault thread
};

} // namespace kvs
