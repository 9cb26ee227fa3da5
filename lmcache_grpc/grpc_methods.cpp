#include "lmcache_grpc/grpc_methods.hpp"

#include <iterator>

namespace kvs {

namespace {

constexpr auto v56 = client_release::v0_5_6;
constexpr auto v57 = client_release::v0_5_7;
constexpr auto both = client_release::unknown;

// Paths as LMCache's generated stubs send them (descriptors.py: full
// service name, then the method name).
const grpc_method methods[] = {
  // Shared by 0.5.6 and 0.5.7 (same messages, same paths).
  {"/lmcache.mp.LMCacheDrivenService/RegisterKvCache", mp_op::register_kv_cache, false, both},
  {"/lmcache.mp.LMCacheDrivenService/UnregisterKvCache", mp_op::unregister_kv_cache, false, both},
  {"/lmcache.mp.LMCacheDrivenService/Store", mp_op::store, false, both},
  {"/lmcache.mp.LMCacheDrivenService/Retrieve", mp_op::retrieve, false, both},
  {"/lmcache.mp.LookupService/Lookup", mp_op::lookup, false, both},
  {"/lmcache.mp.LookupService/QueryPrefetchStatus", mp_op::query_prefetch_status, false, both},
  {"/lmcache.mp.LookupService/WaitPrefetchStatus", mp_op::wait_prefetch_status, false, both},
  {"/lmcache.mp.LookupService/FreeLookupLocks", mp_op::free_lookup_locks, false, both},
  {"/lmcache.mp.LookupService/EndSession", mp_op::end_session, false, both},
  {"/lmcache.mp.EngineDrivenService/RegisterKvCacheEngineDrivenContext",
   mp_op::register_kv_cache_engine_driven_context, false, both},
  {"/lmcache.mp.EngineDrivenService/UnregisterKvCacheEngineDrivenContext",
   mp_op::unregister_kv_cache_engine_driven_context, false, both},
  {"/lmcache.mp.EngineDrivenService/PrepareStore", mp_op::prepare_store, false, both},
  {"/lmcache.mp.EngineDrivenService/CommitStore", mp_op::commit_store, false, both},
  {"/lmcache.mp.EngineDrivenService/PrepareRetrieve", mp_op::prepare_retrieve, false, both},
  {"/lmcache.mp.EngineDrivenService/CommitRetrieve", mp_op::commit_retrieve, false, both},
  // 0.5.6 only.
  {"/lmcache.mp.ControllerService/Clear", mp_op::clear, false, v56},
  {"/lmcache.mp.ControllerService/GetChunkSize", mp_op::get_chunk_size, false, v56},
  {"/lmcache.mp.ControllerService/GetExperimental", mp_op::get_experimental, false, v56},
  {"/lmcache.mp.ControllerService/Ping", mp_op::ping, false, v56},
  {"/lmcache.mp.ControllerService/ServerModuleCall", mp_op::server_module_call, false, v56},
  {"/lmcache.mp.DebugService/Noop", mp_op::noop, false, v56},
  {"/lmcache.mp.ObservabilityService/ReportBlockAllocation", mp_op::report_block_allocation,
   false, v56},
  {"/lmcache.mp.ObservabilityService/SubscribeKvEvents", mp_op::noop, true, v56},
  // 0.5.7 only.
  {"/lmcache.mp.ManagementService/Clear", mp_op::clear, false, v57},
  {"/lmcache.mp.ManagementService/GetChunkSize", mp_op::get_chunk_size, false, v57},
  {"/lmcache.mp.ManagementService/NegotiateChunkSize", mp_op::negotiate_chunk_size, false, v57},
  {"/lmcache.mp.ManagementService/GetExperimental", mp_op::get_experimental, false, v57},
  {"/lmcache.mp.ManagementService/Noop", mp_op::noop, false, v57},
  {"/lmcache.mp.ManagementService/Ping", mp_op::ping, false, v57},
  {"/lmcache.mp.ManagementService/ReportBlockAllocation", mp_op::report_block_allocation, false,
   v57},
  {"/lmcache.mp.KVEventService/SubscribeKvEvents", mp_op::noop, true, v57},
  {"/lmcache.mp.ExtensionService/ServerModuleCall", mp_op::server_module_call, false, v57},
  {"/lmcache.mp.ExtensionService/ServerModuleAffinityCall", mp_op::server_module_affinity_call,
   false, v57},
};

} // namespace

const grpc_method* find_grpc_method(std::string_view path) {
  for (const auto& m : methods)
    if (m.path == path)
      return &m;
  return nullptr;
}

grpc_method_rows all_grpc_methods() {
  return {std::begin(methods), std::end(methods)};
}

std::string_view op_name(const grpc_method& m) {
  return m.subscribe ? std::string_view{"subscribe_kv_events"} : std::string_view{to_string(m.op)};
}

} // namespace kvs
