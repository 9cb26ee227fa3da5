#include "actors/relay/ingest_bridge.hpp"

#include "actors/zmq_frames.hpp"
#include "config/config.hpp"
#include "log/log.hpp"
#include "events_wire/kv_event_codec.hpp"

#include <caf/send.hpp>

#include <cstring>

namespace kvs {

namespace {
// Re-dial back-off after a protocol error: the first re-dial at once, then
// this, doubled per failure up to redial_max_doublings times (3.2 s): quick
// for a one-off oversized frame, gentle on an engine that keeps refusing.
constexpr std::chrono::milliseconds redial_first_backoff{100};
constexpr int redial_max_doublings = 5;
} // namespace

ingest_bridge::ingest_bridge(caf::actor_config& cfg, zmq::context_t& ctx,
                             caf::actor supervisor, std::chrono::nanoseconds stats_interval,
                             ingest_bridge_params params)
  : zmq_bridge(cfg, ctx, "ingest", "dp=" + std::to_string(params.rank), std::move(supervisor),
               stats_interval),
    p_(std::move(params)),
    stream_({p_.rank, !p_.replay_endpoint.empty(), p_.jump_limit, p_.gap_timeout,
             p_.restart_min_interval}),
    pending_(p_.publishers.size()) {}

std::optional<std::string> ingest_bridge::open() {
  sub_ = zmq::socket_t{ctx_, zmq::socket_type::sub};
  own(sub_);
  sub_.set(zmq::sockopt::subscribe, "");
  // Bounded: past it the SUB stops reading and the engine's PUB drops at its
  // own HWM (never blocks), which shows here as a gap in its seq.
  sub_.set(zmq::sockopt::rcvhwm, static_cast<int>(p_.hwm));
  // A batch is a few KiB; refuse absurd frames before they are buffered.
  sub_.set(zmq::sockopt::maxmsgsize, p_.max_message_size);
  // Bound (engines connect to us): as many engine connections as
  // events.max_connections; this bridge reads the socket's one monitor, so
  // it counts them for the gate itself.
  if (endpoint_binds(p_.endpoint))
    gate_ = gate_connections(sub_, "events.ingest_endpoint", "events.max_connections",
                             p_.max_connections);
  // The monitor PAIR is connected before the SUB dials, so no event is missed.
  auto monitor_ep = "inproc://kvs-ingest-monitor-" + std::to_string(id());
  if (zmq_socket_monitor(sub_.handle(), monitor_ep.c_str(),
                         ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED
                           | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL
                           | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
                           | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
      != 0)
    return std::string{"socket monitor of the ingest SUB: "} + zmq_strerror(zmq_errno());
  monitor_ = zmq::socket_t{ctx_, zmq::socket_type::pair};
  own(monitor_);
  monitor_.connect(monitor_ep);
  auto r = open_endpoint(sub_, p_.endpoint, false);
  if (!r.ok)
    return "events.ingest_endpoint = \"" + p_.endpoint + "\": " + r.endpoint;
  sub_binds_ = r.bound;
  KVS_INFO(label(), "{} engine events at {} (events.ingest_endpoint)",
           r.bound ? "listening for" : "subscribed to", r.endpoint);
  watch(sub_, ZMQ_POLLIN);
  monitor_index_ = watch(monitor_, ZMQ_POLLIN);
  if (!p_.replay_endpoint.empty()) {
    dealer_ = zmq::socket_t{ctx_, zmq::socket_type::dealer};
    own(dealer_);
    dealer_.set(zmq::sockopt::rcvhwm, static_cast<int>(p_.hwm));
    auto d = open_endpoint(dealer_, p_.replay_endpoint, false);
    if (!d.ok)
      return "events.ingest_replay_endpoint = \"" + p_.replay_endpoint + "\": " + d.endpoint;
    KVS_INFO(label(), "gaps are filled from the engine's replay at {}", d.endpoint);
    dealer_index_ = watch(dealer_, ZMQ_POLLIN);
  }
  return std::nullopt;
}

caf::behavior ingest_bridge::handlers() {
  // Only the built-ins (stop, stats, metrics): gap and re-dial deadlines
  // are poll timeouts.
  return typed_handlers<ingest_bridge_actor>();
}

void ingest_bridge::note(std::set<std::string>& seen, const std::string& kind,
                         const std::string& detail) {
  if (seen.insert(kind).second)
    KVS_WARN(label(), "{}: {} (logged once per kind; see stats for counts)", kind, detail);
}

bool ingest_bridge::decode(const zmq::message_t& payload, kv_event_batch& out) {
  const auto* data = static_cast<const uint8_t*>(payload.data());
  // Pass-through: bytes that decode + encode would reproduce exactly are
  // forwarded as they are (the publisher rewrites only dp_rank).
  // The check also records each event for the rank's indexer, which then
  // applies BlockStored events without walking the bytes again: worth it
  // from a few events on (an event whose tail is the one before it's); a
  // smaller batch is decoded by the indexer.
  if (auto c = check_canonical_event_batch(data, payload.size(), p_.dialect, &recorded_)) {
    out = kv_event_batch{};
    out.ts = c->ts;
    out.dp_rank = c->dp_rank;
    out.wire = canonical_wire{
      p_.pool ? p_.pool->copy(payload.data(), payload.size())
              : std::make_shared<const std::string>(static_cast<const char*>(payload.data()),
                                                    payload.size()),
      p_.dialect, *c, nullptr};
    if (c->events >= min_recorded_events && recorded_.events.size() == c->events)
      out.wire->events = std::make_shared<const canonical_record>(recorded_);
    return true;
  }
  auto res = decode_event_batch(data, payload.size());
  if (!res) {
    ++bad_payloads_;
    note(seen_payload_errors_, "dropped payload " + res.error_value().kind, res.error_value().detail);
    return false;
  }
  auto& ok = *res;
  for (auto& e : ok.dropped) {
    ++dropped_events_;
    note(seen_event_errors_, "dropped event " + e.kind, e.detail);
  }
  out = std::move(ok.batch);
  return true;
}

void ingest_bridge::publish(kv_event_batch batch, bool fence) {
  auto n = static_cast<int64_t>(p_.publishers.size());
  auto r = batch.dp_rank && *batch.dp_rank >= 0 && *batch.dp_rank < n ? *batch.dp_rank : p_.rank;
  // A rank we do not publish is replaced by the stream's own.
  batch.dp_rank = r;
  // A fence is never dropped: routers would keep a dead stream's blocks.
  if (fence)
    p_.queues[r]->admit_always();
  else if (!p_.queues[r]->admit()) {
    if (dropped_queue_full_++ == 0)
      KVS_WARN(label(), "publisher queue of dp={} is full ({} batches): dropping new batches "
                        "instead of blocking the engine", r, p_.queues[r]->max_size);
    return;
  }
  ++published_;
  pending_[static_cast<size_t>(r)].items.push_back(std::move(batch));
}

void ingest_bridge::flush() {
  // Everything one wake-up accepted goes to each publisher in one message.
  for (size_t r = 0; r < pending_.size(); ++r)
    if (!pending_[r].items.empty()) {
      const size_t n = pending_[r].items.size();
      send(p_.publishers[r], publish_atom_v, std::move(pending_[r]));
      // Room for as many as this wake-up had (up to a bound): the next
      // wake-up's batches then go in without reallocations.
      pending_[r] = kv_event_batches{};
      pending_[r].items.reserve(std::min(n, max_reserved_batches));
    }
}

void ingest_bridge::on_socket(size_t index, short revents) {
  if (!(revents & ZMQ_POLLIN))
    return;
  if (index == 0)
    on_live_message();
  else if (index == monitor_index_)
    on_monitor_event();
  else
    on_replay_message();
}

void ingest_bridge::on_monitor_event() {
  drain_monitor_events(monitor_, [this](uint16_t event, uint32_t value, const std::string& endpoint) {
    if (gate_)
      gate_->on_monitor_event(event, value);
    if (event == ZMQ_EVENT_ACCEPTED)
      return;
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      engine_connected();
      return;
    }
    const char* kind = event == ZMQ_EVENT_DISCONNECTED ? "engine connection lost"
                       : event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
                         ? "handshake with the engine failed (protocol)"
                         : "handshake with the engine failed";
    ++disconnects_;
    if (seen_disconnects_.insert(kind).second)
      KVS_WARN(label(), "{} at {} (a frame above events.ingest_max_message_size = {} bytes "
                        "also ends it): {} (logged once per kind; see stats for counts)",
               kind, endpoint, p_.max_message_size,
               sub_binds_ ? "waiting for the engine to connect again" : "re-dialling");
    // libzmq re-dials a lost connection by itself, but not one it closed for
    // a protocol error (e.g. an oversized frame): the SUB would stay deaf.
    // Re-dialling ourselves covers both; a bound SUB waits for the engine.
    // Back-off while it keeps failing: 0, 100 ms, 200 ms, … 3.2 s.
    if (!sub_binds_ && !redial_at_) {
      auto backoff = failed_dials_ == 0
                       ? std::chrono::milliseconds{0}
                       : redial_first_backoff * (1 << std::min(failed_dials_ - 1, redial_max_doublings));
      redial_at_ = clock::now() + backoff;
      ++failed_dials_;
    }
  });
}

void ingest_bridge::redial() {
  redial_at_.reset();
  try {
    sub_.disconnect(p_.endpoint);
  } catch (const zmq::error_t&) {
    // Already gone (a session libzmq terminated itself): just dial again.
  }
  try {
    sub_.connect(p_.endpoint);
  } catch (const zmq::error_t& e) {
    KVS_ERROR(label(), "re-dialling the engine at {} failed: {}", p_.endpoint, e.what());
  }
}

void ingest_bridge::run(stream_actions& acts) {
  for (auto& a : acts) {
    switch (a.what) {
      case stream_action::kind::publish:
        publish(std::move(a.batch), a.fence);
        break;
      case stream_action::kind::fetch:
        dealer_.send(zmq::message_t{}, zmq::send_flags::sndmore);
        dealer_.send(be64_frame(a.from), zmq::send_flags::none);
        break;
      case stream_action::kind::info:
        KVS_INFO(label(), "{}", a.text);
        break;
      case stream_action::kind::warn:
        KVS_WARN(label(), "{}", a.text);
        break;
    }
  }
  acts.clear();
}

void ingest_bridge::engine_connected() {
  stream_.on_connected(clock::now(), acts_);
  run(acts_);
}

void ingest_bridge::on_live_message() {
  // Bounded burst per wake-up so the mailbox (scrapes, stop requests) stays
  // responsive. One vector for every message: three allocations per batch less.
  auto& frames = live_frames_;
  for (int burst = 0; burst < 1024; ++burst) {
    if (mailbox_waiting(burst) || !recv_message(sub_, frames))
      return;
    ++received_;
    failed_dials_ = 0;
    if (frames.size() != 3 || frames[1].size() != 8) {
      ++bad_payloads_;
      note(seen_payload_errors_, "dropped message frames",
           "expected [topic, seq (8 bytes), payload], got " + std::to_string(frames.size())
             + " frames" + (frames.size() >= 2 ? ", seq frame of " + std::to_string(frames[1].size()) + " bytes" : ""));
      continue;
    }
    const uint64_t seq = get_be64(frames[1].data());
    kv_event_batch batch;
    if (!decode(frames[2], batch)) {
      // Still advances the engine's seq: it was sent, it just was not a batch.
      stream_.on_undecodable_live(seq);
      continue;
    }
    // Kept (moved, not copied) to recognise this stream after a reconnect.
    last_live_payload_ = std::move(frames[2]);
    stream_.on_live(seq, std::move(batch), clock::now(), acts_);
    run(acts_);
  }
}

void ingest_bridge::on_replay_message() {
  for (;;) {
    std::vector<zmq::message_t> frames;
    if (!recv_message(dealer_, frames))
      return;
    // vLLM >= 0.26: ["", topic, seq, payload]; tokenspeed: ["", seq, payload].
    size_t seq_at = frames.size() == 4 ? 2 : 1;
    if ((frames.size() != 3 && frames.size() != 4) || frames[seq_at].size() != 8) {
      note(seen_payload_errors_, "bad engine replay reply",
           "expected [\"\", (topic,) seq, payload], got " + std::to_string(frames.size()) + " frames");
      continue;
    }
    const uint64_t seq = get_be64(frames[seq_at].data());
    if (!stream_.filling())
      continue; // a late answer to a fill already given up on
    stream_.replay_answered();
    if (auto v = stream_.verify_seq(); v && seq == *v) {
      const auto& f = frames[seq_at + 1];
      stream_.replay_verified(f.size() == last_live_payload_.size()
                              && std::memcmp(f.data(), last_live_payload_.data(), f.size()) == 0);
      continue; // already published
    }
    if (seq == engine_stream::end_seq) {
      stream_.replay_end(clock::now(), acts_);
      run(acts_);
      continue;
    }
    if (!stream_.wants(seq))
      continue;
    kv_event_batch batch;
    if (decode(frames[seq_at + 1], batch)) {
      stream_.replay_batch(seq, std::move(batch), clock::now(), acts_);
      run(acts_);
    }
  }
}

std::chrono::milliseconds ingest_bridge::poll_timeout() {
  std::optional<clock::time_point> next = redial_at_;
  if (auto d = stream_.deadline(); d && (!next || *d < *next))
    next = *d;
  if (!next)
    return poll_until_ready;
  // Rounded up: waking before the deadline would only poll again.
  return std::max(std::chrono::ceil<std::chrono::milliseconds>(*next - clock::now()), poll_now);
}

void ingest_bridge::after_poll() {
  auto now = clock::now();
  stream_.on_tick(now, acts_);
  run(acts_);
  if (redial_at_ && now >= *redial_at_)
    redial();
  flush();
}

void ingest_bridge::drain() {
  // Stop accepting: whatever is held back for a gap is published now.
  stream_.drain(clock::now(), acts_);
  run(acts_);
  flush();
}

stats_snapshot ingest_bridge::snapshot() {
  const stream_counters& c = stream_.counters();
  stats_snapshot s;
  s.labels = {{"dp_rank", std::to_string(p_.rank)}};
  s.counter("received", "kvsidecar_events_received_total", received_)
    .counter("published", "kvsidecar_events_accepted_total", published_)
    .counter("dropped_events", "kvsidecar_events_invalid_events_total", dropped_events_)
    .counter("bad_payloads", "kvsidecar_events_dropped_total", bad_payloads_, "reason",
             "bad_payload")
    .counter("dropped_queue_full", "kvsidecar_events_dropped_total", dropped_queue_full_,
             "reason", "queue_full")
    .counter("gaps", "kvsidecar_events_gaps_total", c.gaps)
    .counter("refilled", "kvsidecar_events_refilled_total", c.refilled)
    .counter("lost", "kvsidecar_events_lost_total", c.lost)
    .counter("caught_up", "kvsidecar_events_caught_up_total", c.caught_up)
    .counter("disconnects", "kvsidecar_events_ingest_disconnects_total", disconnects_)
    .counter("reconnects", "kvsidecar_events_ingest_reconnects_total", c.reconnects)
    .counter("engine_restarts", "kvsidecar_events_engine_restarts_total", c.engine_restarts)
    .counter("restarts_coalesced", "kvsidecar_events_engine_restarts_coalesced_total",
             c.restarts_coalesced)
    .counter("fence_skipped", "kvsidecar_events_fence_skipped_total", c.skipped);
  if (p_.pool)
    s.gauge("payload_pool_bytes", "kvsidecar_events_payload_pool_bytes", p_.pool->kept_bytes())
      .counter("payloads_reused", "kvsidecar_events_payloads_reused_total", p_.pool->reused());
  return s;
}

} // namespace kvs
