// grpc_bridge: LMCache's gRPC transport, a bridge at the edge like the
// ZeroMQ ones (see actors/interfaces.hpp).
//
// A bridge thread for its mailbox (the zmq_bridge base: start-up and
// shutdown handshakes, stats, /metrics; it owns no ZeroMQ socket) and the
// grpc_server's own thread for the completion queue
// (lmcache_grpc/grpc_server.hpp). Each RPC becomes the frames a ZeroMQ
// client of the same LMCache release sends, handed to the engine bridge,
// which decodes, checks (owners, limits, dialects) and routes it exactly as
// a ZeroMQ request, and hands each reply straight to the server
// (lmcache_reply_sink), which writes it on its RPC.
// So no op is implemented twice, and the tenant rules are the same.
#pragma once

#include "actors/interfaces.hpp"
#include "actors/cache/rejected_requests.hpp"
#include "actors/zmq_bridge.hpp"
#include "lmcache_grpc/grpc_server.hpp"

#include <memory>

namespace kvs {

struct grpc_bridge_params {
  grpc_server_params server;
  engine_bridge_actor engine;
};

class grpc_bridge : public zmq_bridge {
public:
  /// How the tree holds it (interfaces.hpp; spawn_bridge casts to it once).
  using handle_type = grpc_bridge_actor;

  grpc_bridge(caf::actor_config& cfg, zmq::context_t& ctx, caf::actor supervisor,
              std::chrono::nanoseconds stats_interval, grpc_bridge_params params);

protected:
  std::optional<std::string> open() override;
  caf::behavior handlers() override;
  void on_socket(size_t, short) override {}
  void close_sockets() override;
  stats_snapshot snapshot() override;

private:
  grpc_bridge_params p_;
  std::shared_ptr<grpc_server> server_; ///< shared with the engine bridge (its reply sink)
  /// Calls the server refused itself, logged rate-limited (on its thread).
  std::shared_ptr<rejected_requests> rejected_ = std::make_shared<rejected_requests>();
};

} // namespace kvs
