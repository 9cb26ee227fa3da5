// IpcCacheServerKey -> the msgpack frame a ZeroMQ client of each LMCache
// release sends for it (custom_types.py's msgspec Struct: a map keyed by
// field name), tokens in the release's own field (grpc_request_frames.hpp).
// Internal to the request side: includes the generated protobuf classes.
#pragma once

#include "core/error.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"

#include "common.pb.h"

#include <string>
#include <string_view>

namespace kvs {

/// The key frame in release `rel`'s token field. Error kind "bad_request",
/// naming `where` (e.g. "LookupRequest.key") and the field.
expected<std::string> grpc_key_frame(const lmcache::mp::IpcCacheServerKey& k, client_release rel,
                                     std::string_view where);

/// The release a shared-service request's key is written in: `dialect` when
/// the client is latched, else what the key's token field shows.
client_release grpc_key_release(client_release dialect, const lmcache::mp::IpcCacheServerKey& k);

} // namespace kvs
