#include "messages/lmcache_failure.hpp"

#include "messages/cache_messages.hpp"
#include "messages/lmcache_protocol.hpp"

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
  return encode_mp_str(text);
}

mp_reply make_reply(const mp_call& call, std::optional<std::string> body) {
  return mp_reply{call.identity, call.request->uid_frame, call.request->op_frame,
                  std::move(body), call.received, static_cast<uint8_t>(call.request->op)};
}

mp_reply make_failure_reply(const mp_call& call, std::string_view why) {
  return mp_reply{call.identity, call.request->uid_frame, encode_mp_failure_op(why),
                  std::nullopt};
}

} // namespace kvs
