#include "actors/pub_bridge.hpp"

#include "actors/zmq_frames.hpp"
#include "app/log.hpp"
#include "messages/type_ids.hpp"

namespace kvs {

pub_bridge::pub_bridge(caf::actor_config& cfg, zmq::context_t& ctx, caf::actor supervisor,
                       std::chrono::nanoseconds stats_interval, pub_bridge_params params)
  : zmq_bridge(cfg, ctx, "pub", "dp=" + std::to_string(params.rank), std::move(supervisor),
               stats_interval),
    p_(std::move(params)) {}

std::optional<std::string> pub_bridge::open() {
  pub_ = zmq::socket_t{ctx_, zmq::socket_type::xpub};
  pub_.set(zmq::sockopt::sndhwm, static_cast<int>(p_.hwm));
  pub_.set(zmq::sockopt::xpub_nodrop, 1);
  auto r = open_endpoint(pub_, p_.endpoint, false);
  if (!r.ok)
    return p_.config_key + " = \"" + p_.endpoint + "\": " + r.endpoint;
  KVS_INFO(label(), "{} {} ({})", r.bound ? "bound" : "connected to", r.endpoint, p_.config_key);
  watch(pub_, ZMQ_POLLIN);
  return std::nullopt;
}

caf::behavior pub_bridge::handlers() {
  return {
    [this](publish_atom, encoded_batch& b) {
      bool ok = false;
      try {
        ok = pub_.send(zmq::buffer(p_.topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait)
               .has_value();
        if (ok) {
          // Once the first frame is in, the rest of the message follows.
          pub_.send(be64_frame(b.seq), zmq::send_flags::sndmore);
          pub_.send(shared_frame(b.payload), zmq::send_flags::none);
        }
      } catch (const zmq::error_t& e) {
        KVS_ERROR(label(), "send of seq {} failed: {}", b.seq, e.what());
        ok = false;
      }
      if (ok) {
        ++sent_;
      } else {
        if (hwm_drops_++ == 0)
          KVS_WARN(label(), "high-water mark ({}) reached: seq {} dropped; routers can "
                            "replay it (counted in stats as hwm_drops)", p_.hwm, b.seq);
      }
      p_.queue->release();
    },
  };
}

void pub_bridge::on_socket(size_t, short revents) {
  if (!(revents & ZMQ_POLLIN))
    return;
  // Subscription messages: first byte 1 = subscribe, 0 = unsubscribe.
  zmq::message_t m;
  while (pub_.recv(m, zmq::recv_flags::dontwait)) {
    if (m.size() >= 1) {
      auto first = static_cast<const unsigned char*>(m.data())[0];
      subscribers_ += first == 1 ? 1 : first == 0 ? -1 : 0;
      KVS_DEBUG(label(), "{} (subscriptions now {})", first == 1 ? "subscribe" : "unsubscribe",
                subscribers_);
    }
  }
}

void pub_bridge::log_stats() {
  KVS_INFO(label(), "stats: sent={} hwm_drops={} subscriptions={} queued={}", sent_, hwm_drops_,
           subscribers_, p_.queue->queued.load());
}

void pub_bridge::close_sockets() {
  // Give what was accepted a moment to leave: messages still in ZeroMQ's
  // pipes are flushed for up to `linger` when the socket closes.
  if (pub_.handle() != nullptr) {
    pub_.set(zmq::sockopt::linger,
             static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(p_.linger).count()));
    pub_.close();
  }
}

} // namespace kvs
