// LMCache's gRPC messages <-> the frames of its ZeroMQ transport.
//
// A request that arrives over gRPC is turned into exactly the frames a
// ZeroMQ client of the same LMCache release sends after its identity
// (uid · op · one msgpack frame per argument), so the engine bridge decodes,
// checks and routes it on the one path every ZeroMQ request takes: no op is
// implemented twice. The reply body the actors encode for ZeroMQ (msgpack)
// is turned back into the RPC's response message here.
//
// The one field the releases encode differently is IpcCacheServerKey field
// 4: 0.5.6 `repeated int64 token_ids` (packed varints), 0.5.7 `bytes
// token_bytes` (big-endian uint32). Same tag, same wire type, so the
// protobuf parser cannot tell them apart; the caller says which release the
// client is (latched from its first release-specific call), and
// guess_token_release() decides for a client that has not shown it.
//
// Never throws; every error names the message and the field.
#pragma once

#include "core/error.hpp"
#include "lmcache_grpc/grpc_methods.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvs {

/// The frames (uid, op, args...) for request `bytes` of method `m` from a
/// client of release `dialect` (unknown: decided from the request). The uid
/// frame is `call_id` as a msgpack int; the op frame the op's name. Error
/// kind "bad_request" (not a valid message, or a field out of range).
expected<std::vector<std::string>> grpc_request_frames(const grpc_method& m,
                                                      std::string_view bytes,
                                                      client_release dialect, uint64_t call_id);

/// The serialized response message of `m` for a reply body (msgpack, nullopt
/// for None). Error kind "bad_reply" (a body of the wrong shape: a bug).
expected<std::string> grpc_response(const grpc_method& m, const std::optional<std::string>& body);

/// One KVEventBatch message for a subscribe_kv_events batch body.
expected<std::string> grpc_kv_event_batch(std::string_view body);

/// Turns off libprotobuf's own log lines (e.g. "String field ... contains
/// invalid UTF-8 data when parsing"): they go straight to stderr, once per
/// bad message, so a client could flood the log with them. Every such
/// message is refused here with its reason, and logged rate-limited by the
/// caller. Call once at start-up, before any thread parses (not thread-safe).
void silence_protobuf_log();

/// The uid a request's frames were given (the msgpack int of frame 0).
std::optional<uint64_t> grpc_call_id(std::string_view uid_frame);

/// The reason a failure reply's op frame carries (msgpack str "kvsidecar:
/// ..."; lmcache_wire/lmcache_failure.hpp).
std::string grpc_failure_text(std::string_view op_frame);

/// For a client whose release is not latched: v0_5_7 when the key's token
/// field can only be 0.5.7's big-endian words (a multiple of 4 bytes, each
/// word below 2^24 as every vocabulary is, and enough words for the key's
/// `end` when varints would be), else v0_5_6 (varints).
client_release guess_token_release(std::string_view token_field, int64_t end = 0);

} // namespace kvs
