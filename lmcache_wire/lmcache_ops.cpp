// The op table (lmcache_ops.hpp): one row per LMCache op, and the questions
// every layer asks of an op or a decoded request, answered from its row.
#include "lmcache_wire/lmcache_ops.hpp"

#include "lmcache_wire/lmcache_body_decode.hpp"

#include <iterator>

namespace kvs {

namespace {

namespace body = lmcache_wire::body;

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

// LMCache's failure values and unknown-job answers.
std::string event_not_ok() { return encode_reply_event_ok("", false); } // (b"", False)
std::string false_() { return encode_reply_bool(false); }
std::string prepare_retrieve_failed() { return encode_reply_prepare_retrieve(false, {}); }
std::string zero() { return encode_reply_int(0); }

client_release engine_driven_release(const mp_request_body& b) {
  return std::get<register_engine_driven_req>(b).group_layouts ? client_release::v0_5_7
                                                               : client_release::v0_5_6;
}

constexpr auto any = client_release::unknown;
constexpr auto v57 = client_release::v0_5_7;
using use = mp_instance_use;
using route = mp_route;
using ack = mp_ack;

// clang-format off
const mp_op_row rows[] = {
  // op, name, id, id 0.5.3/4, only in, args min..max, last arg 0.5.7's, arg names,
  //   decoder, release of, request id, instance, instance use, route, ack, failure, unknown job, gRPC
  {mp_op::register_kv_cache, "register_kv_cache", 1, -1, any, 7, 7, false,
   {"instance_id", "kv_cache", "model_name", "world_size", "engine_type", "layout_hints", "engine_group_infos"},
   body::register_kv_cache, nullptr, nullptr, instance_id<register_kv_cache_req>, use::registers,
   route::registry, ack::served, nullptr, nullptr, true},
  {mp_op::unregister_kv_cache, "unregister_kv_cache", 2, -1, any, 1, 1, false, {"instance_id"},
   body::instance_only<unregister_kv_cache_req>, nullptr, nullptr, instance_id<unregister_kv_cache_req>,
   use::unregisters, route::registry, ack::served, nullptr, nullptr, true},
  {mp_op::store, "store", 6, -1, any, 4, 4, false, {"key", "instance_id", "block_ids", "event_ipc_handle"},
   body::store, nullptr, key_request_id<store_req>, instance_id<store_req>, use::uses,
   route::new_session, ack::served, event_not_ok, nullptr, true},
  {mp_op::retrieve, "retrieve", 7, -1, any, 5, 5, false,
   {"key", "instance_id", "block_ids", "event_ipc_handle", "skip_first_n_tokens"},
   body::retrieve, nullptr, key_request_id<retrieve_req>, instance_id<retrieve_req>, use::uses,
   route::new_session, ack::served, event_not_ok, nullptr, true},
  {mp_op::lookup, "lookup", 8, -1, any, 2, 2, false, {"key", "tp_size"},
   body::lookup, nullptr, key_request_id<lookup_req>, nullptr, use::none,
   route::new_session, ack::router, nullptr, nullptr, true},
  {mp_op::query_prefetch_status, "query_prefetch_status", 9, -1, any, 1, 1, false, {"request_id"},
   body::request_id_only<query_prefetch_status_req>, nullptr, own_request_id<query_prefetch_status_req>,
   nullptr, use::none, route::session, ack::served, nullptr, zero, true},
  {mp_op::wait_prefetch_status, "wait_prefetch_status", 10, -1, any, 2, 2, false, {"request_id", "timeout"},
   body::wait_prefetch_status, nullptr, own_request_id<wait_prefetch_status_req>, nullptr, use::none,
   route::session, ack::served, nullptr, zero, true},
  {mp_op::query_prefetch_lookup_hits, "query_prefetch_lookup_hits", 11, -1, any, 1, 1, false, {"request_id"},
   body::request_id_only<query_prefetch_lookup_hits_req>, nullptr,
   own_request_id<query_prefetch_lookup_hits_req>, nullptr, use::none, route::session, ack::served,
   nullptr, nullptr, false},
  {mp_op::free_lookup_locks, "free_lookup_locks", 12, -1, any, 2, 3, true, {"key", "tp_size", "extra_ranges"},
   body::free_lookup_locks, nullptr, key_request_id<free_lookup_locks_req>, nullptr, use::none,
   route::session, ack::served, nullptr, nullptr, true},
  {mp_op::end_session, "end_session", 13, -1, any, 1, 1, false, {"request_id"},
   body::request_id_only<end_session_req>, nullptr, own_request_id<end_session_req>, nullptr, use::none,
   route::end_session, ack::served, nullptr, nullptr, true},
  {mp_op::register_kv_cache_engine_driven_context, "register_kv_cache_engine_driven_context", 14, -1, any,
   1, 1, false, {"payload"},
   body::register_engine_driven, engine_driven_release, nullptr, instance_id<register_engine_driven_req>,
   use::registers, route::registry, ack::served, nullptr, nullptr, true},
  {mp_op::unregister_kv_cache_engine_driven_context, "unregister_kv_cache_engine_driven_context", 15, -1,
   any, 1, 1, false, {"instance_id"},
   body::instance_only<unregister_engine_driven_req>, nullptr, nullptr,
   instance_id<unregister_engine_driven_req>, use::unregisters, route::registry, ack::served, nullptr,
   nullptr, true},
  {mp_op::prepare_store, "prepare_store", 16, -1, any, 2, 3, true, {"key", "instance_id", "skipped_chunks"},
   body::prepare_store, nullptr, key_request_id<prepare_store_req>, instance_id<prepare_store_req>,
   use::uses, route::new_session, ack::served, nullptr, nullptr, true},
  {mp_op::commit_store, "commit_store", 17, -1, any, 3, 3, false, {"key", "instance_id", "data"},
   body::commit_store, nullptr, key_request_id<commit_store_req>, instance_id<commit_store_req>,
   use::uses, route::new_session, ack::served, false_, nullptr, true},
  {mp_op::prepare_retrieve, "prepare_retrieve", 18, -1, any, 2, 2, false, {"key", "instance_id"},
   body::key_instance<prepare_retrieve_req>, nullptr, key_request_id<prepare_retrieve_req>,
   instance_id<prepare_retrieve_req>, use::uses, route::new_session, ack::served,
   prepare_retrieve_failed, nullptr, true},
  {mp_op::commit_retrieve, "commit_retrieve", 19, -1, any, 2, 2, false, {"key", "instance_id"},
   body::key_instance<commit_retrieve_req>, nullptr, key_request_id<commit_retrieve_req>,
   instance_id<commit_retrieve_req>, use::uses, route::new_session, ack::served, false_, nullptr, true},
  {mp_op::clear, "clear", 20, -1, any, 0, 1, false, {"force"},
   body::clear, nullptr, nullptr, nullptr, use::none, route::store, ack::served, nullptr, nullptr, true},
  {mp_op::get_chunk_size, "get_chunk_size", 21, -1, any, 0, 0, false, {},
   body::none<get_chunk_size_req>, nullptr, nullptr, nullptr, use::none, route::bridge, ack::served,
   nullptr, nullptr, true},
  {mp_op::ping, "ping", 22, -1, any, 1, 1, false, {"instance_id"},
   body::ping, nullptr, nullptr, instance_id<ping_req>, use::none, route::bridge, ack::served, nullptr,
   nullptr, true},
  {mp_op::report_block_allocation, "report_block_allocation", 23, -1, any, 3, 3, false,
   {"instance_id", "model_name", "records"},
   body::report_block_allocation, nullptr, nullptr, nullptr, use::none, route::bridge, ack::served,
   nullptr, nullptr, true},
  {mp_op::noop, "noop", 24, -1, any, 0, 0, false, {},
   body::none<noop_req>, nullptr, nullptr, nullptr, use::none, route::bridge, ack::served, nullptr,
   nullptr, true},
  {mp_op::get_experimental, "get_experimental", 32, 40, any, 0, 0, false, {},
   body::none<get_experimental_req>, nullptr, nullptr, nullptr, use::none, route::bridge, ack::served,
   nullptr, nullptr, true},
  {mp_op::negotiate_chunk_size, "negotiate_chunk_size", -1, -1, v57, 1, 1, false, {"required_chunk_alignment"},
   body::negotiate_chunk_size, nullptr, nullptr, nullptr, use::none, route::bridge, ack::served, nullptr,
   nullptr, true},
  {mp_op::server_module_call, "server_module_call", -1, -1, any, 1, 1, false, {"request"},
   body::server_module_call, nullptr, nullptr, nullptr, use::none, route::bridge, ack::served, nullptr,
   nullptr, true},
  {mp_op::server_module_affinity_call, "server_module_affinity_call", -1, -1, v57, 1, 1, false, {"request"},
   body::server_module_call, nullptr, nullptr, nullptr, use::none, route::bridge, ack::served, nullptr,
   nullptr, true},
};
// clang-format on

} // namespace

const mp_op_row& op_row(mp_op op) {
  for (const auto& r : rows)
    if (r.op == op)
      return r;
  return rows[0]; // not reached: every mp_op has a row (test_lmcache_op_table)
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

mp_route route_of(mp_op op) { return op_row(op).route; }

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
    case mp_route::store: return "store";
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
