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
// Arenas (issue #46, engine-driven without the staging copy). Arena 0 is the
// anonymous mapping above. open_arena() adds a shared-memory object of the
// mapping's size (sparse) that one set of engine-driven clients maps whole;
// slots of that arena are carved from extents (pool_options::extent_bytes,
// aligned) mapped from the object at their own offset, so a slot's pool
// offset is its offset in the object: the engine writes and reads L1 slots
// in place. An extent belongs to one arena at a time; an arena claims a
// whole free extent of arena 0 (or an empty one of another arena) when none
// of its own has room, and the bytes of an extent that changes arena are
// dropped from the old object (FALLOC_FL_PUNCH_HOLE: its clients then read
// zeros there, never another arena's chunk). Arena 0's runs may span
// extents; another arena's never leave their extent, so no slot larger
// than an extent lives outside arena 0. An open arena keeps its emptied
// extents (their pages stay resident for its next stores) until another
// arena needs them; a closed one (close_arena: its name unlinked) gives
// them back to arena 0 as they empty. With no arena opened, the pool is
// exactly the single anonymous region it always was.
//
// A client may shrink its arena's object (it opens it read-write): reads
// and writes of such an arena's slots by the sidecar belong under the
// SIGBUS guard (gpu/fault_guard.hpp), as the staging copies are.
//
// Single-threaded: the store actor owns it. data(slot) stays valid for the
// pool's lifetime; whether the bytes in it are still the chunk's is the
// index's business (locks), not timing.
#pragma once

#include "cache/arena_heal.hpp"
#include "core/error.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
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
  /// Arenas other than 0 own whole extents of this many bytes (rounded up
  /// to the mapping alignment; clipped to the capacity). A chunk larger
  /// than an extent can only live in arena 0.
  size_t extent_bytes = size_t{256} << 20;
};

