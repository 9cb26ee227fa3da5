// The L1 chunk index: which chunk of which rank lives in which pool slot,
// whether it is visible yet, who reads it, and what to evict next.
//
// Key = {prefix hash (chunk_hash.hpp), TP rank}. An entry is
//   reserved  -- a slot is held for a copy in flight; invisible to lookups,
//                never evicted; becomes committed or is aborted;
//   committed -- visible to lookups; either unlocked (in the LRU list,
//                evictable) or read-locked (never evicted, off the LRU list).
// Read locks are counts with one expiry per entry (refreshed by every lock,
// as LMCache's TTLLock does). Each lock lifetime has an epoch: a lock_token
// only releases readers of the lifetime it was taken in, so an unlock that
// arrives after the lock expired (or after the chunk was evicted and stored
// again) is a counted no-op instead of stealing someone else's lock.
//
// Eviction happens inside reserve(), in bytes of the one L1 region that
// every model and layout shares (slot_pool.hpp), over one LRU list of all
// unlocked committed chunks whatever their size:
//   1. watermarks: when the new slot would push the fill above evict_high,
//      chunks are evicted least-recently-used first until the fill
//      (including the new slot) is at or below evict_low;
//   2. if no free run is still long enough for the new slot (the region is
//      fragmented by chunks of other sizes, or the watermarks are 1.0), the
//      least-recently-used chunk whose eviction alone opens a long enough
//      run goes: a chunk of the same size always qualifies, a smaller one
//      does when free space borders it. Older chunks that would not help
//      stay, so one model's large store does not flush a smaller model's
//      chunks for nothing;
//   3. if no single chunk qualifies (the room needs several neighbours to
//      go), chunks go least-recently-used first until a run fits; for an
//      L1 arena (whose slots never leave one extent) every chunk of the
//      extent holding the oldest chunk among extents with no locked or
//      reserved chunk goes, and none when there is no such extent;
//   4. if the LRU list is empty and nothing fits, no_space / all_pinned.
// Step 2 walks the LRU list from its old end; it runs only when the
// watermark step left no room, which with one chunk size means the oldest
// chunk qualifies at once. Evicted keys are returned so the store can
// publish BlockRemoved events.
//
// Single-threaded: the store actor serializes every call. Time is passed in
// (steady clock), which keeps expiry deterministic and testable.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cache/slot_pool.hpp"

namespace kvs {

using cache_clock = std::chrono::steady_clock;

struct chunk_key {
  uint64_t hash = 0;
  int32_t rank = 0;
};
inline bool operator==(const chunk_key& a, const chunk_key& b) {
  return a.hash == b.hash && a.rank == b.rank;
}
inline bool operator!=(const chunk_key& a, const chunk_key& b) {
  return !(a == b);
}

enum class entry_state : uint8_t { reserved, committed };

/// Proof of a read lock: which entry, and which lock lifetime.
struct lock_token {
  chunk_key key;
  uint32_t epoch = 0;
};

/// A read-only snapshot of one entry.
struct entry_info {
  entry_state state = entry_state::reserved;
  slot_id slot = invalid_slot;
  size_t offset = 0;          // into the pool
  std::byte* data = nullptr;  // pool.data(slot)
  size_t bytes = 0;           // the chunk's size (the slot's usable bytes)
  /// How the chunk's bytes are laid out (chunk_format in cache_messages.hpp:
  /// 0 = LMCache's KV_2LTD, the format every copy-driven store writes): a
  /// reader of another format must not get these bytes.
  uint8_t format = 0;
  arena_id arena = anonymous_arena; ///< the pool arena its slot is in
  uint32_t readers = 0;
  uint32_t lock_epoch = 0;
  cache_clock::time_point lock_expiry{};  // meaningful while readers > 0
};

enum class reserve_status { reserved, already_present, no_space };

enum class no_space_reason {
  none,
  invalid_size,         // 0 bytes
  chunk_too_large,      // bigger than the whole region
  all_pinned,           // no run fits and nothing unlocked is left to evict
};
const char* to_string(no_space_reason r);

struct reserve_result {
  reserve_status status = reserve_status::no_space;
  // reserved: where to copy the chunk.
  slot_id slot = invalid_slot;
  size_t offset = 0;
  std::byte* data = nullptr;
  arena_id arena = anonymous_arena;
  // already_present: committed (skip the copy) or reserved (a copy of the
  // same chunk is in flight; skip it too).
  entry_state existing = entry_state::reserved;
  // no_space: why, and a human sentence for the log.
  no_space_reason reason = no_space_reason::none;
  std::string detail;
  // Chunks evicted to make room (any status): publish BlockRemoved.
  std::vector<chunk_key> evicted;
};

struct index_options {
  double evict_high = 0.9;  // fraction of pool slots
  double evict_low = 0.8;
  std::chrono::nanoseconds lock_ttl = std::chrono::seconds(300);
  /// A reservation older than this is aborted by expire_reservations()
  /// (LMCache's write TTL: 600 s).
  std::chrono::nanoseconds reserve_ttl = std::chrono::seconds(600);
  /// Pre-size the hash table (0: size it from the pool's capacity in 64 KiB
  /// chunks, at most 1M).
  size_t expected_entries = 0;
};

struct index_stats {
  size_t chunks = 0;            // committed entries
  size_t reserved = 0;          // reserved entries
  size_t locked_entries = 0;    // committed entries with readers > 0
  uint64_t outstanding_readers = 0;  // sum of readers over all entries
  uint64_t bytes_used = 0;      // sum of entry sizes (reserved included)
  uint64_t slot_bytes_used = 0; // bytes of the slots in use (strides)
  uint64_t capacity_bytes = 0;  // the pool's capacity
  size_t slots_used = 0;
  uint64_t largest_free_run = 0; // the longest slot the pool can still give
  uint64_t evictions = 0;
  uint64_t lookups = 0;
  uint64_t hit_chunks = 0;      // sum of lookup results
  uint64_t miss_chunks = 0;     // chunks asked for beyond the hit prefix
  uint64_t reserve_no_space = 0;
  uint64_t expired_locks = 0;   // entries whose lock TTL ran out
  uint64_t expired_reservations = 0;
  uint64_t stale_unlocks = 0;   // unlocks of an ended lock lifetime
};

class chunk_index {
public:
  /// The pool must outlive the index. The options' watermarks are clamped to
  /// 0 <= evict_low <= evict_high <= 1.
  chunk_index(slot_pool& pool, index_options opts = {});
  chunk_index(const chunk_index&) = delete;
  chunk_index& operator=(const chunk_index&) = delete;

