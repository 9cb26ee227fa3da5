// The MD5s LMCache 0.5.6 answers POST /cache/checksums with, from one
// chunk's bytes as gpu/block_checksum.hpp gathers them: one digest over
// every layer (layerwise false) or one per layer (true). LMCache hashes
// bfloat16 tensors upcast to float32 (numpy has no bfloat16), so those
// bytes are widened here the same way: each element's 16 bits become the
// high half of a float32, low half zero, little-endian.
//
// A call's digests are independent MD5 streams (one per chunk, or one per
// layer of each chunk), so several chunks are hashed together in SIMD lanes
// (cache/md5_lanes.hpp): 8 streams at ~8x one stream's speed on AVX2.
#pragma once

#include "cache/md5_lanes.hpp"
#include "messages/checksum_messages.hpp"

#include <cstddef>
#include <string>
#include <vector>

namespace kvs {

/// For each of `n` chunks at `chunks`, one digest (layerwise false) or one
/// per layer (true), lowercase hex; all their streams share the lanes of `path`.
std::vector<std::vector<std::string>> chunk_digests(const block_checksum_chunk* chunks, size_t n,
                                                    bool layerwise,
                                                    md5_path path = md5_path::best);

/// One chunk's digests.
std::vector<std::string> chunk_digests(const block_checksum_chunk& chunk, bool layerwise);

} // namespace kvs
