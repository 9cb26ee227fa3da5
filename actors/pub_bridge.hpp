// pub_bridge[dp=r]: the PUB side routers subscribe to.
//
// Owns an XPUB socket, so that it sees subscriptions and, with XPUB_NODROP,
// learns when a subscriber is at its high-water mark instead of dropping
// silently as PUB does. Takes `publish_atom, encoded_batches` from the
// publisher and sends `[topic, seq BE u64, payload]`. A batch that a full
// subscriber must miss is counted (hwm_drops) and still reaches every other
// subscriber; the slow one recovers it through replay.
#pragma once

#include "actors/relay_queue.hpp"
#include "actors/zmq_bridge.hpp"
#include "messages/encoded_batch.hpp"

namespace kvs {

struct pub_bridge_params {
  int64_t rank = 0;
  std::string endpoint;   ///< already offset for the rank
  std::string config_key; ///< "events.endpoint", for errors
  std::string topic;
  int64_t hwm = 0;
  relay_queue_ptr queue;
  std::chrono::nanoseconds linger{};
};

class pub_bridge : public zmq_bridge {
public:
  pub_bridge(caf::actor_config& cfg, zmq::context_t& ctx, caf::actor supervisor,
             std::chrono::nanoseconds stats_interval, pub_bridge_params params);

protected:
  std::optional<std::string> open() override;
  caf::behavior handlers() override;
  void on_socket(size_t index, short revents) override;
  stats_snapshot snapshot() override;
  void close_sockets() override;

private:
  void send_batch(const encoded_batch& b);

  pub_bridge_params p_;
  zmq::socket_t pub_;
  uint64_t sent_ = 0;
  uint64_t hwm_drops_ = 0;
  int64_t topics_ = 0; ///< distinct topics subscribed (XPUB reports each once)
};

} // namespace kvs
