// What every actor asks of a decoded LMCache request, answered in one place
// per op (lmcache_protocol.hpp: request_id_of, instance_of, failure_body).
#include "lmcache_wire/lmcache_protocol.hpp"

#include <type_traits>

namespace kvs {

const std::string* request_id_of(const mp_request& r) {
  return std::visit(
    [](const auto& b) -> const std::string* {
      using T = std::decay_t<decltype(b)>;
      if constexpr (std::is_same_v<T, lookup_req> || std::is_same_v<T, free_lookup_locks_req>
                    || std::is_same_v<T, store_req> || std::is_same_v<T, retrieve_req>
                    || std::is_same_v<T, prepare_store_req> || std::is_same_v<T, commit_store_req>
                    || std::is_same_v<T, prepare_retrieve_req>
                    || std::is_same_v<T, commit_retrieve_req>)
        return &b.key.request_id;
      else if constexpr (std::is_same_v<T, query_prefetch_status_req>
                         || std::is_same_v<T, wait_prefetch_status_req>
                         || std::is_same_v<T, query_prefetch_lookup_hits_req>
                         || std::is_same_v<T, end_session_req>)
        return &b.request_id;
      else
        return nullptr;
    },
    r.body);
}

std::optional<int64_t> instance_of(const mp_request& r) {
  return std::visit(
    [](const auto& b) -> std::optional<int64_t> {
      using T = std::decay_t<decltype(b)>;
      if constexpr (std::is_same_v<T, register_engine_driven_req>)
        return b.instance_id;
      else if constexpr (std::is_same_v<T, ping_req>)
        return b.instance_id;
      else if constexpr (std::is_same_v<T, register_kv_cache_req>
                         || std::is_same_v<T, unregister_kv_cache_req>
                         || std::is_same_v<T, unregister_engine_driven_req>
                         || std::is_same_v<T, store_req> || std::is_same_v<T, retrieve_req>
                         || std::is_same_v<T, prepare_store_req>
                         || std::is_same_v<T, commit_store_req>
                         || std::is_same_v<T, prepare_retrieve_req>
                         || std::is_same_v<T, commit_retrieve_req>)
        return b.instance_id;
      else
        return std::nullopt;
    },
    r.body);
}

mp_route route_of(mp_op op) {
  switch (op) {
    case mp_op::get_chunk_size:
    case mp_op::ping:
    case mp_op::noop:
    case mp_op::get_experimental:
    case mp_op::report_block_allocation:
    case mp_op::negotiate_chunk_size:
    case mp_op::server_module_call:
    case mp_op::server_module_affinity_call:
      return mp_route::bridge;
    case mp_op::register_kv_cache:
    case mp_op::unregister_kv_cache:
    case mp_op::register_kv_cache_engine_driven_context:
    case mp_op::unregister_kv_cache_engine_driven_context:
      return mp_route::registry;
    case mp_op::clear:
      return mp_route::store;
    case mp_op::lookup:
    case mp_op::store:
    case mp_op::retrieve:
    case mp_op::prepare_store:
    case mp_op::commit_store:
    case mp_op::prepare_retrieve:
    case mp_op::commit_retrieve:
      return mp_route::new_session;
    case mp_op::query_prefetch_status:
    case mp_op::wait_prefetch_status:
    case mp_op::query_prefetch_lookup_hits:
    case mp_op::free_lookup_locks:
      return mp_route::session;
    case mp_op::end_session:
      return mp_route::end_session;
  }
  return mp_route::bridge; // not reached: every op is listed (-Wswitch)
}

std::optional<std::string> failure_body(mp_op op) {
  switch (op) {
    case mp_op::store:
    case mp_op::retrieve:
      return encode_reply_event_ok("", false); // (b"", False)
    case mp_op::commit_store:
    case mp_op::commit_retrieve:
      return encode_reply_bool(false);
    case mp_op::prepare_retrieve:
      return encode_reply_prepare_retrieve(false, {});
    default:
      return std::nullopt;
  }
}

} // namespace kvs
