#include "lmcache_grpc/grpc_methods.hpp"

#include "lmcache_wire/lmcache_ops.hpp"

#include <vector>

namespace kvs {

namespace {

/// The methods: each op row's gRPC paths (lmcache_wire/lmcache_ops.cpp);
/// a streamed row's (SubscribeKvEvents) are server-streaming RPCs.
std::vector<grpc_method> build_methods() {
  std::vector<grpc_method> out;
  for (const auto& row : all_op_rows()) {
    if (row.grpc_path)
      out.push_back({row.grpc_path, row.op, row.streamed, client_release::unknown});
    if (row.grpc_path_056)
      out.push_back({row.grpc_path_056, row.op, row.streamed, client_release::v0_5_6});
    if (row.grpc_path_057)
      out.push_back({row.grpc_path_057, row.op, row.streamed, client_release::v0_5_7});
  }
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
  return to_string(m.op);
}

} // namespace kvs
