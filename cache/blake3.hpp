// BLAKE3 (https://github.com/BLAKE3-team/BLAKE3-specs), hash mode only,
// written from the specification: portable C++, no SIMD, one thread.
//
// Why here: LMCache's server names its chunks with BLAKE3 (its TokenHasher,
// cache/lmcache_token_hash.hpp), and no Debian package carries a C library
// of it. Checked against the specification's published test vectors
// (tests/unit/test_cache_lmcache_hash.cpp). Throughput is what a scalar
// compression function gives (BENCHMARKS.md, "LMCache-format L2"): enough
// for ~1 KiB per chunk, not meant for bulk data.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace kvs {

inline constexpr size_t blake3_out_bytes = 32;
using blake3_digest = std::array<uint8_t, blake3_out_bytes>;

/// Incremental BLAKE3 (hash mode, default key): update() any number of
/// times, then finalize() (which leaves the hasher as it was, so more input
/// may follow, as the reference implementation allows).
class blake3_hasher {
public:
  blake3_hasher();
  void update(const void* data, size_t n);
  /// The first `out_len` bytes of the extendable output (32 = the hash).
  void finalize(uint8_t* out, size_t out_len) const;
  blake3_digest digest() const;

private:
  struct chunk_state {
    uint32_t cv[8];
    uint64_t counter = 0;
    uint8_t block[64];
    uint8_t block_len = 0;
    uint8_t blocks_compressed = 0;
  };
  void reset_chunk(uint64_t counter);
  void push_cv(const uint32_t cv[8], uint64_t total_chunks);

  chunk_state chunk_;
  uint32_t stack_[54][8]; ///< chaining values of finished subtrees (2^54 chunks at most)
  uint8_t stack_len_ = 0;
};

/// One-shot BLAKE3 hash of `n` bytes.
blake3_digest blake3(const void* data, size_t n);

} // namespace kvs
