// gRPC request -> the ZeroMQ frames a client of the same LMCache release
// sends (uid · op · one msgpack frame per argument), so the engine bridge
// decodes, checks and routes it on the one path every ZeroMQ request takes.
//
// Every message takes one step, parse -> check -> key -> frames
// (grpc_request_step.hpp); what is particular to a message is its row in
// grpc_request_frames.cpp: the frames that follow its key. A message of
// plain arguments has no row: its op row's arguments are read off its
// fields by name (grpc_generic.hpp).
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

/// The error a refused request gets: kind "bad_request", detail "where: why"
/// (where: the message, or message.field).
error grpc_bad_request(std::string_view where, std::string why);

/// For a client whose release is not latched: v0_5_7 when the key's token
/// field can only be 0.5.7's big-endian words (a multiple of 4 bytes, each
/// word below 2^24 as every vocabulary is, and enough words for the key's
/// `end` when varints would be), else v0_5_6 (varints).
client_release guess_token_release(std::string_view token_field, int64_t end = 0);

/// Turns off libprotobuf's own log lines (e.g. "String field ... contains
/// invalid UTF-8 data when parsing"): they go straight to stderr, once per
/// bad message, so a client could flood the log with them. Every such
/// message is refused here with its reason, and logged rate-limited by the
/// caller. Call once at start-up, before any thread parses (not thread-safe).
void silence_protobuf_log();

} // namespace kvs
