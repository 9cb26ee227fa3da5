// The op table (lmcache_ops.hpp): one row per LMCache op, and the questions
// every layer asks of an op or a decoded request, answered from its row.
#include "lmcache_wire/lmcache_ops.hpp"

#include "lmcache_wire/lmcache_body_decode.hpp"

#include <initializer_list>
#include <iterator>
#include <tuple>
#include <type_traits>
#include <utility>

namespace kvs {

namespace {

// Where a request keeps its request id and instance (nothing when the body
// is not the row's type: a hand-built request in a test).
template <class T>
const std::string* key_request_id(const mp_request_body& b) {
  const auto* r = std::get_if<T>(&b);
  return r ? &r->key.request_id : nullptr;
}
template <class T>
const std::string* own_request_id(const mp_request_body& b) {
  const auto* r = std::get_if<T>(&b);
  return r ? &r->request_id : nullptr;
}
template <class T>
std::optional<int64_t> instance_id(const mp_request_body& b) {
  const auto* r = std::get_if<T>(&b);
  return r ? std::optional<int64_t>(r->instance_id) : std::nullopt;
}

template <class T, class = void>
struct has_key : std::false_type {};
template <class T>
struct has_key<T, std::void_t<decltype(std::declval<T&>().key.request_id)>> : std::true_type {};
template <class T, class = void>
struct has_request_id : std::false_type {};
template <class T>
struct has_request_id<T, std::void_t<decltype(std::declval<T&>().request_id)>> : std::true_type {};
template <class T, class = void>
struct has_instance_id : std::false_type {};
template <class T>
struct has_instance_id<T, std::void_t<decltype(std::declval<T&>().instance_id)>> : std::true_type {};

// LMCache's failure values and unknown-job answers.
std::string event_not_ok() { return encode_reply_event_ok("", false); } // (b"", False)
std::string false_() { return encode_reply_bool(false); }
std::string prepare_retrieve_failed() { return encode_reply_prepare_retrieve(false, {}); }
std::string zero() { return encode_reply_int(0); }

client_release engine_driven_release(const mp_request_body& b) {
  return std::get<register_engine_driven_req>(b).group_layouts ? client_release::v0_5_7
                                                               : client_release::v0_5_6;
}

/// An argument's kind (mp_arg_kind), from its member's type and form.
template <class T, class M>
constexpr mp_arg_kind kind_of(const wire::field<T, M>& f) {
  (void)f; // read for strings only
  if constexpr (std::is_same_v<M, cache_key>)
    return mp_arg_kind::key;
  else if constexpr (std::is_same_v<M, int64_t>)
    return mp_arg_kind::int64;
  else if constexpr (std::is_same_v<M, std::optional<int64_t>>)
    return mp_arg_kind::opt_int64;
  else if constexpr (std::is_same_v<M, std::string>)
    return f.how == wire::form::bin ? mp_arg_kind::bin : mp_arg_kind::str;
  else if constexpr (std::is_same_v<M, bool>)
    return mp_arg_kind::boolean;
  else if constexpr (std::is_same_v<M, double>)
    return mp_arg_kind::float64;
  else
    return mp_arg_kind::other;
}
template <class T>
constexpr mp_arg_kind kind_of(const wire::as_map<T>&) {
  return mp_arg_kind::other;
}

using use = mp_instance_use;
using route = mp_route;

/// Builds a row by naming its fields: row(op, name).id(20).body<clear_req>()...;
/// what a row does not name keeps mp_op_row's default (no gRPC method, for one).
struct row {
  mp_op_row r;
  /// The body's instance, for instance() (set by body<Req>() when it has one).
  std::optional<int64_t> (*body_instance)(const mp_request_body&) = nullptr;
  constexpr row(mp_op op, const char* name) : r{} {
    r.op = op;
    r.name = name;
  }
  /// Its legacy id, and 0.5.3 / 0.5.4's where theirs differs.
  constexpr row& id(int16_t v, int16_t pre_055 = -1) {
    r.id = v;
    r.id_pre_055 = pre_055;
    return *this;
  }
  constexpr row& only_in(client_release v) {
    r.only_in = v;
    return *this;
  }
  /// Its arguments, by name, all required (a streamed op: it has no request struct).
  constexpr row& args(std::initializer_list<const char*> names) {
    uint8_t n = 0;
    for (const char* a : names)
      r.arg_names[n++] = a;
    r.min_args = r.max_args = n;
    return *this;
  }
  /// The arguments from the `n`th on may be left out.
  constexpr row& optional_from(uint8_t n) {
    r.min_args = n;
    return *this;
  }
  /// The last argument is 0.5.7's (sent by 0.5.7 only).
  constexpr row& last_arg_057() {
    r.min_args = static_cast<uint8_t>(r.max_args - 1);
    r.last_arg_057 = true;
    return *this;
  }
  /// A stream the engine bridge serves, not a request (no decoder).
  constexpr row& streamed() {
    r.streamed = true;
    return *this;
  }
  /// Its request struct: the arguments (names and count) from the struct's
  /// wire_args(), the generic body decoder over them, and the request id
  /// where the struct has one (its key's, or its own request_id).
  template <class Req>
  constexpr row& body() {
    uint8_t n = 0;
    std::apply([&](const auto&... a) { ((r.arg_names[n] = a.name, r.arg_kinds[n] = kind_of(a), ++n), ...); },
               Req::wire_args());
    r.min_args = r.max_args = n;
    r.decode = &lmcache_wire::decode_args<Req>;
    if constexpr (has_key<Req>::value)
      r.request_id = &key_request_id<Req>;
    else if constexpr (has_request_id<Req>::value)
      r.request_id = &own_request_id<Req>;
    if constexpr (has_instance_id<Req>::value)
      body_instance = &instance_id<Req>;
    return *this;
  }
  constexpr row& release_of(client_release (*f)(const mp_request_body&)) {
    r.release_of = f;
    return *this;
  }
  /// The body's instance_id is the worker instance it names (after body<Req>()),
  /// and what the op does with it.
  constexpr row& instance(mp_instance_use u = mp_instance_use::none) {
    r.instance = body_instance;
    r.instance_use = u;
    return *this;
  }
  constexpr row& route(mp_route v) {
    r.route = v;
    return *this;
  }
  /// The session router answers None at once (mp_ack::router).
  constexpr row& router_acks() {
    r.ack = mp_ack::router;
    return *this;
  }
  constexpr row& failure(std::string (*f)()) {
    r.failure = f;
    return *this;
  }
  constexpr row& unknown_job(std::string (*f)()) {
    r.unknown_job = f;
    return *this;
  }
  /// Its gRPC method, at `path` in a service both releases share.
  constexpr row& grpc(const char* path) {
    r.grpc = true;
    r.grpc_path = path;
    return *this;
  }
  /// Its gRPC method in 0.5.6's and in 0.5.7's services (nullptr: none there).
  constexpr row& grpc(const char* path_056, const char* path_057) {
    r.grpc = true;
    r.grpc_path_056 = path_056;
    r.grpc_path_057 = path_057;
    return *this;
  }
  constexpr operator mp_op_row() const { return r; }
};

// clang-format off
constexpr mp_op_row rows[] = {
  row(mp_op::register_kv_cache, "register_kv_cache").id(1).body<register_kv_cache_req>()
    .instance(use::registers).route(route::registry)
    .grpc("/lmcache.mp.LMCacheDrivenService/RegisterKvCache"),
  row(mp_op::unregister_kv_cache, "unregister_kv_cache").id(2).body<unregister_kv_cache_req>()
    .instance(use::unregisters).route(route::registry)
    .grpc("/lmcache.mp.LMCacheDrivenService/UnregisterKvCache"),
  row(mp_op::store, "store").id(6).body<store_req>()
    .instance(use::uses).route(route::new_session).failure(event_not_ok)
    .grpc("/lmcache.mp.LMCacheDrivenService/Store"),
  row(mp_op::retrieve, "retrieve").id(7).body<retrieve_req>()
    .instance(use::uses).route(route::new_session).failure(event_not_ok)
    .grpc("/lmcache.mp.LMCacheDrivenService/Retrieve"),
  row(mp_op::lookup, "lookup").id(8).body<lookup_req>()
    .route(route::new_session).router_acks()
    .grpc("/lmcache.mp.LookupService/Lookup"),
  row(mp_op::query_prefetch_status, "query_prefetch_status").id(9).body<query_prefetch_status_req>()
    .route(route::session).unknown_job(zero)
    .grpc("/lmcache.mp.LookupService/QueryPrefetchStatus"),
  row(mp_op::wait_prefetch_status, "wait_prefetch_status").id(10).body<wait_prefetch_status_req>()
    .route(route::session).unknown_job(zero)
    .grpc("/lmcache.mp.LookupService/WaitPrefetchStatus"),
  row(mp_op::query_prefetch_lookup_hits, "query_prefetch_lookup_hits").id(11)
    .body<query_prefetch_lookup_hits_req>().route(route::session),
  row(mp_op::free_lookup_locks, "free_lookup_locks").id(12).body<free_lookup_locks_req>()
    .last_arg_057().route(route::session)
    .grpc("/lmcache.mp.LookupService/FreeLookupLocks"),
  row(mp_op::end_session, "end_session").id(13).body<end_session_req>()
    .route(route::end_session)
    .grpc("/lmcache.mp.LookupService/EndSession"),
  row(mp_op::register_kv_cache_engine_driven_context, "register_kv_cache_engine_driven_context")
    .id(14).body<register_engine_driven_req>().release_of(engine_driven_release)
    .instance(use::registers).route(route::registry)
    .grpc("/lmcache.mp.EngineDrivenService/RegisterKvCacheEngineDrivenContext"),
  row(mp_op::unregister_kv_cache_engine_driven_context, "unregister_kv_cache_engine_driven_context")
    .id(15).body<unregister_engine_driven_req>()
    .instance(use::unregisters).route(route::registry)
    .grpc("/lmcache.mp.EngineDrivenService/UnregisterKvCacheEngineDrivenContext"),
  row(mp_op::prepare_store, "prepare_store").id(16).body<prepare_store_req>().last_arg_057()
    .instance(use::uses).route(route::new_session)
    .grpc("/lmcache.mp.EngineDrivenService/PrepareStore"),
  row(mp_op::commit_store, "commit_store").id(17).body<commit_store_req>()
    .instance(use::uses).route(route::new_session).failure(false_)
    .grpc("/lmcache.mp.EngineDrivenService/CommitStore"),
  row(mp_op::prepare_retrieve, "prepare_retrieve").id(18).body<prepare_retrieve_req>()
    .instance(use::uses).route(route::new_session).failure(prepare_retrieve_failed)
    .grpc("/lmcache.mp.EngineDrivenService/PrepareRetrieve"),
  row(mp_op::commit_retrieve, "commit_retrieve").id(19).body<commit_retrieve_req>()
    .instance(use::uses).route(route::new_session).failure(false_)
    .grpc("/lmcache.mp.EngineDrivenService/CommitRetrieve"),
  row(mp_op::clear, "clear").id(20).body<clear_req>().optional_from(0).route(route::store_clear)
    .grpc("/lmcache.mp.ControllerService/Clear", "/lmcache.mp.ManagementService/Clear"),
  row(mp_op::get_chunk_size, "get_chunk_size").id(21).body<get_chunk_size_req>()
    .grpc("/lmcache.mp.ControllerService/GetChunkSize", "/lmcache.mp.ManagementService/GetChunkSize"),
  row(mp_op::ping, "ping").id(22).body<ping_req>().instance()
    .grpc("/lmcache.mp.ControllerService/Ping", "/lmcache.mp.ManagementService/Ping"),
  row(mp_op::report_block_allocation, "report_block_allocation").id(23)
    .body<report_block_allocation_req>() // its instance_id is EngineCore's pid: no instance()
    .grpc("/lmcache.mp.ObservabilityService/ReportBlockAllocation", "/lmcache.mp.ManagementService/ReportBlockAllocation"),
  row(mp_op::noop, "noop").id(24).body<noop_req>()
    .grpc("/lmcache.mp.DebugService/Noop", "/lmcache.mp.ManagementService/Noop"),
  row(mp_op::get_experimental, "get_experimental").id(32, 40).body<get_experimental_req>()
    .grpc("/lmcache.mp.ControllerService/GetExperimental", "/lmcache.mp.ManagementService/GetExperimental"),
  row(mp_op::negotiate_chunk_size, "negotiate_chunk_size").only_in(client_release::v0_5_7)
    .body<negotiate_chunk_size_req>()
    .grpc(nullptr, "/lmcache.mp.ManagementService/NegotiateChunkSize"),
  row(mp_op::server_module_call, "server_module_call").body<server_module_call_req>()
    .grpc("/lmcache.mp.ControllerService/ServerModuleCall", "/lmcache.mp.ExtensionService/ServerModuleCall"),
  row(mp_op::server_module_affinity_call, "server_module_affinity_call")
    .only_in(client_release::v0_5_7).body<server_module_call_req>()
    .grpc(nullptr, "/lmcache.mp.ExtensionService/ServerModuleAffinityCall"),
  row(mp_op::subscribe_kv_events, "subscribe_kv_events")
    .args({"instance_id", "model_name", "cursor", "max_events"}).streamed()
    .grpc("/lmcache.mp.ObservabilityService/SubscribeKvEvents", "/lmcache.mp.KVEventService/SubscribeKvEvents"),
};
// clang-format on

} // namespace

const mp_op_row& op_row(mp_op op) {
  for (const auto& r : rows)
    if (r.op == op)
      return r;
  return rows[0]; // not reached: every mp_op has a row (tests/unit/test_grpc_op_table.cpp)
}

const mp_op_row* op_row_by_name(std::string_view name) {
  for (const auto& r : rows)
    if (name == r.name)
      return &r;
  return nullptr;
}

const mp_op_row* op_row_by_id(int64_t id) {
  if (id < 0)
    return nullptr;
  for (const auto& r : rows)
    if (r.id == id || r.id_pre_055 == id)
      return &r;
  return nullptr;
}

mp_op_rows all_op_rows() { return {std::begin(rows), std::end(rows)}; }

const char* to_string(mp_op op) {
  for (const auto& r : rows)
    if (r.op == op)
      return r.name;
  return "?";
}

std::optional<mp_op> mp_op_from_name(std::string_view name) {
  if (const auto* r = op_row_by_name(name))
    return r->op;
  return std::nullopt;
}

std::optional<mp_op> mp_op_from_id(int64_t id) {
  // The 0.5.5+ ids only; 0.5.3 / 0.5.4's differing ones are the decoder's.
  for (const auto& r : rows)
    if (id >= 0 && r.id == id)
      return r.op;
  return std::nullopt;
}

const std::string* request_id_of(const mp_request& r) {
  const auto& row = op_row(r.op);
  return row.request_id ? row.request_id(r.body) : nullptr;
}

std::optional<int64_t> instance_of(const mp_request& r) {
  const auto& row = op_row(r.op);
  return row.instance ? row.instance(r.body) : std::nullopt;
}

std::optional<std::string> failure_body(mp_op op) {
  const auto& row = op_row(op);
  if (!row.failure)
    return std::nullopt;
  return row.failure();
}

const char* to_string(mp_route r) {
  switch (r) {
    case mp_route::bridge: return "bridge";
    case mp_route::registry: return "registry";
    case mp_route::store_clear: return "store_clear";
    case mp_route::new_session: return "new_session";
    case mp_route::session: return "session";
    case mp_route::end_session: return "end_session";
  }
  return "?";
}

const char* to_string(mp_ack a) {
  switch (a) {
    case mp_ack::served: return "served";
    case mp_ack::router: return "router";
  }
  return "?";
}

} // namespace kvs
