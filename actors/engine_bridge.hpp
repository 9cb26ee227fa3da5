// engine_bridge: the ROUTER LMCache engine connectors talk to (see
// actors/interfaces.hpp). Simple ops are answered here (get_chunk_size,
// noop, ping's reply); the rest go to the registry, a session per request
// id (spawned on demand) or the store. A bad request is logged with peer,
// uid, op and reason, counted, answered with the failure reply when it has
// a uid (messages/lmcache_failure.hpp), and never disturbs other clients.
// subscribe_kv_events streams and their control frames are served here too
// (actors/kv_event_streams.hpp), from the records the store sends.
#pragma once

#include "actors/interfaces.hpp"
#include "actors/kv_event_streams.hpp"
#include "actors/zmq_bridge.hpp"
#include "core/error.hpp"

#include <array>
#include <chrono>
#include <map>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvs {

struct engine_bridge_params {
  std::string endpoint;
  int64_t chunk_size = 256;
  std::chrono::nanoseconds session_ttl{};
  size_t max_sessions = 65536; ///< live sessions at most (cache.max_sessions)
  int64_t hwm = 100000; ///< per-client send/receive HWM (cache.hwm)
  size_t kv_event_log_size = 0;                 ///< subscribe_kv_events log; 0 = off
  std::chrono::nanoseconds heartbeat_timeout{}; ///< a subscriber without PINGs this long ends
  registry_actor registry;
  store_actor store;
  gpu_transfer_actor gpu;
  std::string curve_secret_key; ///< [security]: CURVE server key, "" = off
};

class engine_bridge : public zmq_bridge {
public:
  engine_bridge(caf::actor_config& cfg, zmq::context_t& ctx, caf::actor supervisor,
                std::chrono::nanoseconds stats_interval, engine_bridge_params params);

protected:
  std::optional<std::string> open() override;
  caf::behavior handlers() override;
  void on_socket(size_t index, short revents) override;
  stats_snapshot snapshot() override;
  void drain() override;

private:
  using clock = std::chrono::steady_clock;

  struct session_entry {
    session_actor actor;
    std::vector<int64_t> instances; ///< instances that stored/retrieved through it
    clock::time_point last_active;  ///< last request routed to it
  };

  std::chrono::nanoseconds sweep_interval() const;

  void on_request(std::vector<zmq::message_t>& frames);
  void route(mp_call call);
  session_actor& session_for(const std::string& rid, bool create);
  void end_session(const std::string& rid);
  void send_reply(const mp_reply& r);
  void on_subscribe(const std::string& identity, const std::vector<std::string_view>& args);
  void reject(const std::string& peer, const std::string& uid, const std::string& op,
              const error& err);
  bool foreign(const mp_call& call, int64_t instance);
  std::optional<uint32_t> peer_uid(zmq::message_t& frame) const;

  engine_bridge_params p_;
  zmq::socket_t router_;
  std::unordered_map<std::string, session_entry> sessions_;
  /// instance id -> ROUTER identity of the connection that registered it.
  /// Only that connection may re-register, unregister, store or retrieve
  /// through it, or keep it alive with pings; the binding ends when the
  /// instance is unregistered, reaped or its registration fails.
  std::unordered_map<int64_t, std::string> owners_;
  bool ipc_ = false; ///< cache.endpoint is ipc://: registrations carry the peer's uid
  session_actor none_;
  kv_event_streams streams_;

  uint64_t requests_ = 0;
  uint64_t replies_ = 0;
  uint64_t reply_drops_ = 0;      ///< client's reply queue at cache.hwm: reply dropped
  uint64_t reply_unroutable_ = 0; ///< client gone before its reply
  uint64_t sessions_started_ = 0;
  uint64_t sessions_ended_ = 0;
  std::map<std::string, uint64_t> rejected_; ///< by error kind
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
