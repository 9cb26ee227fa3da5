// The gRPC conversions no row is written for, read off the op's row and its
// RPC's protobuf descriptors (at its shared or 0.5.7 path: the protos are
// 0.5.7's; 0.5.6's services carry the same messages): a request whose arguments are all of a kind
// the row names (mp_arg_kind: the key, ints, strs, bytes, bools, floats) is
// each argument written from the request message's field of the same name;
// a reply to an RPC whose response message has no fields is that empty
// message, and one whose response has a single scalar field is a scalar body
// in that field. So a new op of these shapes needs only its proto (the
// shapes no row covers are refused "no request transcoder" / "no reply
// transcoder", which tests/unit/test_grpc_op_table.cpp catches).
// Internal to lmcache_grpc/: includes protobuf.
#pragma once

#include "core/error.hpp"
#include "lmcache_grpc/grpc_body_reader.hpp"
#include "lmcache_grpc/grpc_methods.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvs {

struct mp_op_row;

/// The argument frames of request `bytes` of `row`'s RPC, generically, or
/// nullopt when `row`'s arguments are not all of a generic kind.
std::optional<expected<std::vector<std::string>>>
grpc_generic_request(const mp_op_row& row, std::string_view bytes, client_release dialect);

/// The response of `row`'s RPC for a reply body (msgpack, read by `b`;
/// `has_body` false for None) when its message is of a generic shape, else
/// nullopt. No fields (LMCache's None-returning ops): the empty message,
/// whatever the body. One scalar field: the body's value in it (an int, a
/// bool, a str or bytes; nil, or None, leave a field with presence unset; a
/// field without presence refuses None, "no reply body").
std::optional<expected<std::string>> grpc_generic_response(const mp_op_row& row,
                                                           grpc_reply::body_reader& b,
                                                           bool has_body);

} // namespace kvs
