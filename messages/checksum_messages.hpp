// POST /cache/checksums in LMCache's block-id form: the HTTP control plane
// (admin/admin_actor.cpp) asks the gpu-transfer actor, which owns the
// instance's opened pools, for one chunk's bytes at a time
// (gpu/block_checksum.hpp reads them) and hashes them on its own thread,
// several chunks together in SIMD lanes (admin/chunk_digests.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvs {

/// One chunk of a block-id checksum call; the whole call travels each time
/// so every chunk is checked against the same rules.
struct block_checksum_query {
  std::vector<int64_t> block_ids;
  int64_t chunk_blocks = 0; ///< LMCache's chunk_size: blocks per chunk
  uint64_t chunk = 0;       ///< which chunk to read
  uint64_t max_bytes = 0;   ///< the whole call reads at most this (then 413)
};

/// What the HTTP side needs to hash a chunk and to answer.
struct block_checksum_chunk {
  int status = 200;      ///< LMCache's: 400, 404, 413, 501; 500 for a failed read
  std::string error;     ///< why, when status != 200
  uint64_t num_chunks = 0;
  std::string dtype;     ///< torch name ("bfloat16" is hashed upcast to float32)
  /// The chunk's bytes in LMCache's order; layer_end[l] is where layer l's end.
  std::vector<uint8_t> bytes;
  std::vector<uint64_t> layer_end;
};

/// Answered with a block_checksum_chunk (status 404 for an instance with no
/// LMCache-driven registration, as LMCache answers).
struct gpu_checksum_read {
  int64_t instance_id = 0;
  block_checksum_query query;
  /// Memory to read the chunk into: a hashed chunk's bytes given back, so
  /// a read reuses pages already faulted in instead of a fresh 32 MiB
  /// mapping per chunk (empty: a new allocation).
  std::vector<uint8_t> buffer;
};

} // namespace kvs