  // --- lookups --------------------------------------------------------------
  /// Length of the leading run of chunks committed for every rank
  /// 0..world_size-1 (a scheduler lookup, worker_id nil). 0 if world_size < 1.
  size_t lookup_prefix(const uint64_t* hashes, size_t n, int world_size);
  /// Same for one rank (a worker's own lookup).
  size_t lookup_prefix_rank(const uint64_t* hashes, size_t n, int rank);
  std::optional<entry_info> find(chunk_key k) const;
  /// Marks a committed unlocked chunk most recently used. False if absent,
  /// reserved or locked (locked chunks re-enter the LRU as most recent when
  /// their last reader leaves).
  bool touch(chunk_key k);

  // --- read locks -----------------------------------------------------------
  /// Adds `readers` readers to a committed chunk and pushes its expiry to at
  /// least now + lock_ttl. nullopt when absent, reserved, or readers == 0.
  std::optional<lock_token> lock(chunk_key k, uint32_t readers,
                                 cache_clock::time_point now);
  /// Releases up to `readers` readers of the token's lock lifetime; returns
  /// how many were released (0 for a stale token). The last reader leaving
  /// puts the chunk back in the LRU as most recently used.
  uint32_t unlock(const lock_token& t, uint32_t readers = 1);
  /// Drops every lock whose expiry is <= now. Returns the number of entries
  /// unlocked.
  size_t expire_locks(cache_clock::time_point now);
  /// Is this token's lock lifetime still the entry's current one?
  bool lock_alive(const lock_token& t) const;

  // --- write path -----------------------------------------------------------
  /// `arena`: the pool arena the slot must come from (slot_pool.hpp; 0, the
  /// anonymous L1, for every copy-driven store). Eviction is the same
  /// global LRU; steps 2 and 3 count only the room `arena` can use.
  reserve_result reserve(chunk_key k, size_t bytes,
                         cache_clock::time_point now, uint8_t format = 0,
                         arena_id arena = anonymous_arena);
  /// reserved -> committed (visible, most recently used). False otherwise.
  bool commit(chunk_key k);
  /// Frees a reservation (the copy failed). False if not reserved.
  bool abort(chunk_key k);
  /// Aborts reservations older than reserve_ttl; returns their keys.
  std::vector<chunk_key> expire_reservations(cache_clock::time_point now);

  // --- removal --------------------------------------------------------------
  /// Removes one committed unlocked chunk. False otherwise.
  bool erase(chunk_key k);
  /// Removes every committed unlocked chunk; returns their keys. Locked and
  /// reserved chunks stay.
  std::vector<chunk_key> clear();
  /// Removes the committed unlocked chunks of one rank; returns their keys.
  std::vector<chunk_key> erase_rank(int rank);

