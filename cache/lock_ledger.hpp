// Which read locks each session (LMCache request id) holds, so that every
// lock a LOOKUP takes is released exactly once: by the workers' RETRIEVEs
// (one reader per rank), by FREE_LOOKUP_LOCKS, by a repeated LOOKUP of the
// same request, by END_SESSION, or by the session's idle TTL. The index's
// own lock TTL is the last resort; tokens the index expired are skipped
// here, never released twice.
//
// Invariant (tested by a randomized property test): after any sequence of
// calls, ending every session leaves the index with no outstanding readers
// taken through the ledger.
//
// Single-threaded, like the index it wraps.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/chunk_index.hpp"

namespace kvs {

struct ledger_options {
  /// A session not touched for this long is ended by expire_sessions()
  /// (LMCache: 600 s).
  std::chrono::nanoseconds session_ttl = std::chrono::seconds(600);
};

class lock_ledger {
public:
  /// The index must outlive the ledger.
  explicit lock_ledger(chunk_index& index, ledger_options opts = {});

  /// LOOKUP (worker_id nil). Releases whatever the session still holds from
  /// an earlier lookup, finds the prefix committed on every rank
  /// 0..world_size-1, and read-locks each (chunk, rank) of it with
  /// readers_per_key readers (LMCache's num_kv_readers: 1 when every rank
  /// reads its own shard). Returns the hit length in chunks, counted from
  /// hashes[0]. `base` is the chunk index of hashes[0] (LMCache 0.5.7's
  /// key.start: the engine holds the chunks below it): the other calls take
  /// absolute chunk indices, and chunks below base are never held.
  size_t lookup(const std::string& session, const uint64_t* hashes, size_t n,
                int world_size, uint32_t readers_per_key,
                cache_clock::time_point now, size_t base = 0);

  /// A worker's RETRIEVE of chunks [chunk_begin, chunk_end) is over (copied,
  /// or failed): release `readers` of that rank's remaining readers on each.
  /// Returns readers released (chunks outside the locked prefix count 0).
  /// readers = UINT32_MAX releases all of the rank's share (LMCache's
  /// FREE_LOOKUP_LOCKS with a worker-specific key).
  size_t release_rank(const std::string& session, int rank, size_t chunk_begin,
                      size_t chunk_end, cache_clock::time_point now,
                      uint32_t readers = 1);

  /// FREE_LOOKUP_LOCKS: release everything the session still holds on chunks
  /// [chunk_begin, chunk_end), all ranks. Returns readers released.
  size_t release_range(const std::string& session, size_t chunk_begin,
                       size_t chunk_end, cache_clock::time_point now);

  /// END_SESSION: release everything and forget the session. Returns readers
  /// released (0 for an unknown session).
  size_t end_session(const std::string& session);

  /// Ends sessions idle for session_ttl or longer. Returns how many ended.
  size_t expire_sessions(cache_clock::time_point now);

  bool has_session(const std::string& session) const;
  size_t session_count() const { return sessions_.size(); }
  /// The end (absolute chunk index) of what the session's last lookup hit
  /// and locked: its base plus the chunks locked (0 if unknown).
  size_t locked_end(const std::string& session) const;
  /// Readers the ledger still holds, summed over sessions (including ones the
  /// index has since expired: they are dropped when released).
  uint64_t held_readers() const { return held_readers_; }

  /// Calls fn(token, remaining readers) for every (chunk, rank) a session
  /// still holds. For tests and diagnostics.
  void for_each_held(
      const std::function<void(const std::string&, const lock_token&, uint32_t)>&
          fn) const;

private:
  struct hold {
    uint32_t epoch = 0;
    uint32_t remaining = 0;
  };
  struct session_locks {
    std::vector<uint64_t> hashes;  // the locked prefix, from chunk `base` on
    size_t base = 0;
    int world_size = 0;
    std::vector<hold> holds;       // [chunk * world_size + rank]
    cache_clock::time_point last_active{};
  };

  /// `chunk` absolute; outside [base, base + hashes.size()): nothing held.
  size_t release(session_locks& s, size_t chunk, int rank, uint32_t readers);
  size_t release_all(session_locks& s);

  chunk_index& index_;
  ledger_options opts_;
  std::unordered_map<std::string, session_locks> sessions_;
  uint64_t held_readers_ = 0;
};

} // namespace kvs
