// Detects and validates the paged KV layout an engine registered, and
// reduces it to what the block copy needs: per layer and K/V a "plane"
// (which registered tensor, where block 0 starts, the distance between
// blocks) plus the page geometry. A page of one layer's K (or V) is either
// token-major contiguous (NHD: the copy moves whole pages) or head-major
// (HND: the copy moves head_dim runs and transposes them to L1's
// token-major chunk layout, so chunks are the same bytes whichever layout
// stored them).
//
// Mirrors LMCache 0.5.6 detection (lmcache/v1/gpu_connector/kv_format/
// detectors/{sglang,vllm}.py); LMCache's EngineKVFormat names in brackets:
//   sglang_mha       flat list of 2*NL tensors [NB*BS, NH, HD]: all K layers,
//                    then all V layers; BS from layout_hints.tokens_per_block
//                    (TWO_X_NL_X_NBBS_NH_HS)
//   vllm_flash_attn  per layer [2, NB, BS, NH, HD] (NHD; NL_X_TWO_NB_BS_NH_HS)
//                    or [2, NB, NH, BS, HD] (HND; NL_X_TWO_NB_NH_BS_HS)
//   vllm_flashinfer  per layer [NB, 2, BS, NH, HD] (NHD; NL_X_NB_TWO_BS_NH_HS)
//                    or [NB, 2, NH, BS, HD] (HND; NL_X_NB_TWO_NH_BS_HS)
//   vllm_cpu         per layer [NB, NH, BS, 2*HD] (HND, vLLM's CPU attention;
//                    NL_X_NB_NH_BS_CS): per block and head, block_size K rows
//                    of head_dim, then block_size V rows (the kernel views it
//                    as [NB, NH, 2*BS, HD] and splits dimension 2)
// Everything else (MLA, fused NHD K/V, cross-layer, TRT-LLM, ...) is refused
// with an "unsupported" error naming what was seen and LMCache's format name;
// docs/lmcache-mp-compat.md lists every format.
#pragma once

#include "core/engine_type.hpp"
#include "core/error.hpp"
#include "core/layout_hints.hpp"
#include "core/tensor_desc.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvs {

enum class kv_layout_kind { sglang_mha, vllm_flash_attn, vllm_flashinfer, vllm_cpu };
const char* to_string(kv_layout_kind k);

/// What the engine said about its cache besides the tensors (REGISTER_KV_CACHE
/// engine_type, layout_hints, engine_group_infos).
struct kv_layout_hints {
  kvs::engine_type engine_type = kvs::engine_type::vllm;
  int64_t tokens_per_block = 0;  ///< layout_hints.tokens_per_block; 0 = absent
  std::optional<vllm_kv_layout> kv_layout;             ///< layout_hints.kv_layout
  std::optional<sglang_kv_list_layout> kv_list_layout; ///< layout_hints.kv_list_layout
  /// engine_group_infos[i].layer_indices; empty = one group with every layer.
  std::vector<std::vector<int64_t>> group_layer_indices;
};

/// One layer's K or V pages inside one registered tensor.
struct kv_plane {
  uint32_t tensor = 0;        ///< index into the registration's tensors
  uint64_t offset_bytes = 0;  ///< block 0, token 0, from the start of the tensor's storage
};

struct kv_layout {
  kv_layout_kind kind = kv_layout_kind::sglang_mha;
  uint32_t num_layers = 0;
  uint64_t num_blocks = 0;          ///< pages per plane
  uint32_t block_size = 0;          ///< tokens per page
  uint32_t num_heads = 0;
  uint32_t head_dim = 0;
  uint32_t element_size = 0;
  std::string dtype;
  uint64_t token_bytes = 0;         ///< one token of one layer's K: heads*head_dim*elem
  uint64_t page_bytes = 0;          ///< block_size * token_bytes, contiguous
  uint64_t block_stride_bytes = 0;  ///< from one block to the next within a plane
  /// Engine page geometry: token-major contiguous (NHD) or head-major
  /// runs of head_dim placed by the two strides (HND).
  bool page_contiguous = true;
  /// The engine tensor's page axes are [NH, BS, HD] (HND) rather than
  /// [BS, NH, HD]: the element order LMCache's checksums hash (gpu/block_checksum).
  bool heads_outer = false;
  uint64_t head_bytes = 0;          ///< head_dim * element size
  uint64_t head_stride_bytes = 0;   ///< engine: from one head to the next in a page
  uint64_t token_stride_bytes = 0;  ///< engine: from one token to the next (same head)
  /// Bytes from a page's start to the end of its last byte: page_bytes for
  /// contiguous pages, more for strided ones.
  uint64_t page_span_bytes = 0;
  std::vector<kv_plane> planes;     ///< [kv * num_layers + layer], kv 0 = K, 1 = V
  std::vector<uint32_t> layer_group;///< block-id group of each layer
  uint32_t num_groups = 1;
  /// Per registered tensor: bytes from the start of its storage that the
  /// view reaches; the backends check their mappings cover it.
  std::vector<uint64_t> tensor_end_bytes;
  /// A caveat worth one log line (e.g. single-head SGLang without
  /// kv_list_layout, which LMCache would read as MLA); empty if none.
  std::string note;

  const kv_plane& plane(uint32_t kv, uint32_t layer) const {
    return planes[static_cast<size_t>(kv) * num_layers + layer];
  }
  /// Pages per L1 chunk; 0 when chunk_tokens is not a positive multiple of block_size.
  uint64_t blocks_per_chunk(uint64_t chunk_tokens) const;
  /// Bytes of one L1 chunk slot for this rank: [2, num_layers, chunk_tokens, token_bytes].
  uint64_t chunk_bytes(uint64_t chunk_tokens) const;
};

/// Validates the registration and computes its layout. Never throws.
expected<kv_layout> detect_kv_layout(const std::vector<tensor_desc>& tensors,
                                     const kv_layout_hints& hints);

} // namespace kvs
