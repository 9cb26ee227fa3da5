// The bytes LMCache hashes for POST /cache/checksums in its block-id form
// ({"block_ids", "chunk_size" (blocks), "instance_id", "layerwise"}):
// LMCache 0.5.6 (v1/multiprocess/http_apis/cache_api.py,
// _compute_block_checksums) gathers the blocks from each registered layer
// tensor with index_select on the tensor's block axis, cuts chunk_size
// blocks per chunk (the last may be shorter), and feeds MD5 with each
// layer's slice made contiguous, layer after layer. So a chunk's bytes are,
// per layer, the tensor's own element order with the block axis reduced to
// the chunk's blocks:
//   vllm_flash_attn [2, NB, ...]: K pages of the chunk's blocks, then V pages
//   vllm_flashinfer [NB, 2, ...]: per block, its K page then its V page
// and within a page [BS, NH, HD] (NHD) or [NH, BS, HD] (HND), as the engine
// holds it (not L1's token-major copy). Formats LMCache does not checksum
// (vLLM's CPU layout NL_X_NB_NH_BS_CS, SGLang's TWO_X_NL_X_NBBS_NH_HS) are
// refused as LMCache refuses them (501, its message).
//
// Here: validation with LMCache's answers, the plan of plane reads for one
// chunk, and reading it through the instance's backend (host: memcpy from
// the shared memory; CUDA: device-to-host copies on the instance's stream,
// ordered after its copies). Hashing (and LMCache's bfloat16 -> float32
// upcast) is the caller's (admin/chunk_digests.hpp), off the transfer
// actor's thread.
#pragma once

#include "core/error.hpp"
#include "gpu/kv_layout.hpp"
#include "gpu/transfer_backend.hpp"
#include "messages/checksum_messages.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvs {

/// LMCache's format check: nullopt when LMCache checksums this layout, or
/// its 501 message.
std::optional<std::string> checksum_unsupported(const kv_layout& layout);

/// Bytes one chunk of `blocks` blocks reads (all layers, K and V).
uint64_t checksum_chunk_bytes(const kv_layout& layout, uint64_t blocks);

/// The plane reads of blocks [first, first+count) of `ids`, in LMCache's
/// byte order, adjacent runs merged; layer_end (optional) gets each layer's
/// end in the read bytes. The ids must already be in range.
std::vector<plane_read> checksum_reads(const kv_layout& layout, const int64_t* ids,
                                       uint64_t count, std::vector<uint64_t>* layer_end);

/// Validates `q` against the opened pools (LMCache's 400s and 501; a 413 past
/// max_bytes; a 400 for a block id outside the pools) and reads its chunk through `backend`,
/// into `buffer`'s memory when it is given (its capacity reused, its bytes overwritten).
block_checksum_chunk read_checksum_chunk(transfer_backend& backend, opened_pools& pools,
                                         const block_checksum_query& q,
                                         std::vector<uint8_t> buffer = {});

} // namespace kvs
