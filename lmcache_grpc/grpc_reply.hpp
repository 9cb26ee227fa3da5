// The reply frames the actors send back for a gRPC call -> the RPC's
// response message. The body the actors encode for ZeroMQ (msgpack) is
// turned into the protobuf message LMCache's generated stubs expect.
#pragma once

#include "core/error.hpp"
#include "lmcache_grpc/grpc_methods.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvs {

/// The serialized response message of `m` for a reply body (msgpack, nullopt
/// for None). Error kind "bad_reply" (a body of the wrong shape: a bug).
expected<std::string> grpc_response(const grpc_method& m, const std::optional<std::string>& body);

/// The uid a request's frames were given (the msgpack int of frame 0).
std::optional<uint64_t> grpc_call_id(std::string_view uid_frame);

/// The reason a failure reply's op frame carries (msgpack str "kvsidecar:
/// ..."; lmcache_wire/lmcache_failure.hpp).
std::string grpc_failure_text(std::string_view op_frame);

} // namespace kvs
