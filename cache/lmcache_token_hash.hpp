// LMCache's chunk hash, as its multiprocess server's TokenHasher computes it
// (lmcache/v1/multiprocess/token_hasher.py, 0.5.6 and 0.5.7rc2,
// `--hash-algorithm blake3`, the default):
//
//   none_hash = BLAKE3(i64be(0) || u32be(0))        (hash_func((0, (0,), None)))
//   h[-1]     = none_hash
//   h[i]      = BLAKE3(h[i-1] || u32be(tok[i*cs]) || ... || u32be(tok[(i+1)*cs - 1]))
//
// 32-byte digests, chained over full chunks only (a trailing partial chunk
// is not hashed). Model, rank, group and salt are not hashed: they are the
// other fields of LMCache's ObjectKey (l2/lmcache_object_name.hpp).
// Tokens must fit an unsigned 32-bit integer (Python's struct.pack(">I")
// refuses others): hashing stops before the first chunk holding one.
//
// kvsidecar keeps its own 64-bit hash (cache/chunk_hash.hpp) for L1, the
// lock ledger and KV events; this one only names L2 objects when
// l2.format = "lmcache".
#pragma once

#include "cache/blake3.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvs {

/// LMCache's NONE_HASH for blake3.
blake3_digest lmcache_none_hash();

/// Appends the chain hashes of the full chunks of tokens[0, n) to `out` (as
/// 32-byte strings), stopping before the first chunk with a token outside
/// [0, 2^32). Returns how many were appended.
size_t append_lmcache_chunk_hashes(const int64_t* tokens, size_t n, size_t chunk_size,
                                   std::vector<std::string>& out);
/// The same for tokens as LMCache's keys carry them (every one fits).
size_t append_lmcache_chunk_hashes(const uint32_t* tokens, size_t n, size_t chunk_size,
                                   std::vector<std::string>& out);

} // namespace kvs
