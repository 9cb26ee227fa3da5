// The L1 memory region: one anonymous mapping of a fixed size, allocated once
// at start, carved into equal slots (one chunk of one rank per slot).
//
// Slot size is a property of the pool, chosen at the first KV-cache
// registration (bytes per chunk per rank) and changeable only while no slot
// is in use. Chunks of a smaller byte size fit in a slot (the rest of the slot
// is wasted); larger ones are refused by the index with reason
// chunk_too_large. Mixing models with different chunk byte sizes in one
// sidecar therefore wastes memory or fails for the larger model; a size-class
// pool would fix that if it ever matters.
//
// Single-threaded: the store actor owns it. data(slot) stays valid for the
// pool's lifetime; whether the bytes in it are still the chunk's is the
// index's business (locks), not timing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
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
  /// Every slot starts at a multiple of this (power of two). 256 keeps slots
  /// friendly to DMA and vectorized copies.
  size_t slot_align = 256;
};

class slot_pool {
public:
  /// Maps the region. On failure returns null and says why in *error.
  static std::unique_ptr<slot_pool> create(const pool_options& opts,
                                           std::string* error);
  ~slot_pool();
  slot_pool(const slot_pool&) = delete;
  slot_pool& operator=(const slot_pool&) = delete;

  /// Sets the slot size (bytes per chunk per rank). Refused (returns false,
  /// *error says why) while any slot is in use, for 0, or when one slot
  /// would not fit in the region.
  bool configure(size_t slot_bytes, std::string* error);
  bool configured() const { return slot_bytes_ != 0; }

  /// O(1). invalid_slot when none is free or the pool is not configured.
  slot_id alloc();
  /// O(1). Returns false (and changes nothing) for an invalid or free slot.
  bool free(slot_id s);

  std::byte* data(slot_id s) const { return base_ + offset(s); }
  size_t offset(slot_id s) const { return static_cast<size_t>(s) * stride_; }
  bool in_use(slot_id s) const { return s < used_.size() && used_[s] != 0; }

  /// At most 2^31 - 2 slots (the index packs entry numbers into 31 bits).
  /// Usable bytes per slot (what configure() was given).
  size_t slot_bytes() const { return slot_bytes_; }
  /// Distance between slot starts (slot_bytes rounded up to slot_align).
  size_t slot_stride() const { return stride_; }
  size_t slot_count() const { return used_.size(); }
  size_t slots_used() const { return used_.size() - free_.size(); }
  size_t slots_free() const { return free_.size(); }

  /// The whole mapping (for cudaHostRegister and the like): base() ..
  /// base() + mapped_bytes(), capacity rounded up to the page (or 2 MiB).
  std::byte* base() const { return base_; }
  size_t mapped_bytes() const { return map_len_; }
  /// The capacity asked for (what fill fractions are relative to).
  size_t capacity_bytes() const { return capacity_; }

private:
  slot_pool() = default;

  std::byte* base_ = nullptr;     // aligned start of the mapping
  size_t map_len_ = 0;
  size_t capacity_ = 0;           // slots are carved from this much
  size_t align_ = 256;
  size_t slot_bytes_ = 0;
  size_t stride_ = 0;
  std::vector<slot_id> free_;     // stack; lowest ids on top
  std::vector<uint8_t> used_;     // per slot, to refuse double frees
};

} // namespace kvs
