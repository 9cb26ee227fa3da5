// The one failure reply every LMCache MP client understands.
//
// Many LMCache 0.5.6 operations have no failure value: register_kv_cache
// and the other None-returning calls succeed with an empty reply, and
// LMCache's own server answers a request it cannot serve (an undecodable
// argument, an op it has no handler for, a handler that raised) with
// nothing, leaving the client blocked for its whole RPC timeout (300 s).
// kvsidecar answers such a request at once, the way the client's transport
// (mq.py process_inbound) fails a call: uid echoed, and an op frame that
// decodes to a different operation name. The client then raises
// ValueError("Response operation '<our op frame>' does not match request
// '<op>'") — our reason ends up in the engine's exception. The op frame is a
// msgpack str (every str decodes; an unknown legacy int would make the
// client's decoder raise before it resolves the future, stranding it).
#pragma once

#include <string>
#include <string_view>

namespace kvs {

/// The op frame of a failure reply: msgpack str "kvsidecar: <why>",
/// printable ASCII only (anything else becomes '?'), at most 240 bytes.
std::string encode_mp_failure_op(std::string_view why);

} // namespace kvs
