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

/// What a lookup (and its L2 prefetch) needs of a hybrid model's groups,
/// as its registration gives them, one entry per group.
struct model_groups {
  std::vector<int32_t> windows; ///< stage_group::window: -1 full attention
  std::vector<uint64_t> bytes;  ///< a chunk of the group, per rank (L2 objects' layout)
  std::vector<uint8_t> formats; ///< chunk_format of the group's L1 entries
};

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

// What an L2 prefetch of a hybrid model asks for (actors/cache/store_l2.cpp):
// first every full-attention group's chunks from the end of its L1 run,
// then, once those are in, each windowed group's window ending where the
// shortest full-attention run ends. Chunks below `base` count as present.

/// The end of group g's run of chunks committed in L1 on every rank,
/// starting at chunk 0.
size_t group_run_end(const chunk_index& index, const std::vector<uint64_t>& hashes, uint32_t g,
                     int world_size, size_t base);
/// The chunks c in [from, to) whose group-g part L1 lacks on some rank.
std::vector<size_t> group_chunks_missing(const chunk_index& index, const std::vector<uint64_t>& hashes,
                                         uint32_t g, size_t from, size_t to, int world_size,
                                         size_t base);

} // namespace kvs
