// The KV event dialects kvsidecar reads and writes. Here, below messages/
// and config/, so that events.format is parsed into it once, at load.
#pragma once

namespace kvs {

/// The dialect a batch is written in.
enum class event_dialect {
  vllm,       ///< tagged maps (vLLM >= PR #42892); 5-frame replay
  tokenspeed, ///< positional arrays (tokenspeed, older vLLM); 4-frame replay
};

/// The events.format spelling ("vllm", "tokenspeed"), for logs.
inline const char* to_string(event_dialect d) {
  return d == event_dialect::tokenspeed ? "tokenspeed" : "vllm";
}

} // namespace kvs
