// Prefix-chained chunk hashing: chunk i's hash names the whole token prefix
// [0, (i+1) * chunk_size) under one cache identity (model, world size, salt).
//
// Stable format (version "kvsidecar.chunk.v1"; changing any of this changes
// every key, so bump the tag if you ever must):
//   identity_seed = XXH3_64bits(
//       "kvsidecar.chunk.v1"
//       || u64le(len(model)) || model
//       || i64le(world_size)
//       || u64le(len(cache_salt)) || cache_salt)
//   h[-1] = identity_seed
//   h[i]  = XXH3_64bits(u64le(h[i-1]) || i64le(tok[i*cs]) || ... || i64le(tok[(i+1)*cs - 1]))
// Tokens are hashed as little-endian int64 on every host (same bytes on
// little- and big-endian machines). Only full chunks are hashed; a trailing
// partial chunk is ignored, as LMCache's TokenHasher does.
//
// The TP rank is deliberately not hashed: one prefix has one hash, and the
// rank is the second half of the index key (see chunk_index.hpp), so a
// scheduler lookup (worker_id nil) can probe every rank with one hash list.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace kvs {

/// Seed naming one cache identity. Two requests share chunks only when model,
/// world size and salt are all equal.
uint64_t identity_seed(std::string_view model, int64_t world_size,
                       std::string_view cache_salt);

/// Hashes of the floor(n_tokens / chunk_size) full chunks of `tokens`, each
/// chained on the previous one starting from `seed`. chunk_size 0 yields none.
std::vector<uint64_t> chunk_hashes(const int64_t* tokens, size_t n_tokens,
                                   size_t chunk_size, uint64_t seed);

/// Same as above, appending to `out` (reuses its capacity; no other allocation
/// beyond one scratch buffer per call).
void append_chunk_hashes(const int64_t* tokens, size_t n_tokens,
                         size_t chunk_size, uint64_t seed,
                         std::vector<uint64_t>& out);

/// The key of LMCache group `group` of the chunk whose prefix hash is `h`
/// (a multi-group, hybrid-KV registration stores each group's part of a
/// chunk as its own object, as LMCache's ObjectKey.object_group_id does).
/// Group 0 keeps the prefix hash itself, so its chunks are announced and
/// found as a single-group model's are; group g > 0 is
///   XXH3_64bits("kvsidecar.group.v1" || u64le(h) || u32le(g)).
uint64_t group_hash(uint64_t h, uint32_t group);

/// Number of full chunks in n_tokens (0 when chunk_size is 0).
inline size_t full_chunks(size_t n_tokens, size_t chunk_size) {
  return chunk_size == 0 ? 0 : n_tokens / chunk_size;
}

} // namespace kvs
