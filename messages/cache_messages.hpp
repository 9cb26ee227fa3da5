// Messages of the cache server: a decoded LMCache MP request travelling from
// the engine bridge to the actor that handles it, and the reply going back.
#pragma once

#include <memory>
#include <optional>
#include <string>

namespace kvs {

struct mp_request; // messages/lmcache_protocol.hpp

/// One request from an engine connector, with what is needed to answer it.
struct mp_call {
  std::string identity;  ///< ROUTER identity of the connector's DEALER
  std::shared_ptr<const mp_request> request;
};

/// The answer: uid and op frames echoed byte for byte, then one body frame
/// (msgpack) or none (None).
struct mp_reply {
  std::string identity;
  std::string uid_frame;
  std::string op_frame;
  std::optional<std::string> body;
};

} // namespace kvs
