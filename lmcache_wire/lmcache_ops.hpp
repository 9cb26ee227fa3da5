// The LMCache op table: one row per op kvsidecar serves, read by every layer
// instead of a switch on the op. A row says how the op is named and numbered
// per client release, its request struct (whose `wire_args()` give the
// argument names and the generic body decoder, lmcache_body_decode.hpp),
// where its request id and worker instance are, who serves it and who acks
// it, and LMCache's failure value for it. The rows are in lmcache_ops.cpp;
// docs/ARCHITECTURE.md "LMCache ops → files" lists where each op's handler
// is (checked by tests/unit/test_grpc_op_table.cpp).
//
// Adding an op: its request struct with its wire_args() (lmcache_protocol.hpp),
// its row, and one handler where the row's route points (docs/ARCHITECTURE.md
// "Adding an LMCache op").
//
// No msgpack and no CAF here: actors include it freely.
#pragma once

#include "core/error.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace kvs {

namespace lmcache_wire {
class op_args; // the body decoder's view of the argument frames
}

/// Who sends a request's reply.
enum class mp_ack : uint8_t {
  served, ///< whoever serves it (the route's actor) answers
  router, ///< the session router answers None at once; the session keeps the
          ///< result for later queries (LOOKUP: its hits come through the prefetch queries)
};

/// What an op does with the worker instance it names (the engine bridge binds
/// instances to connections by this).
enum class mp_instance_use : uint8_t {
  none,        ///< names none, or only reports it (ping: the heartbeat)
  registers,   ///< binds the instance to the connection (refused when another owns it)
  unregisters, ///< unbinds it (a foreign one is answered None, nothing changes)
  uses,        ///< a copy on the instance's memory (refused when another owns it)
};

/// What an argument is, for the layers that carry arguments generically
/// (the gRPC request transcoder writes a proto field of the argument's name
/// as this): from the request struct's wire_args() (lmcache_ops.cpp).
enum class mp_arg_kind : uint8_t {
  other,     ///< a shape of its own: a layer that carries it needs its own code
  key,       ///< the cache key (IPCCacheServerKey)
  int64,     ///< int
  opt_int64, ///< int | None
  str,       ///< str
  bin,       ///< bytes
  boolean,   ///< bool
  float64,   ///< float
};

/// One op's row. Rows are built field by field by name (lmcache_ops.cpp's
/// `row` builder); a field a row does not name keeps the default here.
struct mp_op_row {
  mp_op op = mp_op::noop;
  const char* name = ""; ///< snake_case, as LMCache routes ops by name (0.5.6+)
  /// The frozen legacy id (wire.py LEGACY_OPERATION_IDS, 0.5.5+); -1: the
  /// op travels by name only (newer than the frozen table).
  int16_t id = -1;
  /// The id 0.5.3 / 0.5.4 send where theirs differs (their table differs
  /// from 25 on); -1: the same or none. A request sent by it is legacy.
  int16_t id_pre_055 = -1;
  /// The one release that sends this op (v0_5_7 for ops new there);
  /// unknown: every release that has it.
  client_release only_in = client_release::unknown;
  uint8_t min_args = 0;
  uint8_t max_args = 0;
  /// The argument past min_args is 0.5.7's: 0.5.7 always sends it (it binds
  /// every default), older releases never do.
  bool last_arg_057 = false;
  const char* arg_names[7] = {};
  mp_arg_kind arg_kinds[7] = {};
  /// The op opens a stream the engine bridge serves (subscribe_kv_events:
  /// its on_subscribe, lmcache_kv_events.hpp decodes the arguments), not a
  /// request: decode_mp_request refuses it ("unsupported_op") and the row
  /// has no `decode`; streamed_row() finds it for the bridge instead.
  bool streamed = false;
  /// The body decoder (lmcache_body_decode.hpp's decode_args<Req>, set by
  /// the row's body<Req>()); nullptr only when streamed.
  status (*decode)(const lmcache_wire::op_args&, mp_request_body&) = nullptr;
  /// The release a decoded body shows beyond its key's token form, or
  /// nullptr (register_kv_cache_engine_driven_context: its group_layouts).
  client_release (*release_of)(const mp_request_body&) = nullptr;
  /// The request id (session) of a decoded body, nullptr: none.
  const std::string* (*request_id)(const mp_request_body&) = nullptr;
  /// The worker instance a decoded body names (ping may send nil), nullptr: none.
  std::optional<int64_t> (*instance)(const mp_request_body&) = nullptr;
  mp_instance_use instance_use = mp_instance_use::none;
  mp_route route = mp_route::bridge; ///< who serves it
  mp_ack ack = mp_ack::served;       ///< who answers it
  /// LMCache's failure value for the op ((b"", False), False, a failed
  /// PrepareRetrieveResponse); nullptr: it has none, a failed request gets
  /// the failure reply of lmcache_failure.hpp.
  std::string (*failure)() = nullptr;
  /// The answer for a request id with no session (route session): LMCache's
  /// unknown-job answer. nullptr: None.
  std::string (*unknown_job)() = nullptr;
  /// LMCache has a gRPC method for it: its HTTP/2 paths below, which
  /// lmcache_grpc/grpc_methods.cpp serves.
  bool grpc = false;
  /// The method's path in a service both releases share
  /// ("/lmcache.mp.LookupService/Lookup"), or nullptr.
  const char* grpc_path = nullptr;
  /// The paths in 0.5.6's and 0.5.7's release-specific services (0.5.7
  /// moved the management ops; a client's release is latched from them),
  /// nullptr where that release has none.
  const char* grpc_path_056 = nullptr;
  const char* grpc_path_057 = nullptr;
};

/// The row of `op` (every mp_op has one).
const mp_op_row& op_row(mp_op op);
/// The row of a snake_case name / a legacy id (either table), or nullptr.
const mp_op_row* op_row_by_name(std::string_view name);
const mp_op_row* op_row_by_id(int64_t id);

/// The row of a streamed op (subscribe_kv_events) when `op_frame` names
/// one, else nullptr (every other op is a request: decode_mp_request).
const mp_op_row* streamed_row(std::string_view op_frame);

/// Every row, for walking the table.
struct mp_op_rows {
  const mp_op_row* first;
  const mp_op_row* last;
  const mp_op_row* begin() const { return first; }
  const mp_op_row* end() const { return last; }
};
mp_op_rows all_op_rows();

const char* to_string(mp_route r);
const char* to_string(mp_ack a);

} // namespace kvs