using arena_id = uint32_t;
inline constexpr arena_id anonymous_arena = 0;

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
  slot_id alloc(size_t bytes) { return alloc(bytes, anonymous_arena); }
  /// A slot in arena `a` (invalid_slot also for an arena not open, or a
  /// chunk larger than an extent outside arena 0). May move a free extent
  /// to `a` (remapping it: O(extents + runs)).
  slot_id alloc(size_t bytes, arena_id a);
  /// O(log runs). Returns false (and changes nothing) for an invalid or free
  /// slot. The slot's run merges with free neighbours of its arena.
  bool free(slot_id s);

  // --- arenas -----------------------------------------------------------------
  /// Creates the shared-memory object `name` ("/kvsidecar.…", O_EXCL, mode
  /// 0600, owned by `owner_uid` when given and not ours), as large as the
  /// mapping and sparse: an extent's pages are reserved (posix_fallocate)
  /// when the arena claims it. Error kind "arena" naming the call and why.
  /// `extra_bytes`: the object is that much longer than the mapping (page
  /// multiple): room its clients' staging slots take after the L1 offsets
  /// (gpu/staging_pool.hpp maps it). A fault in an arena extent of an
  /// object its client shrank is healed (cache/arena_heal.hpp).
  expected<arena_id> open_arena(std::string name, std::optional<uint32_t> owner_uid = {},
                                uint64_t extra_bytes = 0);
  /// The arena object's size (the mapping plus its extra bytes).
  uint64_t arena_size(arena_id a) const { return arenas_[a].object_size; }
  /// Unlinks the arena's name (its clients keep their mappings); its slots
  /// stay valid, its extents go back to arena 0 as they empty. False for an
  /// arena not open.
  bool close_arena(arena_id a);
  bool arena_open(arena_id a) const { return a < arenas_.size() && arenas_[a].open; }
  const std::string& arena_name(arena_id a) const { return arenas_[a].name; }
  /// Extents arena `a` holds now.
  size_t arena_extents(arena_id a) const { return a < arenas_.size() ? arenas_[a].extents : 0; }
  arena_id arena_of(slot_id s) const { return arena_at(slots_[s].offset); }
  size_t extent_bytes() const { return extent_; }
  /// Extents L1 is cut into (0 until the first arena opens) and how long
  /// extent i is (the last may be shorter).
  size_t extent_count() const { return extents_.size(); }
  size_t extent_length(size_t i) const { return extent_len(i); }
  /// Claims one more extent for arena `a` before it needs one (issue #46:
  /// an engine-driven store should find its slots reserved and resident,
  /// not reserve 256 MiB inside prepare_store): when `a` is open and has
  /// less than one extent of free room, a free aligned extent of arena 0
  /// moves to it (reserved, remapped: move_extent). Only free space: it
  /// evicts nothing and takes nothing from another arena (which can take it
  /// back while it is empty, as any empty extent). The extent's
  /// [offset, length) to fault in (prefault_extent), or nullopt.
  std::optional<std::pair<size_t, size_t>> claim_ahead(arena_id a);
  /// Faults an arena extent's pages into the sidecar's mapping, zeroed:
  /// the object's pages are allocated by the claim's posix_fallocate but
  /// zeroed only on first touch, which the engine's gather would otherwise
  /// pay per 4 KiB (measured: 256 MiB written through a client's mapping
  /// of a fresh object 230 ms, reserved 185 ms, faulted in here first
  /// 130 ms). Writes no byte; safe from another thread. A client that
  /// shrank its object makes this stop with an error (MADV_POPULATE_WRITE
  /// answers EFAULT there, it raises no SIGBUS); an extent moved meanwhile
  /// faults in what is mapped there now, which is as harmless.
  status prefault_extent(size_t offset, size_t len) const;
  /// Why the last extent an arena tried to claim could not be had (the
  /// kernel refused the remap, or /dev/shm could not hold it); "" after a
  /// claim that worked.
  const std::string& arena_error() const { return arena_error_; }

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
  /// With `a`: the run arena `a` could use, that is the slot's own merged
  /// run when it is `a`'s; a whole extent when freeing it empties an extent
  /// another arena may take (or, in arena 0, leaves a free aligned extent);
  /// 0 otherwise.
  size_t run_if_freed(slot_id s) const { return run_if_freed(s, arena_of(s)); }
  size_t run_if_freed(slot_id s, arena_id a) const;
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
  /// Adds [offset, offset + len) of arena arena_at(offset) as free, merged
  /// with the neighbouring runs it may merge with.
  void insert_free(size_t offset, size_t len);
  /// Do runs at these two offsets belong together (same arena; outside
  /// arena 0, the same extent)?
  bool mergeable(size_t a, size_t b) const;
  /// The merged free run freeing `s` would leave: [first, second).
  std::pair<size_t, size_t> merged_if_freed(slot_id s) const;
  arena_id arena_at(size_t offset) const {
    return extents_.empty() ? anonymous_arena : extents_[offset / extent_].arena;
  }
  size_t extent_len(size_t i) const { return std::min(extent_, slot_end_ - i * extent_); }
  /// Moves empty extent i (all of it one free run) to arena `to`: remaps
  /// it, drops the old object's pages. False (nothing changed) when the
  /// kernel refuses.
  bool move_extent(size_t i, arena_id to);
  /// Gives `a` one more extent: a free aligned one of arena 0, else an empty
  /// one of another arena (closed arenas first).
  bool claim_extent(arena_id a, size_t stride);
  /// prefault() and prefault_extent(): MADV_POPULATE_WRITE a huge page per
  /// call, skipping arena extents when `skip_arenas`.
  status populate(size_t offset, size_t len, bool skip_arenas) const;
  /// A free aligned extent of arena 0 at least `min_len` long (inside one
  /// of its free runs), by index.
  std::optional<size_t> free_extent(size_t min_len);
  /// Gives arena 0 back empty extents of other arenas until a run of
  /// `stride` fits (closed arenas first).
  bool reclaim_for_anonymous(size_t stride);
  std::set<std::pair<size_t, size_t>>& lens(arena_id a) { return by_len_[a]; }

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
  // Per arena: (length, offset) of its free runs, for best fit.
  std::vector<std::set<std::pair<size_t, size_t>>> by_len_;
  struct arena_rec {
    std::string name;
    int fd = -1;          // -1: arena 0, or a closed arena with no extent left
    bool open = false;
    size_t extents = 0;
    uint64_t object_size = 0;
  };
  // What the SIGBUS healer reads (another thread, a signal handler): per
  // extent, the object mapped there and its size. Allocated with extents_.
  std::unique_ptr<std::atomic<int>[]> extent_fd_;
  std::unique_ptr<std::atomic<uint64_t>[]> extent_size_;
  arena_heal_table heal_{};
  bool heal_added_ = false;
  /// Read by the prefault thread: set once, when the first arena opens.
  std::atomic<const std::atomic<int>*> extent_fd_view_{nullptr};
  size_t extents_count_ = 0; // written before extent_fd_view_ is published
  std::vector<arena_rec> arenas_;     // [0]: the anonymous region
  std::vector<arena_id> free_arena_ids_;
  struct extent_rec {
    arena_id arena = anonymous_arena;
    uint32_t slots = 0;   // slots in use (counted outside arena 0 only)
  };
  std::vector<extent_rec> extents_;   // empty until an arena opens
  size_t extent_ = 0;
  size_t slot_end_ = 0;               // slots are carved from [0, slot_end_)
  bool hugepages_ = false;
  std::string arena_error_;
  size_t used_count_ = 0;
  size_t bytes_used_ = 0;
  std::atomic<size_t> high_water_{0}; // written by the owner, read by the prefault thread
};

} // namespace kvs
