#include "lmcache_grpc/grpc_methods.hpp"

#include "lmcache_wire/lmcache_ops.hpp"

#include <vector>

namespace kvs {

namespace {

/// The methods: each op row's gRPC paths (lmcache_wire/lmcache_ops.cpp),
/// then SubscribeKvEvents, a server-streaming RPC with no MP op row.
std::vector<grpc_method> build_methods() {
  std::vector<grpc_method> out;
  for (const auto& row : all_op_rows()) {
    if (row.grpc_path)
      out.push_back({row.grpc_path, row.op, false, client_release::unknown});
    if (row.grpc_path_056)
      out.push_back({row.grpc_path_056, row.op, false, client_release::v0_5_6});
    if (row.grpc_path_057)
      out.push_back({row.grpc_path_057, row.op, false, client_release::v0_5_7});
  }
  out.push_back({"/lmcache.mp.ObservabilityService/SubscribeKvEvents", mp_op::noop, true,
                 client_release::v0_5_6});
  out.push_back({"/lmcache.mp.KVEventService/SubscribeKvEvents", mp_op::noop, true,
                 client_release::v0_5_7});
  return out;
}

const std::vector<grpc_method>& methods() {
  static const std::vector<grpc_method> m = build_methods();
  return m;
}

} // namespace

const grpc_method* find_grpc_method(std::string_view path) {
  for (const auto& m : methods())
    if (m.path == path)
      return &m;
  return nullptr;
}

grpc_method_rows all_grpc_methods() {
  const auto& m = methods();
  return {m.data(), m.data() + m.size()};
}

std::string_view op_name(const grpc_method& m) {
  return m.subscribe ? std::string_view{"subscribe_kv_events"} : std::string_view{to_string(m.op)};
}

} // namespace kvs
