#include "actors/relay/join_bridge.hpp"

#include "actors/zap_handler.hpp"
#include "actors/zmq_frames.hpp"
#include "events_wire/kv_event_codec.hpp"
#include "log/log.hpp"
#include "messages/type_ids.hpp"

#include <caf/send.hpp>

namespace kvs {

namespace {

/// A full pipe is tried again this soon (zmq_poll's finest step).
constexpr std::chrono::milliseconds retry_after{1};

/// K snapshot batches into at most `groups` (S+1 when the rank has
/// published fewer batches than the snapshot has): consecutive ones merged,
/// so every snapshot batch still gets a seq of its own at or below S.
std::vector<kv_event_batch> merge_into(std::vector<kv_event_batch> parts, size_t groups) {
  if (parts.size() <= groups)
    return parts;
  std::vector<kv_event_batch> out(groups);
  const size_t per = (parts.size() + groups - 1) / groups;
  for (size_t i = 0; i < parts.size(); ++i) {
    auto& dst = out[i / per];
    if (dst.events.empty()) {
      dst.ts = parts[i].ts;
      dst.dp_rank = parts[i].dp_rank;
    }
    for (auto& e : parts[i].events)
      dst.events.push_back(std::move(e));
  }
  while (!out.empty() && out.back().events.empty() && out.size() > 1)
    out.pop_back();
  return out;
}

} // namespace

join_bridge::join_bridge(caf::actor_config& cfg, zmq::context_t& ctx, caf::actor supervisor,
                         std::chrono::nanoseconds stats_interval, join_bridge_params params)
  : zmq_bridge(cfg, ctx, "join", "dp=" + std::to_string(params.rank), std::move(supervisor),
               stats_interval),
    p_(std::move(params)) {}

std::optional<std::string> join_bridge::open() {
  pub_ = zmq::socket_t{ctx_, zmq::socket_type::xpub};
  own(pub_);
  pub_.set(zmq::sockopt::sndhwm, static_cast<int>(p_.hwm));
  pub_.set(zmq::sockopt::xpub_nodrop, 1);
  // Every subscription and every unsubscription (a router leaving), not
  // only the first and last of a topic: the bridge counts its routers.
  pub_.set(zmq::sockopt::xpub_verboser, 1);
  serve_curve(pub_, p_.curve_secret_key);
  pub_.set(zmq::sockopt::maxmsgsize, int64_t{64} << 10);
  limit_connections(pub_, p_.config_key, "events.max_connections", p_.max_connections);
  auto r = open_endpoint(pub_, p_.endpoint, true);
  if (!r.ok)
    return p_.config_key + " = \"" + p_.endpoint + "\": " + r.endpoint;
  KVS_INFO(label(), "bound {} ({}: the rank's state, then live, for one router)", r.endpoint,
           p_.config_key);
  watch(pub_, ZMQ_POLLIN);
  return std::nullopt;
}

caf::behavior join_bridge::handlers() {
  return typed_handlers<join_bridge_actor>(
    [this](publish_atom, encoded_batches& bs) { on_live(bs); },
    [this](snapshot_part& part) { on_part(part); });
}

void join_bridge::on_live(encoded_batches& bs) {
  // Nobody listening: nothing is sent (and nothing kept). Not calling send
  // also means libzmq applies a new subscription only inside our poll, so
  // the first subscriber's first message is its snapshot, never a live
  // batch sent a moment before we saw it subscribe.
  if (subscribers_ == 0)
    return;
  for (auto& b : bs.items)
    live_out_.push_back(std::move(b));
  while (static_cast<int64_t>(live_out_.size()) > p_.hwm) {
    live_out_.pop_front();
    ++dropped_;
    if (!warned_dropped_) {
      warned_dropped_ = true;
      KVS_WARN(label(), "the router on the join endpoint is more than events.hwm ({}) batches "
                        "behind: the oldest are dropped (it sees a gap and replays them; "
                        "counted as dropped)",
               p_.hwm);
    }
  }
  pump();
}

void join_bridge::on_socket(size_t, short revents) {
  if (!(revents & ZMQ_POLLIN))
    return;
  zmq::message_t m;
  while (pub_.recv(m, zmq::recv_flags::dontwait)) {
    if (m.size() < 1)
      continue;
    auto kind = static_cast<const unsigned char*>(m.data())[0];
    if (kind == 1) {
      ++subscribers_;
      if (subscribers_ == 1) {
        start_join();
      } else if (!warned_second_) {
        warned_second_ = true;
        KVS_WARN(label(), "{} routers on the join endpoint: the later ones get the live stream "
                          "only (give each router that joins late its own {})",
                 subscribers_, p_.config_key);
      }
    } else if (kind == 0 && subscribers_ > 0) {
      --subscribers_;
      if (subscribers_ == 0) {
        cancel_join();
        snapshot_out_.clear();
        live_out_.clear();
      }
    }
  }
}

void join_bridge::start_join() {
  joining_ = ++joins_;
  parts_.clear();
  KVS_INFO(label(), "a router subscribed: taking snapshot {} of the rank for it", joining_);
  send(p_.indexer, snapshot_request{joining_});
}

void join_bridge::cancel_join() {
  if (joining_ == 0)
    return;
  send(p_.indexer, snapshot_credit{joining_, true});
  KVS_DEBUG(label(), "snapshot {} cancelled: the router left", joining_);
  joining_ = 0;
  parts_.clear();
}

void join_bridge::on_part(snapshot_part& part) {
  if (part.id != joining_)
    return; // a cancelled join's late part
  for (auto& b : part.batches)
    parts_.push_back(std::move(b));
  if (!part.last) {
    send(p_.indexer, snapshot_credit{part.id, false});
    return;
  }
  finish_join(part.seq);
}

void join_bridge::finish_join(uint64_t seq) {
  const auto id = joining_;
  joining_ = 0;
  if (parts_.empty()) {
    // The rank never published: there is nothing to know before the live
    // stream.
    KVS_INFO(label(), "snapshot {}: the rank has published nothing yet; live from now", id);
    pump();
    return;
  }
  auto batches = merge_into(std::move(parts_), seq >= SIZE_MAX - 1 ? SIZE_MAX : seq + 1);
  parts_.clear();
  uint64_t next = seq - (batches.size() - 1);
  uint64_t blocks = 0;
  for (auto& b : batches) {
    for (auto& e : b.events)
      if (auto* st = std::get_if<block_stored>(&e))
        blocks += st->block_hashes.size();
    auto payload = std::make_shared<std::string>();
    encode_event_batch(b, p_.dialect, *payload);
    snapshot_out_.push_back(encoded_batch{next++, std::move(payload)});
  }
  snapshot_blocks_ += blocks;
  // Held live batches the snapshot already holds.
  while (!live_out_.empty() && live_out_.front().seq <= seq)
    live_out_.pop_front();
  KVS_INFO(label(), "snapshot {} at seq {}: {} blocks in {} batches (seq {}..{}), then live",
           id, seq, blocks, batches.size(), seq - (batches.size() - 1), seq);
  pump();
}

bool join_bridge::try_send(const encoded_batch& b) {
  auto first = pub_.send(zmq::buffer(p_.topic),
                         zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  if (!first) {
    take_pending_commands(pub_);
    first = pub_.send(zmq::buffer(p_.topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  }
  if (!first)
    return false;
  // The HWM counts whole messages: once the first part is in, the rest go.
  pub_.send(be64_frame(b.seq), zmq::send_flags::sndmore);
  pub_.send(shared_frame(b.payload), zmq::send_flags::none);
  return true;
}

void join_bridge::pump() {
  blocked_ = false;
  try {
    while (!snapshot_out_.empty()) {
      if (!try_send(snapshot_out_.front())) {
        blocked_ = true;
        return;
      }
      snapshot_out_.pop_front();
      ++snapshot_batches_;
    }
    if (joining_ != 0)
      return; // live waits behind the snapshot being taken
    while (!live_out_.empty()) {
      if (!try_send(live_out_.front())) {
        blocked_ = true;
        return;
      }
      live_out_.pop_front();
      ++sent_;
    }
  } catch (const zmq::error_t& e) {
    KVS_ERROR(label(), "send failed: {}", e.what());
  }
}

std::chrono::milliseconds join_bridge::poll_timeout() {
  return blocked_ ? retry_after : poll_until_ready;
}

void join_bridge::after_poll() {
  if (blocked_)
    pump();
}

stats_snapshot join_bridge::snapshot() {
  stats_snapshot s;
  s.labels = {{"dp_rank", std::to_string(p_.rank)}};
  s.gauge("subscribers", "kvsidecar_events_join_subscribers", subscribers_)
    .counter("joins", "kvsidecar_events_joins_total", joins_)
    .counter("snapshot_batches", "kvsidecar_events_join_snapshot_batches_total",
             snapshot_batches_)
    .counter("snapshot_blocks", "kvsidecar_events_join_snapshot_blocks_total", snapshot_blocks_)
    .counter("sent", "kvsidecar_events_join_sent_total", sent_)
    .counter("dropped", "kvsidecar_events_join_dropped_total", dropped_)
    .log_only("held", static_cast<double>(live_out_.size() + snapshot_out_.size()));
  return s;
}

void join_bridge::close_sockets() {
  close_with_linger(pub_, p_.linger);
}

} // namespace kvs
