// The gRPC conversions no row is written for, read off the op's row and its
// RPC's protobuf descriptors: a request whose arguments are all of a kind
// the row names (mp_arg_kind: the key, ints, strs, bytes, bools, floats) is
// each argument written from the request message's field of the same name;
// a reply to an RPC whose response message has no fields is that empty
// message. So a new op of these shapes needs only its proto (the
// shapes no row covers are refused "no request transcoder" / "no reply
// transcoder", which tests/unit/test_grpc_op_table.cpp catches).
// Internal to lmcache_grpc/: includes protobuf.
#pragma once

#include "core/error.hpp"
#include "lmcache_grpc/grpc_methods.hpp"

#include <google/protobuf/descriptor.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvs {

struct mp_op_row;

/// The RPC of `row` (at its shared or 0.5.7 path: the protos are 0.5.7's;
/// 0.5.6's services carry the same messages), or nullptr.
const google::protobuf::MethodDescriptor* grpc_rpc_of(const mp_op_row& row);

/// The argument frames of request `bytes` of `row`'s RPC, generically, or
/// nullopt when `row`'s arguments are not all of a generic kind.
std::optional<expected<std::vector<std::string>>>
grpc_generic_request(const mp_op_row& row, std::string_view bytes, client_release dialect);

/// The response of `row`'s RPC when its message has no fields (LMCache's
/// None-returning ops): the empty message, whatever the body; else nullopt.
std::optional<std::string> grpc_generic_response(const mp_op_row& row);

} // namespace kvs
