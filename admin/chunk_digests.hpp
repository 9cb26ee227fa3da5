// The MD5s LMCache 0.5.6 answers POST /cache/checksums with, from one
// chunk's bytes as gpu/block_checksum.hpp gathers them: one digest over
// every layer (layerwise false) or one per layer (true). LMCache hashes
// bfloat16 tensors upcast to float32 (numpy has no bfloat16), so those
// bytes are widened here the same way: each element's 16 bits become the
// high half of a float32, low half zero, little-endian.
#pragma once

#include "messages/checksum_messages.hpp"

#include <string>
#include <vector>

namespace kvs {

/// One digest (layerwise false) or one per layer (true), lowercase hex.
std::vector<std::string> chunk_digests(const block_checksum_chunk& chunk, bool layerwise);

} // namespace kvs
