#include "actors/cache/grpc_bridge.hpp"

#include "config/config.hpp"
#include "log/log.hpp"

#include <caf/send.hpp>

namespace kvs {

grpc_bridge::grpc_bridge(caf::actor_config& cfg, zmq::context_t& ctx, caf::actor supervisor,
                         std::chrono::nanoseconds stats_interval, grpc_bridge_params params)
  : zmq_bridge(cfg, ctx, "grpc_bridge", "", std::move(supervisor), stats_interval),
    p_(std::move(params)) {}

std::optional<std::string> grpc_bridge::open() {
  // Weak handles: the server is shared with the engine bridge, and strong
  // ones here would keep both actors alive through it.
  caf::actor_addr self = address();
  caf::actor_addr engine = p_.engine.address();
  // Both called on the completion queue's thread (one call at a time).
  server_ = std::make_shared<grpc_server>(
    p_.server,
    [self, engine](lmcache_frames f) {
      auto from = caf::actor_cast<caf::actor>(self);
      auto to = caf::actor_cast<caf::actor>(engine);
      if (from && to)
        caf::send_as(from, to, std::move(f));
    },
    [label = label(), rejected = rejected_](const std::string& peer, std::string_view op,
                                            std::string_view kind, const std::string& why) {
      rejected->note(label, peer, "-", std::string(op), std::string(kind), why);
    });
  // Where the replies go, in the engine bridge's mailbox before the server
  // accepts its first call.
  send(p_.engine, grpc_atom_v, lmcache_reply_sink_ptr{server_});
  if (auto err = server_->start())
    return err;
  KVS_INFO(label(), "bound {} (cache.grpc_endpoint): serving LMCache's gRPC transport (0.5.6 "
                    "and 0.5.7 services){}",
           server_->bound(), p_.server.tls_cert_pem.empty() ? "" : " over TLS");
  const auto& ep = p_.server.endpoint;
  if (ep.rfind("grpc://", 0) == 0 && !endpoint_is_local("tcp://" + ep.substr(7))
      && p_.server.tls_client_ca_pem.empty())
    KVS_WARN(label(), "cache.grpc_endpoint = \"{}\" is reachable from the network: any client "
                      "that reaches it can register shared memory the sidecar's user may open "
                      "(bind 127.0.0.1 or a grpc+unix:// path, or require client certificates "
                      "with cache.grpc_tls_client_ca_file)",
             ep);
  return std::nullopt;
}

caf::behavior grpc_bridge::handlers() {
  // Only the built-ins: replies go to the server directly (lmcache_reply_sink).
  return typed_handlers<grpc_bridge_actor>();
}

void grpc_bridge::close_sockets() {
  // The server's shutdown handshake: in-flight calls cancelled, its queue
  // drained and its thread joined before this bridge's thread ends.
  if (server_)
    server_->stop();
  zmq_bridge::close_sockets();
}

stats_snapshot grpc_bridge::snapshot() {
  stats_snapshot s;
  if (!server_)
    return s;
  const auto& c = server_->counters();
  auto get = [](const auto& a) { return a.load(std::memory_order_relaxed); };
  s.counter("calls", "kvsidecar_grpc_calls_total", get(c.calls))
    .counter("replies", "kvsidecar_grpc_replies_total", get(c.replies))
    .counter("failed", "kvsidecar_grpc_failed_total", get(c.failed))
    .counter("bad_requests", "kvsidecar_grpc_bad_requests_total", get(c.bad_requests))
    .counter("unimplemented", "kvsidecar_grpc_unimplemented_total", get(c.unimplemented))
    .counter("overloaded", "kvsidecar_grpc_overloaded_total", get(c.overloaded))
    .counter("cancelled", "kvsidecar_grpc_cancelled_total", get(c.cancelled))
    .gauge("streams", "kvsidecar_grpc_kv_event_streams", get(c.streams));
  return s;
}

} // namespace kvs
