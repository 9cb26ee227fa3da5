// LMCache's `EngineType`, parsed once by the REGISTER_KV_CACHE decoder and
// then carried as this enum (layout detection, the RETRIEVE skip rule).
// Here, below messages/ and gpu/, so both use it without depending on the
// wire protocol's headers.
#pragma once

#include <cstdint>

namespace kvs {

/// LMCache `EngineType`, sent by value.
enum class engine_type : uint8_t { vllm, atom, sglang, trtllm, mock };

/// The wire spelling ("vllm", "sglang", ...), for logs and errors.
inline const char* to_string(engine_type t) {
  switch (t) {
    case engine_type::vllm: return "vllm";
    case engine_type::atom: return "atom";
    case engine_type::sglang: return "sglang";
    case engine_type::trtllm: return "trtllm";
    case engine_type::mock: return "mock";
  }
  return "?";
}

} // namespace kvs
