// engine_bridge: the ROUTER LMCache engine connectors talk to (see
// actors/interfaces.hpp), and the server of the requests the gRPC bridge
// hands it (lmcache_frames: the same frames, the same path). Simple ops are answered here (get_chunk_size,
// noop, ping's reply); the rest go to the session router
// (actors/cache/session_router.hpp). A bad request is logged with peer, uid, op
// and reason, counted, answered with the failure reply when it has a uid
// (lmcache_wire/lmcache_failure.hpp), and never disturbs other clients.
// subscribe_kv_events streams and their control frames are served here too
// (actors/cache/kv_event_streams.hpp), from the records the store sends.
#pragma once

#include "actors/interfaces.hpp"
#include "actors/cache/kv_event_streams.hpp"
#include "actors/cache/peer_connections.hpp"
#include "actors/cache/rejected_requests.hpp"
#include "actors/zmq_bridge.hpp"
#include "core/error.hpp"
#include "lmcache_wire/lmcache_ops.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"

#include <array>
#include <chrono>
#include <map>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvs {

/// Filled from the config (app/cache_tree.cpp): no defaults of its own.
struct engine_bridge_params {
  std::string endpoint;
  int64_t chunk_size = 0;       ///< cache.chunk_size
  int64_t hwm = 0;              ///< per-client send/receive HWM (cache.hwm)
  size_t kv_event_log_size = 0;                 ///< subscribe_kv_events log; 0 = off
  std::chrono::nanoseconds heartbeat_timeout{}; ///< a subscriber without PINGs this long ends
  session_router_actor router;
  store_actor store;            ///< asked for kv_event_records when the log is on
  std::string curve_secret_key; ///< [security]: CURVE server key, "" = off
  int64_t max_connections = 1024; ///< peers held at once (events.max_connections / cache.max_connections)
};

class engine_bridge : public zmq_bridge {
public:
  /// How the tree holds it (interfaces.hpp; spawn_bridge casts to it once).
  using handle_type = engine_bridge_actor;

  engine_bridge(caf::actor_config& cfg, zmq::context_t& ctx, caf::actor supervisor,
                std::chrono::nanoseconds stats_interval, engine_bridge_params params);

protected:
  std::optional<std::string> open() override;
  caf::behavior handlers() override;
  void on_socket(size_t index, short revents) override;
  stats_snapshot snapshot() override;

private:
  using clock = std::chrono::steady_clock;

  void arm_sweep();
  void on_request(std::vector<zmq::message_t>& frames);
  /// Reads every event the ROUTER's monitor queued: connections counted for
  /// the gate, ended ones released.
  void drain_monitor();
  /// The connection `identity` ended: the instances it registered, its
  /// sessions, their locks and staging slots are freed now (gone_atom).
  void release_connection(const std::string& identity, const char* how);
  /// gRPC owners whose connection no longer exists are released (a gRPC
  /// server has no per-connection event; /proc/net/tcp{,6} says).
  void check_grpc_owners();
  /// One request from either transport: `args` are the frames after the
  /// identity; `first_frame` the ZeroMQ frame carrying the peer's metadata
  /// (nullptr for gRPC, whose peer name is `grpc_peer`).
  void serve(std::string identity, const std::vector<std::string_view>& args,
             clock::time_point received, zmq::message_t* first_frame,
             std::string_view grpc_peer);
  /// Serves `call` where its op's row says (lmcache_ops.hpp): here, or the router.
  void route(mp_call call);
  /// The bridge's own ops (row route `bridge`): answered at once by the
  /// op's entry in `handlers_`.
  void answer(const mp_call& call);
  /// The handler of each op whose row routes it to the bridge
  /// (bridge_answers: every such row has one, test_actor_op_handlers).
  struct op_handler {
    mp_op op;
    void (*serve)(engine_bridge&, const mp_call&);
  };
  static const op_handler handlers_[];
  friend bool bridge_answers(mp_op op);
  /// The handler of each streamed op (row `streamed`: subscribe_kv_events),
  /// given the frames after the identity (bridge_streams: every streamed
  /// row has one, test_actor_op_handlers).
  struct stream_handler {
    mp_op op;
    void (engine_bridge::*open)(const std::string& identity,
                                const std::vector<std::string_view>& args);
  };
  static const stream_handler stream_handlers_[];
  friend bool bridge_streams(mp_op op);
  /// Opens the stream `row` names with its entry in `stream_handlers_`.
  void open_stream(const mp_op_row& row, const std::string& identity,
                   const std::vector<std::string_view>& args);
  /// server_module_call(s): LMCache's answer for an unknown method.
  void no_module(const mp_call& call);
  /// Binds or checks the instance `call` names, as its row's instance_use
  /// says; false when it was refused (and answered).
  bool claim_instance(const mp_call& call, const mp_op_row& row);
  void send_reply(const mp_reply& r);
  void count_reply(const mp_reply& r); ///< replies_ and the op's latency
  void on_subscribe(const std::string& identity, const std::vector<std::string_view>& args);
  void reject(const std::string& peer, const std::string& uid, const std::string& op,
              const error& err);
  bool foreign(const mp_call& call, int64_t instance);
  std::optional<uint32_t> peer_uid(zmq::message_t& frame) const;
  /// The client's process (mp_call::peer_pid): `frame` its first ZeroMQ
  /// frame, or nullptr for gRPC with `grpc_peer` its peer name. 0: unknown.
  int32_t peer_pid(zmq::message_t* frame, std::string_view grpc_peer) const;

