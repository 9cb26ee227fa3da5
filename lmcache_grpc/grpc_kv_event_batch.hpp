// One subscribe_kv_events batch body (msgpack, lmcache_wire/lmcache_kv_events.hpp)
// -> the KVEventBatch message the server-streaming RPC writes.
#pragma once

#include "core/error.hpp"

#include <string>
#include <string_view>

namespace kvs {

/// One KVEventBatch message for a subscribe_kv_events batch body. Error kind
/// "bad_reply" (a body of the wrong shape: a bug).
expected<std::string> grpc_kv_event_batch(std::string_view body);

} // namespace kvs
