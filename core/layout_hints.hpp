// The fixed-value layout hints of REGISTER_KV_CACHE (LMCache 0.5.6
// layout_hints), parsed once by the decoder and then carried as these enums
// to layout detection. Here, below messages/ and gpu/, so both use them.
#pragma once

#include <cstdint>

namespace kvs {

/// layout_hints.kv_layout: vLLM's page layout.
enum class vllm_kv_layout : uint8_t { nhd, hnd, blhnc, blnhc };

/// layout_hints.kv_list_layout: how SGLang lists its K and V tensors.
enum class sglang_kv_list_layout : uint8_t { k_v, unified };

/// The wire spelling ("NHD", ...), for logs and errors.
inline const char* to_string(vllm_kv_layout l) {
  switch (l) {
    case vllm_kv_layout::nhd: return "NHD";
    case vllm_kv_layout::hnd: return "HND";
    case vllm_kv_layout::blhnc: return "BLHNC";
    case vllm_kv_layout::blnhc: return "BLNHC";
  }
  return "?";
}

/// The wire spelling ("k_v", "unified"), for logs and errors.
inline const char* to_string(sglang_kv_list_layout l) {
  return l == sglang_kv_list_layout::unified ? "unified" : "k_v";
}

} // namespace kvs
