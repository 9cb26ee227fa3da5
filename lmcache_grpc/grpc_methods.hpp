// The gRPC methods of LMCache's MP transport (transport/grpc_impl/ of
// LMCache 0.5.6 and 0.5.7), one row per HTTP/2 path kvsidecar serves: an
// op's paths are in its op-table row (lmcache_wire/lmcache_ops.cpp, `.grpc`).
//
// LMCache maps every MP op onto one RPC of a typed protobuf service
// (package lmcache.mp, path /lmcache.mp.<Service>/<CamelCaseOp>). The
// request and reply messages are the same in both releases; 0.5.7 moved the
// management ops into other services, so the *path* tells the releases
// apart:
//   0.5.6: ControllerService, DebugService, ObservabilityService
//   0.5.7: ManagementService, KVEventService, ExtensionService
//   both:  LMCacheDrivenService, LookupService, EngineDrivenService
// A client's first call (get_chunk_size / negotiate_chunk_size) is always in
// a release-specific service, so the server latches the release per client
// (lmcache-client-id-bin) from it: docs/lmcache-mp-compat.md, "gRPC".
//
// No gRPC or protobuf headers here.
#pragma once

#include "lmcache_wire/lmcache_protocol.hpp"

#include <cstdint>
#include <string_view>

namespace kvs {

struct grpc_method {
  std::string_view path;     ///< "/lmcache.mp.LookupService/Lookup"
  mp_op op;                  ///< the MP op it carries
  bool subscribe = false;    ///< its row is streamed (SubscribeKvEvents): a server-streaming RPC
  /// v0_5_6 / v0_5_7 for the release-specific services; unknown for the
  /// services both releases share.
  client_release release = client_release::unknown;
};

/// The row for an HTTP/2 path, or nullptr (answered UNIMPLEMENTED).
const grpc_method* find_grpc_method(std::string_view path);

/// Every row, for walking the table (tests: each method has a transcoder).
struct grpc_method_rows {
  const grpc_method* first;
  const grpc_method* last;
  const grpc_method* begin() const { return first; }
  const grpc_method* end() const { return last; }
};
grpc_method_rows all_grpc_methods();

/// LMCache's op name of a method ("lookup", "subscribe_kv_events").
std::string_view op_name(const grpc_method& m);

} // namespace kvs
