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
  // Clients before 0.5.6 cannot take a str op frame (see mp_call): their
  // call gets the op's own failure value, or None, and the reason stays in
  // our log, where every caller already writes it.
  if (call.legacy_client)
    return make_reply(call, failure_body(call.request->op));
  return mp_reply{call.identity, call.request->uid_frame, encode_mp_failure_op(why),
                  std::nullopt};
}

} // namespace kvs
