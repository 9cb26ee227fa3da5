#include "actors/ingest_bridge.hpp"

#include "actors/zmq_frames.hpp"
#include "app/log.hpp"
#include "messages/kv_event_codec.hpp"

#include <caf/send.hpp>

namespace kvs {

namespace {
constexpr uint64_t end_seq = ~uint64_t{0};
// Live batches held back while a gap is being filled, at most.
constexpr size_t max_held_back = 10000;
} // namespace

ingest_bridge::ingest_bridge(caf::actor_config& cfg, zmq::context_t& ctx,
                             caf::actor supervisor, std::chrono::nanoseconds stats_interval,
                             ingest_bridge_params params)
  : zmq_bridge(cfg, ctx, "ingest", "dp=" + std::to_string(params.rank), std::move(supervisor),
               stats_interval),
    p_(std::move(params)),
    pending_(p_.publishers.size()) {}

std::optional<std::string> ingest_bridge::open() {
  sub_ = zmq::socket_t{ctx_, zmq::socket_type::sub};
  own(sub_);
  sub_.set(zmq::sockopt::subscribe, "");
  sub_.set(zmq::sockopt::rcvhwm, 0);
  // A batch is a few KiB; refuse absurd frames before they are buffered.
  sub_.set(zmq::sockopt::maxmsgsize, int64_t{64} << 20);
  auto r = open_endpoint(sub_, p_.endpoint, false);
  if (!r.ok)
    return "events.ingest_endpoint = \"" + p_.endpoint + "\": " + r.endpoint;
  KVS_INFO(label(), "{} engine events at {} (events.ingest_endpoint)",
           r.bound ? "listening for" : "subscribed to", r.endpoint);
  watch(sub_, ZMQ_POLLIN);
  if (!p_.replay_endpoint.empty()) {
    dealer_ = zmq::socket_t{ctx_, zmq::socket_type::dealer};
    own(dealer_);
    dealer_.set(zmq::sockopt::rcvhwm, 0);
    auto d = open_endpoint(dealer_, p_.replay_endpoint, false);
    if (!d.ok)
      return "events.ingest_replay_endpoint = \"" + p_.replay_endpoint + "\": " + d.endpoint;
    have_dealer_ = true;
    KVS_INFO(label(), "gaps are filled from the engine's replay at {}", d.endpoint);
    watch(dealer_, ZMQ_POLLIN);
  }
  return std::nullopt;
}

caf::behavior ingest_bridge::handlers() {
  // Only the built-in messages (stop, stats): gap deadlines are poll timeouts.
  return {};
}

void ingest_bridge::note(std::set<std::string>& seen, const std::string& kind,
                         const std::string& detail) {
  if (seen.insert(kind).second)
    KVS_WARN(label(), "{}: {} (logged once per kind; see stats for counts)", kind, detail);
}

bool ingest_bridge::decode(const zmq::message_t& payload, kv_event_batch& out) {
  auto res = decode_event_batch(static_cast<const uint8_t*>(payload.data()), payload.size());
  if (auto* err = std::get_if<wire_error>(&res)) {
    ++bad_payloads_;
    note(seen_payload_errors_, "dropped payload " + err->kind, err->detail);
    return false;
  }
  auto& ok = std::get<event_decode_result>(res);
  for (auto& e : ok.dropped) {
    ++dropped_events_;
    note(seen_event_errors_, "dropped event " + e.kind, e.detail);
  }
  out = std::move(ok.batch);
  return true;
}

void ingest_bridge::publish(kv_event_batch batch) {
  auto n = static_cast<int64_t>(p_.publishers.size());
  auto r = batch.dp_rank && *batch.dp_rank >= 0 && *batch.dp_rank < n ? *batch.dp_rank : p_.rank;
  // A rank we do not publish is replaced by the stream's own.
  batch.dp_rank = r;
  if (!p_.queues[r]->admit()) {
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
      send(p_.publishers[r], publish_atom_v, std::move(pending_[r]));
      pending_[r] = kv_event_batches{};
    }
}

void ingest_bridge::on_socket(size_t index, short revents) {
  if (!(revents & ZMQ_POLLIN))
    return;
  if (index == 0)
    on_live_message();
  else
    on_replay_message();
}

void ingest_bridge::on_live_message() {
  // Bounded burst per wake-up so the mailbox (stop requests) stays responsive.
  for (int burst = 0; burst < 1024; ++burst) {
    std::vector<zmq::message_t> frames;
    if (!recv_message(sub_, frames))
      return;
    ++received_;
    if (frames.size() != 3 || frames[1].size() != 8) {
      ++bad_payloads_;
      note(seen_payload_errors_, "dropped message frames",
           "expected [topic, seq (8 bytes), payload], got " + std::to_string(frames.size())
             + " frames" + (frames.size() >= 2 ? ", seq frame of " + std::to_string(frames[1].size()) + " bytes" : ""));
      continue;
    }
    kv_event_batch batch;
    if (!decode(frames[2], batch)) {
      // Still advances the engine's seq: it was sent, it just was not a batch.
      if (!gap_ && (!expected_ || get_be64(frames[1].data()) >= *expected_))
        expected_ = get_be64(frames[1].data()) + 1;
      continue;
    }
    accept(get_be64(frames[1].data()), std::move(batch));
  }
}

void ingest_bridge::accept(uint64_t seq, kv_event_batch batch) {
  if (gap_) {
    gap_->live.emplace_back(seq, std::move(batch));
    if (gap_->live.size() >= max_held_back)
      finish_gap();
    return;
  }
  if (!expected_ && seq > 0 && have_dealer_) {
    // Started after the engine: what it published before we subscribed is
    // fetched from its replay first, so routers learn the blocks it already
    // holds (as far back as the engine's buffer reaches).
    KVS_INFO(label(), "engine already at seq {}: fetching its earlier batches from its replay",
             seq);
    start_fill(0, seq, std::move(batch), true);
    return;
  }
  if (!expected_ || seq == *expected_) {
    expected_ = seq + 1;
    publish(std::move(batch));
    return;
  }
  if (seq < *expected_) {
    ++engine_restarts_;
    KVS_WARN(label(), "engine seq went back from {} to {} (engine restarted?): following it",
             *expected_ - 1, seq);
    expected_ = seq + 1;
    publish(std::move(batch));
    return;
  }
  ++gaps_;
  auto missing = seq - *expected_;
  if (!have_dealer_) {
    lost_ += missing;
    KVS_WARN(label(), "gap in engine seq: {} batches missing ({}..{}); no "
                      "events.ingest_replay_endpoint to fetch them", missing, *expected_, seq - 1);
    expected_ = seq + 1;
    publish(std::move(batch));
    return;
  }
  KVS_WARN(label(), "gap in engine seq: {} batches missing ({}..{}), fetching them from the "
                    "engine's replay", missing, *expected_, seq - 1);
  start_fill(*expected_, seq, std::move(batch), false);
}

void ingest_bridge::start_fill(uint64_t from, uint64_t to, kv_event_batch live,
                               bool catch_up) {
  gap_fill g;
  g.from = from;
  g.to = to;
  g.catch_up = catch_up;
  g.deadline = clock::now() + p_.gap_timeout;
  g.live.emplace_back(to, std::move(live));
  gap_ = std::move(g);
  dealer_.send(zmq::message_t{}, zmq::send_flags::sndmore);
  dealer_.send(be64_frame(from), zmq::send_flags::none);
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
    auto seq = get_be64(frames[seq_at].data());
    if (!gap_)
      continue; // a late answer to a gap already given up on
    if (seq == end_seq) {
      finish_gap();
      continue;
    }
    if (seq < gap_->from || seq >= gap_->to || gap_->fetched.count(seq))
      continue;
    kv_event_batch batch;
    if (decode(frames[seq_at + 1], batch))
      gap_->fetched.emplace(seq, std::move(batch));
    if (gap_->fetched.size() == gap_->to - gap_->from)
      finish_gap();
  }
}

