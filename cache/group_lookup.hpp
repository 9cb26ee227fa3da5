// LOOKUP of a hybrid-KV model (a multi-group engine-driven registration,
// LMCache 0.5.7's group_layouts): which prefix every group can serve, and
// the read locks that keep it.
//
// Each group's part of chunk c is its own L1 entry, keyed by
// group_hash(hash[c], g) (cache/chunk_hash.hpp). A prefix of L chunks is
// servable when every full-attention group (window -1) holds chunks
// 0..L-1 and every windowed group (sliding-window attention, recurrent
// state) holds its last min(window, L) chunks -- LMCache's fold_grouped
// rule (lmcache/v1/distributed/bitmap_ops/fold.py); a windowed group never
// stores its all-null earlier chunks, so it cannot be asked for them. The
// hit is the longest servable L (not monotone: a longer prefix can be
// servable where a shorter one is not).
//
// Locks: group g's chunks [lo_g, L) are read-locked under the ledger
// session group_session(session, g) (cache_messages.hpp), lo_g = 0 for full
// attention, L - window otherwise (never below base): exactly what a
// worker's retrieve of group g reads.
#pragma once

#include "cache/chunk_index.hpp"
#include "cache/lock_ledger.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace kvs {

/// The ledger session that holds group `g`'s locks of `session`: the
/// session itself for group 0.
std::string group_session(const std::string& session, uint32_t g);

/// The hit of `hashes` (chunks 0..n-1; those below `base` are the engine's
/// own and count as present) over groups with `windows`, every group's
/// in-window part of it read-locked on every rank (replacing what the
/// sessions held). Returns the hit length in chunks, counted from chunk 0.
size_t lookup_groups(chunk_index& index, lock_ledger& ledger, const std::string& session,
                     const std::vector<uint64_t>& hashes, const std::vector<int32_t>& windows,
                     int world_size, uint32_t readers_per_key, cache_clock::time_point now,
                     size_t base);

} // namespace kvs