  // --- observation ----------------------------------------------------------
  /// Visits committed entries in table order from position `from` (0 to
  /// start) until `visit` returns false or `budget` entries were looked at;
  /// returns the position to resume from, or SIZE_MAX when every entry was
  /// visited. Positions are entry slots: a resume after entries came and
  /// went may skip or repeat a few (a listing's page cursor, not a snapshot).
  size_t scan(size_t from, size_t budget,
              const std::function<bool(chunk_key, const entry_info&)>& visit) const;
  index_stats stats() const;
  uint64_t outstanding_readers() const { return outstanding_readers_; }
  size_t locked_entries() const { return locked_.size(); }
  size_t size() const { return live_; }
  const slot_pool& pool() const { return pool_; }
  const index_options& options() const { return opts_; }
  /// Walks every structure and cross-checks it (map <-> entries <-> lists <->
  /// pool, counters). For tests; O(n). Error kind "invariant" naming the
  /// first broken one.
  status check_invariants() const;

private:
  static constexpr uint32_t npos = UINT32_MAX;
  enum class where : uint8_t { free, reserved, lru, locked };

  struct entry {
    uint64_t hash = 0;
    // reserved: when the reservation was made; locked: lock expiry.
    cache_clock::time_point stamp{};
    uint64_t bytes = 0;
    int32_t rank = 0;
    uint8_t format = 0;
    slot_id slot = invalid_slot;
    uint32_t readers = 0;
    uint32_t epoch = 0;
    uint32_t prev = npos;      // LRU links (where == lru); free-list link
    uint32_t next = npos;
    uint32_t list_pos = npos;  // position in reserved_ / locked_
    where at = where::free;
  };

  // Open addressing, linear probing, backward-shift deletion. The key and a
  // "committed" bit live in the bucket, so a lookup probe reads only the
  // table, never the entry. All ranks of one chunk hash home to adjacent
  // buckets (home(hash) + rank), so a world_size lookup of one chunk reads
  // one or two cache lines. (Explicit prefetching and huge-page backing of
  // the table were tried and measured no gain: out-of-order execution
  // already overlaps the independent probes.)
  struct bucket {
    uint64_t hash;
    int32_t rank;
    uint32_t ref;  // entry index | k_visible; npos: empty
  };
  static constexpr uint32_t k_visible = 0x80000000u;
  static constexpr uint32_t k_idx_mask = 0x7fffffffu;

  size_t home(uint64_t hash, int32_t rank) const;
  uint32_t find_idx(uint64_t hash, int32_t rank) const;
  size_t find_bucket(uint64_t hash, int32_t rank) const;
  void map_insert(uint64_t hash, int32_t rank, uint32_t idx);
  void map_erase(uint64_t hash, int32_t rank);
  void map_grow(size_t min_entries);

  uint32_t new_entry();
  void remove_entry(uint32_t idx);  // unlinks, frees slot and map bucket

  void lru_push_back(uint32_t idx);
  void lru_unlink(uint32_t idx);
  void list_push(std::vector<uint32_t>& list, uint32_t idx);
  void list_remove(std::vector<uint32_t>& list, uint32_t idx);
  void end_lock_lifetime(uint32_t idx);  // readers -> 0, back to the LRU
  void evict(uint32_t idx, reserve_result& r);
  slot_id make_room(size_t bytes, size_t stride, arena_id arena, reserve_result& r);
  slot_id evict_for_extent(size_t bytes, size_t stride, arena_id arena, reserve_result& r);

  entry_info info(const entry& e) const;
  bool committed(uint64_t hash, int32_t rank) const;

  slot_pool& pool_;
  index_options opts_;

  std::vector<bucket> table_;
  size_t mask_ = 0;
  std::vector<entry> entries_;
  uint32_t free_head_ = npos;  // free entries, linked through `next`
  size_t live_ = 0;

  uint32_t lru_head_ = npos;  // least recently used
  uint32_t lru_tail_ = npos;  // most recently used
  size_t lru_size_ = 0;
  std::vector<uint32_t> locked_;
  std::vector<uint32_t> reserved_;

  uint32_t next_epoch_ = 1;
  uint64_t outstanding_readers_ = 0;
  uint64_t bytes_used_ = 0;

  uint64_t evictions_ = 0;
  uint64_t lookups_ = 0;
  uint64_t hit_chunks_ = 0;
  uint64_t miss_chunks_ = 0;
  uint64_t reserve_no_space_ = 0;
  uint64_t expired_locks_ = 0;
  uint64_t expired_reservations_ = 0;
  uint64_t stale_unlocks_ = 0;
};

} // namespace kvs
