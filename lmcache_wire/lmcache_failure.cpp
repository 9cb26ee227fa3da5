#include "lmcache_wire/lmcache_failure.hpp"

#include "lmcache_wire/lmcache_protocol.hpp"

namespace kvs {

std::string encode_mp_failure_op(std::string_view why) {
  constexpr size_t max_text = 240;
  std::string text = "kvsidecar: ";
  for (char c : why) {
    if (text.size() >= max_text)
      break;
    auto u = static_cast<unsigned char>(c);
    text += (u >= 0x20 && u < 0x7f) ? c : '?';
  }
  return encode_reply_str(text);
}

} // namespace kvs
