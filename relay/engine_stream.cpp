#include "relay/engine_stream.hpp"

#include "relay/fence.hpp"

#include <fmt/format.h>

namespace kvs {

void engine_stream::log(stream_actions& out, stream_action::kind k, std::string text) {
  stream_action a;
  a.what = k;
  a.text = std::move(text);
  out.push_back(std::move(a));
}

void engine_stream::publish(kv_event_batch b, stream_actions& out) {
  stream_action a;
  a.what = stream_action::kind::publish;
  a.batch = std::move(b);
  out.push_back(std::move(a));
}

void engine_stream::restart(const std::string& why, clock::time_point now,
                            stream_actions& out) {
  expected_.reset();
  if (last_fence_ && now - *last_fence_ < p_.restart_min_interval && !reconnected_) {
    ++c_.restarts_coalesced;
    fence_owed_ = true;
    if (c_.restarts_coalesced <= 10 || c_.restarts_coalesced % 1000 == 0)
      log(out, stream_action::kind::warn,
          fmt::format("{}: a new engine stream within events.restart_min_interval of the last "
                      "fence on dp={}: one AllBlocksCleared follows when the interval has "
                      "passed (restarts_coalesced={})",
                      why, p_.rank, c_.restarts_coalesced));
    return;
  }
  if (c_.engine_restarts < 10 || (c_.engine_restarts + 1) % 1000 == 0)
    log(out, stream_action::kind::warn,
        fmt::format("{}: a new engine stream; published AllBlocksCleared on dp={} first so "
                    "routers drop the old stream's blocks (engine_restarts={})",
                    why, p_.rank, c_.engine_restarts + 1));
  publish_fence(now, out);
}

void engine_stream::publish_fence(clock::time_point now, stream_actions& out) {
  ++c_.engine_restarts;
  last_fence_ = now;
  fence_owed_ = false;
  reconnected_ = false;
  stream_action a;
  a.what = stream_action::kind::publish;
  a.batch = fence_batch(p_.rank);
  a.fence = true;
  out.push_back(std::move(a));
}

void engine_stream::pay_owed_fence(clock::time_point now, stream_actions& out) {
  if (!fence_owed_ || now - *last_fence_ < p_.restart_min_interval)
    return;
  log(out, stream_action::kind::warn,
      fmt::format("published the AllBlocksCleared owed on dp={} for {} new engine streams "
                  "coalesced so far: routers drop what they announced",
                  p_.rank, c_.restarts_coalesced));
  publish_fence(now, out);
}

std::optional<engine_stream::clock::time_point> engine_stream::deadline() const {
  std::optional<clock::time_point> d;
  if (fill_)
    d = fill_->deadline;
  if (fence_owed_) {
    auto due = *last_fence_ + p_.restart_min_interval;
    if (!d || due < *d)
      d = due;
  }
  return d;
}

void engine_stream::on_undecodable_live(uint64_t seq) {
  if (!fill_ && (!expected_ || seq >= *expected_))
    expected_ = seq + 1;
}

void engine_stream::on_live(uint64_t seq, kv_event_batch batch, clock::time_point now,
                            stream_actions& out) {
  last_live_seq_ = seq;
  accept(seq, std::move(batch), now, out);
}

void engine_stream::accept(uint64_t seq, kv_event_batch batch, clock::time_point now,
                           stream_actions& out) {
  if (fill_) {
    fill_->live.emplace_back(seq, std::move(batch));
    if (fill_->live.size() >= max_held_back)
      finish(now, out);
    return;
  }
  pay_owed_fence(now, out);
  if (expected_ && seq < *expected_) {
    restart(fmt::format("engine seq went back from {} to {} (engine restarted)", *expected_ - 1,
                        seq),
            now, out);
  } else if (expected_ && seq - *expected_ > p_.jump_limit) {
    // Nothing could fill this (and a forged seq must not count 2^64 losses
    // as lost): one skipped batch, however far it jumped.
    ++c_.skipped;
    restart(fmt::format("engine seq jumped from {} to {}, more than events.buffer_steps ({}) "
                        "ahead",
                        *expected_ - 1, seq, p_.jump_limit),
            now, out);
  }
  if (!expected_ && seq > 0 && p_.have_replay) {
    // Started after the engine (or the engine restarted and we missed its
    // first batches): what it published before is fetched from its replay
    // first, so routers learn the blocks it already holds (as far back as
    // the engine's buffer reaches).
    log(out, stream_action::kind::info,
        fmt::format("engine already at seq {}: fetching its earlier batches from its replay", seq));
    start_fill(0, seq, std::move(batch), fill_kind::catch_up, now, out);
    return;
  }
  const bool join = std::exchange(joining_, false);
  if (!expected_ || seq == *expected_) {
    expected_ = seq + 1;
    publish(std::move(batch), out);
    return;
  }
  const uint64_t missing = seq - *expected_;
  if (join && p_.have_replay) {
    log(out, stream_action::kind::info,
        fmt::format("{} batches ({}..{}) went out after the catch-up, before our subscription "
                    "reached the engine: fetching them from the engine's replay",
                    missing, *expected_, seq - 1));
    start_fill(*expected_, seq, std::move(batch), fill_kind::join, now, out);
    return;
  }
  ++c_.gaps;
  if (!p_.have_replay) {
    c_.lost += missing;
    log(out, stream_action::kind::warn,
        fmt::format("gap in engine seq: {} batches missing ({}..{}); no "
                    "events.ingest_replay_endpoint to fetch them",
                    missing, *expected_, seq - 1));
    expected_ = seq + 1;
    publish(std::move(batch), out);
    return;
  }
  log(out, stream_action::kind::warn,
      fmt::format("gap in engine seq: {} batches missing ({}..{}), fetching them from the "
                  "engine's replay",
                  missing, *expected_, seq - 1));
  start_fill(*expected_, seq, std::move(batch), fill_kind::gap, now, out);
}

void engine_stream::start_fill(uint64_t from, uint64_t to, std::optional<kv_event_batch> live,
                               fill_kind kind, clock::time_point now, stream_actions& out) {
  fill f;
  f.from = from;
  f.to = to;
  f.kind = kind;
  f.deadline = now + p_.gap_timeout;
  if (live)
    f.live.emplace_back(to, std::move(*live));
  fill_ = std::move(f);
  stream_action a;
  a.what = stream_action::kind::fetch;
  a.from = from;
  out.push_back(std::move(a));
}

void engine_stream::on_connected(clock::time_point now, stream_actions& out) {
  bool quiet = false;
  if (was_connected_) {
    ++c_.reconnects;
    // A flapping engine must not flood the log: the first ten, then 1 in 1000.
    quiet = c_.reconnects > 10 && c_.reconnects % 1000 != 0;
    if (!quiet)
      log(out, stream_action::kind::info,
          fmt::format("engine connection established again (reconnect #{})", c_.reconnects));
  }
  was_connected_ = true;
  reconnected_ = true;
  // Eager catch-up: what the engine published while we were not connected
  // (at start: everything its replay keeps) is asked for now, not when the
  // engine next publishes.
  if (!p_.have_replay || fill_)
    return;
  // After a reconnect the replay is asked from our last live batch: if it
  // still holds that batch byte for byte, the stream goes on; if not, the
  // engine restarted meanwhile (see finish).
  const bool verify = expected_ && last_live_seq_ && *last_live_seq_ < *expected_;
  const uint64_t from = verify ? *last_live_seq_ : expected_.value_or(0);
  if (!quiet)
    log(out, stream_action::kind::info,
        fmt::format("asking the engine's replay for its batches from seq {}", from));
  start_fill(from, open_end, std::nullopt, fill_kind::catch_up, now, out);
  joining_ = true;
  if (verify)
    fill_->verify_seq = from;
}

void engine_stream::replay_answered() {
  if (fill_)
    fill_->answered = true;
}

void engine_stream::replay_verified(bool same) {
  if (fill_)
    fill_->verified = same;
}

bool engine_stream::wants(uint64_t seq) const {
  return fill_ && seq >= fill_->from && seq < fill_->to && !fill_->fetched.count(seq)
         && fill_->fetched.size() < max_fetched;
}

void engine_stream::replay_batch(uint64_t seq, kv_event_batch batch, clock::time_point now,
                                 stream_actions& out) {
  if (!wants(seq))
    return;
  fill_->fetched.emplace(seq, std::move(batch));
  if (fill_->to != open_end && fill_->fetched.size() == fill_->to - fill_->from)
    finish(now, out);
}

void engine_stream::replay_end(clock::time_point now, stream_actions& out) {
  if (fill_)
    finish(now, out);
}

void engine_stream::on_tick(clock::time_point now, stream_actions& out) {
  if (fill_ && now >= fill_->deadline)
    finish(now, out);
  if (!fill_)
    pay_owed_fence(now, out);
}

void engine_stream::drain(clock::time_point now, stream_actions& out) {
  while (fill_)
    finish(now, out);
}

void engine_stream::finish(clock::time_point now, stream_actions& out) {
  auto f = std::move(*fill_);
  fill_.reset();
  if (f.verify_seq && f.answered && !f.verified) {
    // The engine's replay no longer has our last batch as we saw it: a new
    // stream. Fence it, then fetch that stream from its start.
    restart(fmt::format("after a reconnect the engine's replay no longer holds seq {} as "
                        "published (engine restarted)",
                        *f.verify_seq),
            now, out);
    start_fill(0, open_end, std::nullopt, fill_kind::catch_up, now, out);
    fill_->live = std::move(f.live);
    return;
  }
  if (f.verified) // the same stream: only what we have not published yet
    f.fetched.erase(f.fetched.begin(), f.fetched.lower_bound(*expected_));
  const bool open = f.to == open_end;
  const uint64_t lost = open ? 0 : (f.to - f.from) - f.fetched.size();
  (f.kind == fill_kind::gap ? c_.refilled : c_.caught_up) += f.fetched.size();
  if (f.kind == fill_kind::catch_up) {
    // Older batches than the engine kept are history, not a loss.
    if (!f.fetched.empty() || c_.reconnects <= 10)
      log(out, stream_action::kind::info,
          fmt::format("caught up: {} earlier engine batches published", f.fetched.size()));
  } else if (lost > 0) {
    c_.lost += lost;
    log(out, stream_action::kind::warn,
        fmt::format("gap {}..{}: {} batches recovered, {} lost", f.from, f.to - 1,
                    f.fetched.size(), lost));
  } else {
    log(out, stream_action::kind::info,
        fmt::format("gap {}..{}: all {} batches recovered", f.from, f.to - 1, f.fetched.size()));
  }
  for (auto& [seq, b] : f.fetched)
    publish(std::move(b), out);
  if (!open)
    expected_ = f.to;
  else if (!f.fetched.empty())
    expected_ = f.fetched.rbegin()->first + 1;
  for (auto& [seq, b] : f.live) {
    // Live batches of an open-ended catch-up may also have come through the
    // replay: those are already published.
    if (open && expected_ && seq < *expected_ && (f.fetched.count(seq) || f.verified))
      continue;
    accept(seq, std::move(b), now, out);
  }
}

} // namespace kvs
