#include "actors/relay/pub_bridge.hpp"

#include "actors/zap_handler.hpp"
#include "actors/zmq_frames.hpp"
#include "config/config.hpp"
#include "log/log.hpp"
#include "messages/type_ids.hpp"

namespace kvs {

pub_bridge::pub_bridge(caf::actor_config& cfg, zmq::context_t& ctx, caf::actor supervisor,
                       std::chrono::nanoseconds stats_interval, pub_bridge_params params)
  : zmq_bridge(cfg, ctx, "pub", "dp=" + std::to_string(params.rank), std::move(supervisor),
               stats_interval),
    p_(std::move(params)) {}

std::optional<std::string> pub_bridge::open() {
  pub_ = zmq::socket_t{ctx_, zmq::socket_type::xpub};
  own(pub_);
  pub_.set(zmq::sockopt::sndhwm, static_cast<int>(p_.hwm));
  pub_.set(zmq::sockopt::xpub_nodrop, 1);
  serve_curve(pub_, p_.curve_secret_key);
  // Peers only send subscriptions (a topic prefix): a frame size announced
  // beyond this is refused before libzmq allocates it (raw TCP garbage can
  // announce 2^63 bytes).
  pub_.set(zmq::sockopt::maxmsgsize, int64_t{64} << 10);
  if (endpoint_binds(p_.endpoint))
    limit_connections(pub_, p_.config_key, "events.max_connections", p_.max_connections);
  auto r = open_endpoint(pub_, p_.endpoint, false);
  if (!r.ok)
    return p_.config_key + " = \"" + p_.endpoint + "\": " + r.endpoint;
  KVS_INFO(label(), "{} {} ({})", r.bound ? "bound" : "connected to", r.endpoint, p_.config_key);
  watch(pub_, ZMQ_POLLIN);
  return std::nullopt;
}

caf::behavior pub_bridge::handlers() {
  return typed_handlers<pub_bridge_actor>(
    [this](publish_atom, encoded_batches& bs) {
      for (auto& b : bs.items)
        send_batch(b);
      p_.queue->sent(static_cast<int64_t>(bs.items.size()));
    });
}

void pub_bridge::send_batch(const encoded_batch& b) {
  try {
    // First try with XPUB_NODROP: it refuses (EAGAIN) when any matching
    // subscriber is at its high-water mark, which is how we learn about a
    // drop at all. Then send with dropping on, like PUB: the full subscriber
    // loses this batch and, silently, the later ones until it has drained
    // to the low-water mark (one episode, one gap; see pub_bridge.hpp).
    auto first = pub_.send(zmq::buffer(p_.topic),
                           zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    if (!first) {
      take_pending_commands(pub_);
      first = pub_.send(zmq::buffer(p_.topic),
                        zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    }
    if (!first) {
      if (hwm_drops_++ == 0)
        KVS_WARN(label(), "a subscriber reached the high-water mark ({}): it misses seq {} "
                          "and later ones until it has read half its backlog (it can replay "
                          "them; each such episode counts once in stats as hwm_drops)",
                 p_.hwm, b.seq);
      lossy_send(zmq::message_t{p_.topic.data(), p_.topic.size()}, zmq::send_flags::sndmore);
    }
    // The HWM counts whole messages, so the later parts normally go at once;
    // should libzmq still refuse one (a peer changed its HWM meanwhile), it
    // is sent lossily rather than blocking this thread.
    auto seq = be64_frame(b.seq);
    if (!pub_.send(seq, zmq::send_flags::sndmore | zmq::send_flags::dontwait))
      lossy_send(std::move(seq), zmq::send_flags::sndmore);
    auto payload = shared_frame(b.payload);
    if (!pub_.send(payload, zmq::send_flags::dontwait))
      lossy_send(std::move(payload), zmq::send_flags::none);
    ++sent_;
  } catch (const zmq::error_t& e) {
    KVS_ERROR(label(), "send of seq {} failed: {}", b.seq, e.what());
  }
}

void pub_bridge::lossy_send(zmq::message_t m, zmq::send_flags flags) {
  // With XPUB_NODROP off a send never blocks: full subscribers just miss it.
  pub_.set(zmq::sockopt::xpub_nodrop, 0);
  pub_.send(m, flags);
  pub_.set(zmq::sockopt::xpub_nodrop, 1);
}

void pub_bridge::on_socket(size_t, short revents) {
  if (!(revents & ZMQ_POLLIN))
    return;
  // Subscription messages: first byte 1 = subscribe, 0 = unsubscribe.
  zmq::message_t m;
  while (pub_.recv(m, zmq::recv_flags::dontwait)) {
    if (m.size() >= 1) {
      auto first = static_cast<const unsigned char*>(m.data())[0];
      topics_ += first == 1 ? 1 : first == 0 ? -1 : 0;
      KVS_DEBUG(label(), "{} (distinct topics subscribed now {})",
                first == 1 ? "subscribe" : "unsubscribe", topics_);
    }
  }
}

stats_snapshot pub_bridge::snapshot() {
  stats_snapshot s;
  s.labels = {{"dp_rank", std::to_string(p_.rank)}};
  s.counter("sent", "kvsidecar_events_sent_total", sent_)
    .counter("hwm_drops", "kvsidecar_events_dropped_total", hwm_drops_, "reason",
             "subscriber_hwm")
    .gauge("topics", "kvsidecar_events_subscribers", topics_)
    .log_only("queued", p_.queue->queued());
  return s;
}

void pub_bridge::close_sockets() {
  close_with_linger(pub_, p_.linger);
}

} // namespace kvs