void ingest_bridge::finish_gap() {
  auto g = std::move(*gap_);
  gap_.reset();
  uint64_t lost = (g.to - g.from) - g.fetched.size();
  (g.catch_up ? caught_up_ : refilled_) += g.fetched.size();
  if (g.catch_up) {
    // Older batches than the engine kept are history, not a loss.
    KVS_INFO(label(), "caught up: {} earlier engine batches published", g.fetched.size());
  } else if (lost > 0) {
    lost_ += lost;
    KVS_WARN(label(), "gap {}..{}: {} batches recovered, {} lost", g.from, g.to - 1,
             g.fetched.size(), lost);
  } else {
    KVS_INFO(label(), "gap {}..{}: all {} batches recovered", g.from, g.to - 1, g.fetched.size());
  }
  for (auto& [seq, b] : g.fetched)
    publish(std::move(b));
  expected_ = g.to;
  for (auto& [seq, b] : g.live)
    accept(seq, std::move(b));
}

std::chrono::milliseconds ingest_bridge::poll_timeout() {
  if (!gap_)
    return std::chrono::milliseconds{-1};
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(gap_->deadline - clock::now());
  return std::max(left + std::chrono::milliseconds{1}, std::chrono::milliseconds{0});
}

void ingest_bridge::after_poll() {
  if (gap_ && clock::now() >= gap_->deadline)
    finish_gap();
  flush();
}

void ingest_bridge::drain() {
  // Stop accepting: whatever is held back for a gap is published now.
  if (gap_)
    finish_gap();
  flush();
}

stats_snapshot ingest_bridge::snapshot() {
  stats_snapshot s;
  s.labels = {{"dp_rank", std::to_string(p_.rank)}};
  s.counter("received", "kvsidecar_events_received_total", received_)
    .counter("published", "kvsidecar_events_accepted_total", published_)
    .counter("dropped_events", "kvsidecar_events_invalid_events_total", dropped_events_)
    .counter("bad_payloads", "kvsidecar_events_dropped_total", bad_payloads_, "reason",
             "bad_payload")
    .counter("dropped_queue_full", "kvsidecar_events_dropped_total", dropped_queue_full_,
             "reason", "queue_full")
    .counter("gaps", "kvsidecar_events_gaps_total", gaps_)
    .counter("refilled", "kvsidecar_events_refilled_total", refilled_)
    .counter("lost", "kvsidecar_events_lost_total", lost_)
    .counter("caught_up", "kvsidecar_events_caught_up_total", caught_up_)
    .counter("engine_restarts", "kvsidecar_events_engine_restarts_total", engine_restarts_);
  return s;
}

} // namespace kvs
