// pub_bridge[dp=r]: the PUB side routers subscribe to.
//
// Owns an XPUB socket, so that it sees subscriptions and, with XPUB_NODROP,
// learns when a subscriber is at its high-water mark instead of dropping
// silently as PUB does. Takes `publish_atom, encoded_batches` from the
// publisher and sends `[topic, seq BE u64, payload]`.
//
// What `hwm_drops` counts, and why nothing finer is possible: libzmq keeps
// one pipe per subscriber and tells the sender nothing about an individual
// pipe. With XPUB_NODROP a send fails (EAGAIN) while ANY subscriber's pipe
// is full; the bridge then sends the batch with dropping on, like PUB: the
// full subscribers miss it, the others get it. That lossy write makes libzmq
// set the full pipe aside ("inactive"), and it stays aside, silently missing
// every later batch, until its subscriber has read its backlog down to the
// low-water mark (about half the HWM); only then is it written to again. The
// sender is never told when that happens. So each increment of hwm_drops is
// one drop episode: one contiguous run of seqs that the subscriber(s) whose
// pipe was full at that moment miss (a router sees exactly one gap per
// episode it was part of, of one or more batches); when several are full
// at the same instant, one episode covers all of them. With one slow
// subscriber hwm_drops is an upper bound on its gaps, not always equal: see
// the end of this comment. The number
// of batches inside a gap is not observable here; routers know it from the
// seq and recover those batches through replay (events.replay_endpoint).
// A refusal is checked once more after libzmq's pending commands are taken
// (pub_bridge.cpp: a reader that has drained its pipe is only known to the
// sender through one), so an episode is counted only for a pipe that is
// full when the batch goes, as far as the sender can know: a drain that
// lands between that check and the lossy send (libzmq may take the command
// inside the send) lets the batch through, and the episode counted no gap.
#pragma once

#include "relay/relay_queue.hpp"
#include "actors/interfaces.hpp"
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
  std::string curve_secret_key; ///< [security]: CURVE server key, "" = off
  int64_t max_connections = 1024; ///< peers held at once (events.max_connections / cache.max_connections)
};

class pub_bridge : public zmq_bridge {
public:
  /// How the tree holds it (interfaces.hpp; spawn_bridge casts to it once).
  using handle_type = pub_bridge_actor;

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
  void lossy_send(zmq::message_t m, zmq::send_flags flags);

  pub_bridge_params p_;
  zmq::socket_t pub_;
  uint64_t sent_ = 0;
  uint64_t hwm_drops_ = 0; ///< drop episodes (see the top of this file)
  int64_t topics_ = 0; ///< distinct topics subscribed (XPUB reports each once)
};

} // namespace kvs
