// The replies an actor builds from the call it answers (cache_messages.hpp).
#include "messages/cache_messages.hpp"

#include "lmcache_wire/lmcache_failure.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"

namespace kvs {

mp_reply make_reply(const mp_call& call, std::optional<std::string> body) {
  return mp_reply{call.identity, call.request->uid_frame, call.request->op_frame,
                  std::move(body), call.received, static_cast<uint8_t>(call.request->op)};
}

mp_reply make_failure_reply(const mp_call& call, std::string_view why) {
  return mp_reply{call.identity, call.request->uid_frame, encode_mp_failure_op(why),
                  std::nullopt};
}

} // namespace kvs
