// replay_bridge[dp=r]: the replay ROUTER routers ask for missed batches.
//
// A request is exactly `[identity, "", start_seq (8 bytes BE)]`; anything
// else is logged (once per kind) and ignored. The bridge asks the rank's
// replay actor for a snapshot and streams it to the client at the client's
// pace (ROUTER_MANDATORY: a full pipe defers the client, never blocks the
// others or live publishing), then sends the end marker. Layout by dialect:
//   vllm:       [id, "", topic, seq, payload] ... [id, "", "", END_SEQ, ""]
//   tokenspeed: [id, "", seq, payload]        ... [id, "", END_SEQ, ""]
#pragma once

#include "actors/interfaces.hpp"
#include "actors/zmq_bridge.hpp"

#include <deque>
#include <set>

namespace kvs {

struct replay_bridge_params {
  int64_t rank = 0;
  std::string endpoint;
  std::string config_key;
  std::string topic;
  event_dialect dialect = event_dialect::vllm;
  replay_actor replay;
  int64_t rate = 0; ///< batches/s streamed at most, all clients together (0 = unlimited)
  std::string curve_secret_key; ///< [security]: CURVE server key, "" = off
  int64_t hwm = 10000; ///< per-client send (and request receive) HWM: events.replay_hwm
};

class replay_bridge : public zmq_bridge {
public:
  replay_bridge(caf::actor_config& cfg, zmq::context_t& ctx, caf::actor supervisor,
                std::chrono::nanoseconds stats_interval, replay_bridge_params params);

protected:
  std::optional<std::string> open() override;
  caf::behavior handlers() override;
  void on_socket(size_t index, short revents) override;
  stats_snapshot snapshot() override;
  std::chrono::milliseconds poll_timeout() override;
  void after_poll() override;

private:
  struct pending {
    replay_stream stream;
    size_t next = 0;       ///< next batch to send
    bool blocked = false;  ///< last send hit the client's HWM
  };

  void pump();
  /// Token bucket for `rate`: refills, returns how many batches may go now.
  size_t allowance();
  /// Sends one message of the stream; false when the client's pipe is full.
  bool send_batch(const std::string& client, const encoded_batch* b);
  void reject(const std::string& kind, const std::string& detail);

  replay_bridge_params p_;
  zmq::socket_t router_;
  std::deque<pending> streams_;
  std::set<std::string> rejected_kinds_;
  uint64_t requests_ = 0;
  uint64_t rejected_ = 0;
  uint64_t sent_ = 0;
  uint64_t abandoned_ = 0;
  double tokens_ = 0;
  std::chrono::steady_clock::time_point refilled_ = std::chrono::steady_clock::now();
};

} // namespace kvs