  engine_bridge_params p_;
  zmq::socket_t router_;
  zmq::socket_t monitor_; ///< router_'s monitor: ACCEPTED / DISCONNECTED
  size_t monitor_index_ = 0;
  std::shared_ptr<connection_gate> gate_;
  peer_connections conns_; ///< descriptor -> ROUTER identity
  /// gRPC identity -> the peer of its latest call (gRPC's own name of it).
  std::unordered_map<std::string, std::string> grpc_peers_;
  bool sweep_armed_ = false;
  uint64_t connections_ended_ = 0; ///< owning or not
  uint64_t instances_released_ = 0;
  std::vector<zmq::message_t> frames_; ///< the request being read (reused)
  std::vector<std::string_view> args_; ///< its frames after the identity (reused)
  /// The gRPC bridge's server (cache.grpc_endpoint), once it introduced
  /// itself: the replies of requests with a grpc_identity() go there,
  /// delivered on this thread.
  lmcache_reply_sink_ptr grpc_;
  /// instance id -> ROUTER identity of the connection that registered it.
  /// Only that connection may re-register, unregister, store or retrieve
  /// through it, or keep it alive with pings; the binding ends when the
  /// instance is unregistered, reaped or its registration fails, and when
  /// that connection ends (the instance is released with it).
  std::unordered_map<int64_t, std::string> owners_;
  /// The client release each connection showed first (LMCache dialects are
  /// told apart per request; this remembers it for the replies of requests
  /// that do not show it, and for the log). Bounded: past max_known_peers
  /// it is forgotten and learnt again.
  std::unordered_map<std::string, client_release> releases_;
  uint64_t peers_seen_ = 0; ///< peers whose release was learnt (log lines: the first 10, then 1 in 1000)
  static constexpr size_t max_known_peers = 65536;
  bool ipc_ = false; ///< cache.endpoint is ipc://: registrations carry the peer's uid
  kv_event_streams streams_;

  uint64_t requests_ = 0;
  uint64_t grpc_requests_ = 0; ///< of requests_, those that came over gRPC
  uint64_t replies_ = 0;
  uint64_t reply_drops_ = 0;      ///< client's reply queue at cache.hwm: reply dropped
  uint64_t reply_unroutable_ = 0; ///< client gone before its reply
  rejected_requests rejected_;
  /// Request to reply, per op (indexed by the mp_op value).
  static inline const std::array<double, 16> latency_bounds_{
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
    25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1, 2.5, 5};
  std::array<fixed_histogram<16>, 256> latency_ = make_latency();
  static std::array<fixed_histogram<16>, 256> make_latency() {
    std::array<fixed_histogram<16>, 256> out;
    for (auto& h : out)
      h.bounds = &latency_bounds_;
    return out;
  }
};

} // namespace kvs
