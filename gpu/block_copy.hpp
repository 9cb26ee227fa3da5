// THE index math of the block copy, shared by the host backend, the CUDA
// kernel and the unit tests (which check it on the CPU): one definition, so
// the GPU cannot disagree with what the tests proved.
//
// A copy is cut into units. A unit is one engine page (block_size tokens)
// of one layer's K or V of one chunk:
//   engine: plane_base(kv, layer) + block_id * block_stride_bytes
//   L1:     slot + ((kv * num_layers + layer) * chunk_tokens + page * block_size) * token_bytes
// where the L1 slot is LMCache's chunk layout [2, num_layers, chunk_tokens,
// heads*head_dim] (KV_2LTD), token-major. When the engine's page is
// token-major too (NHD: [block_size, heads, head_dim] contiguous) a unit is one
// run of page_bytes on both sides. When it is not (HND pages, vLLM CPU's
// fused K/V rows), a unit is block_size*heads runs of head_bytes: run r is
// token r / heads, head r % heads, at r * head_bytes in L1 and at
// head * head_stride_bytes + token * token_stride_bytes in the engine page.
// Units are numbered chunk-major, then kv, layer, page, so consecutive units
// write consecutive L1 bytes.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KVS_HD __host__ __device__ __forceinline__
#else
#define KVS_HD inline
#endif

namespace kvs {
namespace block_copy {

struct geometry {
  uint32_t num_layers = 0;
  uint32_t block_size = 0;        ///< tokens per page
  uint32_t blocks_per_chunk = 0;  ///< chunk_tokens / block_size
  uint32_t num_groups = 1;        ///< block-id lists per request
  uint64_t token_bytes = 0;       ///< one token of one layer's K
  uint64_t page_bytes = 0;        ///< block_size * token_bytes
  uint64_t block_stride_bytes = 0;
  /// 0: the engine page is token-major contiguous (one run per unit).
  /// Otherwise the page's heads, each token's head_dim run placed by the two
  /// strides below (engine side only; L1 stays token-major).
  uint32_t strided_heads = 0;
  uint64_t head_bytes = 0;          ///< head_dim * element size (strided pages)
  uint64_t head_stride_bytes = 0;   ///< engine: from one head to the next in a page
  uint64_t token_stride_bytes = 0;  ///< engine: from one token to the next in a head
};

struct unit {
  uint32_t chunk;  ///< position in the request's chunk list
  uint32_t kv;     ///< 0 = K, 1 = V
  uint32_t layer;
  uint32_t page;   ///< page within the chunk, 0 .. blocks_per_chunk-1
};

KVS_HD uint64_t chunk_tokens(const geometry& g) {
  return static_cast<uint64_t>(g.blocks_per_chunk) * g.block_size;
}

KVS_HD uint64_t units_per_chunk(const geometry& g) {
  return 2ull * g.num_layers * g.blocks_per_chunk;
}

KVS_HD unit unit_at(const geometry& g, uint64_t u) {
  unit r;
  r.page = static_cast<uint32_t>(u % g.blocks_per_chunk);
  u /= g.blocks_per_chunk;
  r.layer = static_cast<uint32_t>(u % g.num_layers);
  u /= g.num_layers;
  r.kv = static_cast<uint32_t>(u % 2);
  r.chunk = static_cast<uint32_t>(u / 2);
  return r;
}

/// Index of a plane in a [kv][layer] table.
KVS_HD uint32_t plane_index(const geometry& g, uint32_t kv, uint32_t layer) {
  return kv * g.num_layers + layer;
}

/// Byte offset of (kv, layer, token) inside one L1 chunk slot.
KVS_HD uint64_t l1_offset(const geometry& g, uint32_t kv, uint32_t layer,
                          uint64_t token_in_chunk) {
  return ((static_cast<uint64_t>(kv) * g.num_layers + layer) * chunk_tokens(g) + token_in_chunk) *
         g.token_bytes;
}

/// Byte offset of a unit's page inside its L1 chunk slot.
KVS_HD uint64_t l1_page_offset(const geometry& g, const unit& x) {
  return l1_offset(g, x.kv, x.layer, static_cast<uint64_t>(x.page) * g.block_size);
}

/// Byte offset of (block, token) from its plane's block 0 (token-major pages;
/// strided pages place their tokens with engine_run_offset).
KVS_HD uint64_t engine_offset(const geometry& g, uint64_t block_id, uint64_t token_in_block) {
  return block_id * g.block_stride_bytes + token_in_block * g.token_bytes;
}

/// Contiguous runs one unit is copied in: 1 for token-major pages.
KVS_HD uint64_t runs_per_unit(const geometry& g) {
  return g.strided_heads == 0 ? 1 : static_cast<uint64_t>(g.block_size) * g.strided_heads;
}

/// Bytes of one run.
KVS_HD uint64_t run_bytes(const geometry& g) {
  return g.strided_heads == 0 ? g.page_bytes : g.head_bytes;
}

/// Offset of run `r` of a unit from the start of its engine page.
KVS_HD uint64_t engine_run_offset(const geometry& g, uint64_t r) {
  if (g.strided_heads == 0) return 0;
  return (r % g.strided_heads) * g.head_stride_bytes + (r / g.strided_heads) * g.token_stride_bytes;
}

/// Offset of run `r` of a unit from the start of its L1 page (token-major).
KVS_HD uint64_t l1_run_offset(const geometry& g, uint64_t r) { return r * run_bytes(g); }

/// Position of a page in the request's block-id list of its group: chunk
/// `chunk_index` of the request (counted from the key's start) uses entries
/// [chunk_index * blocks_per_chunk, (chunk_index + 1) * blocks_per_chunk).
KVS_HD uint64_t block_list_index(const geometry& g, uint64_t chunk_index, uint32_t page) {
  return chunk_index * g.blocks_per_chunk + page;
}

/// Position of a unit's block id in the packed per-request table
/// [chunk position][group][page] that the copy plan builds.
KVS_HD uint64_t packed_block_index(const geometry& g, uint32_t chunk_pos, uint32_t group,
                                   uint32_t page) {
  return (static_cast<uint64_t>(chunk_pos) * g.num_groups + group) * g.blocks_per_chunk + page;
}

} // namespace block_copy
} // namespace kvs
