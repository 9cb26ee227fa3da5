// The ingest's sequence logic (relay/engine_stream.hpp), every path driven
// deterministically: time is a parameter, the engine's replay answers are
// inputs, and what the bridge must do comes back as actions. Batches carry
// their seq in `ts` so the published order can be read back.
#include <doctest/doctest.h>

#include "relay/engine_stream.hpp"

#include <variant>

using namespace kvs;
using namespace std::chrono_literals;

namespace {

using clock_t_ = engine_stream::clock;
const clock_t_::time_point t0{};

kv_event_batch batch(uint64_t seq) {
  kv_event_batch b;
  b.ts = static_cast<double>(seq);
  return b;
}

engine_stream make(bool replay, uint64_t jump_limit = 100) {
  return engine_stream({0, replay, jump_limit, std::chrono::seconds(1)});
}

/// What the actions published, as seqs (-1 for a fence), and the fetches.
struct seen {
  std::vector<int64_t> published;
  std::vector<uint64_t> fetched_from;
  std::vector<std::string> warns, infos;
};

seen read(stream_actions& acts) {
  seen s;
  for (auto& a : acts) {
    switch (a.what) {
      case stream_action::kind::publish:
        if (a.fence) {
          REQUIRE(a.batch.events.size() == 1);
          CHECK(std::holds_alternative<all_blocks_cleared>(a.batch.events[0]));
          s.published.push_back(-1);
        } else {
          s.published.push_back(static_cast<int64_t>(a.batch.ts));
        }
        break;
      case stream_action::kind::fetch: s.fetched_from.push_back(a.from); break;
      case stream_action::kind::warn: s.warns.push_back(a.text); break;
      case stream_action::kind::info: s.infos.push_back(a.text); break;
    }
  }
  acts.clear();
  return s;
}

void live(engine_stream& s, std::initializer_list<uint64_t> seqs, stream_actions& acts,
          clock_t_::time_point now = t0) {
  for (uint64_t q : seqs) s.on_live(q, batch(q), now, acts);
}

bool has(const std::vector<std::string>& lines, const char* needle) {
  for (const auto& l : lines)
    if (l.find(needle) != std::string::npos) return true;
  return false;
}

} // namespace

TEST_CASE("in order: every batch published as it comes") {
  auto s = make(false);
  stream_actions acts;
  live(s, {0, 1, 2}, acts);
  auto r = read(acts);
  CHECK(r.published == std::vector<int64_t>{0, 1, 2});
  CHECK(s.expected() == 3u);
  CHECK(s.counters().gaps == 0);
}

TEST_CASE("gap filled from the replay: published in order before the live batch") {
  auto s = make(true);
  stream_actions acts;
  live(s, {0, 1, 2}, acts);
  read(acts);
  live(s, {6, 7}, acts);  // 7 arrives while the fill runs: held back
  auto r = read(acts);
  CHECK(r.published.empty());
  CHECK(r.fetched_from == std::vector<uint64_t>{3});
  CHECK(has(r.warns, "3 batches missing (3..5)"));
  CHECK(s.filling());
  CHECK(s.wants(4));
  CHECK_FALSE(s.wants(6));  // not part of the gap
  s.replay_answered();
  s.replay_batch(3, batch(3), t0, acts);
  s.replay_batch(5, batch(5), t0, acts);
  CHECK(read(acts).published.empty());
  s.replay_batch(4, batch(4), t0, acts);  // the last one missing ends the fill
  r = read(acts);
  CHECK(r.published == std::vector<int64_t>{3, 4, 5, 6, 7});
  CHECK(has(r.infos, "all 3 batches recovered"));
  CHECK_FALSE(s.filling());
  CHECK(s.counters().gaps == 1);
  CHECK(s.counters().refilled == 3);
  CHECK(s.counters().lost == 0);
  CHECK(s.expected() == 8u);
}

TEST_CASE("gap timed out: what arrived is published, the rest counted lost") {
  auto s = make(true);
  stream_actions acts;
  live(s, {0}, acts);
  live(s, {4}, acts, t0 + 10ms);
  read(acts);
  REQUIRE(s.deadline() == t0 + 10ms + 1s);
  s.replay_batch(2, batch(2), t0, acts);
  s.on_tick(t0 + 500ms, acts);  // before the deadline: nothing
  CHECK(read(acts).published.empty());
  s.on_tick(t0 + 10ms + 1s, acts);
  auto r = read(acts);
  CHECK(r.published == std::vector<int64_t>{2, 4});
  CHECK(has(r.warns, "gap 1..3: 1 batches recovered, 2 lost"));
  CHECK(s.counters().lost == 2);
  CHECK(s.counters().refilled == 1);
  // The replay's end marker ends a fill the same way (nothing else comes).
  live(s, {7}, acts);
  read(acts);
  s.replay_end(t0, acts);
  CHECK(read(acts).published == std::vector<int64_t>{7});
  CHECK(s.counters().lost == 4);
  CHECK(s.counters().gaps == 2);
}

TEST_CASE("gap without a replay endpoint: lost at once, the batch published") {
  auto s = make(false);
  stream_actions acts;
  live(s, {0, 5}, acts);
  auto r = read(acts);
  CHECK(r.published == std::vector<int64_t>{0, 5});
  CHECK(r.fetched_from.empty());
  CHECK(has(r.warns, "no events.ingest_replay_endpoint"));
  CHECK(s.counters().lost == 4);
}

TEST_CASE("catch-up at connect, then the slow joiner's batches are a join, not a gap") {
  auto s = make(true);
  stream_actions acts;
  s.on_connected(t0, acts);
  auto r = read(acts);
  CHECK(r.fetched_from == std::vector<uint64_t>{0});
  CHECK_FALSE(s.verify_seq().has_value());
  for (uint64_t q : {0, 1, 2}) s.replay_batch(q, batch(q), t0, acts);
  CHECK(s.filling());  // open-ended: only the end marker (or the deadline) ends it
  s.replay_end(t0, acts);
  r = read(acts);
  CHECK(r.published == std::vector<int64_t>{0, 1, 2});
  CHECK(has(r.infos, "caught up: 3 earlier engine batches published"));
  // Batches 3 and 4 went out before our subscription reached the engine.
  live(s, {5}, acts);
  r = read(acts);
  CHECK(r.fetched_from == std::vector<uint64_t>{3});
  CHECK(has(r.infos, "went out after the catch-up"));
  s.replay_batch(3, batch(3), t0, acts);
  s.replay_batch(4, batch(4), t0, acts);
  r = read(acts);
  CHECK(r.published == std::vector<int64_t>{3, 4, 5});
  CHECK(s.counters().gaps == 0);
  CHECK(s.counters().caught_up == 5);
  CHECK(s.counters().lost == 0);
  // Only the first live batch after a catch-up can be a join.
  live(s, {8}, acts);
  CHECK(read(acts).fetched_from == std::vector<uint64_t>{6});
  CHECK(s.counters().gaps == 1);
}

TEST_CASE("first batch at seq > 0: the engine's earlier batches are fetched first") {
  auto s = make(true);
  stream_actions acts;
  live(s, {3}, acts);
  auto r = read(acts);
  CHECK(r.fetched_from == std::vector<uint64_t>{0});
  for (uint64_t q : {0, 1, 2}) s.replay_batch(q, batch(q), t0, acts);
  CHECK(read(acts).published == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(s.counters().caught_up == 3);
  CHECK(s.counters().gaps == 0);
}

TEST_CASE("restart by seq regression: the fence first, then the new stream") {
  auto s = make(false);
  stream_actions acts;
  live(s, {0, 1, 2, 3}, acts);
  read(acts);
  live(s, {0, 1}, acts);
  auto r = read(acts);
  CHECK(r.published == std::vector<int64_t>{-1, 0, 1});
  CHECK(has(r.warns, "engine seq went back from 3 to 0"));
  CHECK(s.counters().engine_restarts == 1);
  CHECK(s.counters().lost == 0);
  CHECK(s.counters().skipped == 0);
}

TEST_CASE("restart by a jump past jump_limit: fenced, counted as skipped, not lost") {
  auto s = make(true, 100);
  stream_actions acts;
  live(s, {0, 1}, acts);
  read(acts);
  live(s, {50}, acts);  // within the limit: a gap
  CHECK(read(acts).fetched_from == std::vector<uint64_t>{2});
  s.replay_end(t0, acts);
  read(acts);
  live(s, {1000000}, acts);  // more than any replay could fill
  auto r = read(acts);
  CHECK(r.published.front() == -1);
  CHECK(has(r.warns, "more than events.buffer_steps (100) ahead"));
  CHECK(s.counters().engine_restarts == 1);
  CHECK(s.counters().skipped == 1);  // one batch jumped, however far
  CHECK(s.counters().lost == 48);  // only the real gap's
  // After the fence the new stream starts at seq > 0 with a replay: caught up from 0.
  CHECK(r.fetched_from == std::vector<uint64_t>{0});
}

TEST_CASE("restart seen at reconnect: the replay no longer holds our last batch") {
  auto s = make(true);
  stream_actions acts;
  s.on_connected(t0, acts);  // the first connection: a catch-up from 0
  CHECK(read(acts).fetched_from == std::vector<uint64_t>{0});
  s.replay_end(t0, acts);
  live(s, {0, 1, 2, 3, 4}, acts);
  read(acts);
  s.on_connected(t0, acts);  // again (e.g. after an oversized frame dropped it)
  auto r = read(acts);
  CHECK(has(r.infos, "reconnect #1"));
  CHECK(r.fetched_from == std::vector<uint64_t>{4});
  REQUIRE(s.verify_seq() == 4u);
  s.replay_answered();
  s.replay_verified(false);  // its seq 4 is other bytes: another stream
  s.replay_end(t0, acts);
  r = read(acts);
  CHECK(r.published == std::vector<int64_t>{-1});
  CHECK(has(r.warns, "no longer holds seq 4 as published"));
  CHECK(r.fetched_from == std::vector<uint64_t>{0});
  for (uint64_t q : {0, 1}) s.replay_batch(q, batch(q), t0, acts);
  s.replay_end(t0, acts);
  CHECK(read(acts).published == std::vector<int64_t>{0, 1});
  CHECK(s.counters().engine_restarts == 1);
  CHECK(s.counters().reconnects == 1);
}

TEST_CASE("reconnect to the same stream: only what was not published yet") {
  auto s = make(true);
  stream_actions acts;
  s.on_connected(t0, acts);
  s.replay_end(t0, acts);
  live(s, {0, 1, 2}, acts);
  read(acts);
  s.on_connected(t0, acts);
  read(acts);
  REQUIRE(s.verify_seq() == 2u);
  s.replay_answered();
  s.replay_verified(true);
  CHECK_FALSE(s.wants(1));
  s.replay_batch(3, batch(3), t0, acts);
  live(s, {4}, acts);  // held back meanwhile
  s.replay_end(t0, acts);
  auto r = read(acts);
  CHECK(r.published == std::vector<int64_t>{3, 4});
  CHECK(s.counters().engine_restarts == 0);
  CHECK(s.counters().lost == 0);
}

TEST_CASE("a replay that never answers after a reconnect is not a restart") {
  auto s = make(true);
  stream_actions acts;
  s.on_connected(t0, acts);
  s.replay_end(t0, acts);
  live(s, {0, 1}, acts);
  s.on_connected(t0, acts);
  read(acts);
  s.on_tick(t0 + 2s, acts);  // nothing answered: the stream goes on
  CHECK(read(acts).published.empty());
  CHECK(s.counters().engine_restarts == 0);
  live(s, {2}, acts);
  CHECK(read(acts).published == std::vector<int64_t>{2});
}

TEST_CASE("held-back live batches are bounded; an undecodable batch still advances the seq") {
  auto s = make(true);
  stream_actions acts;
  live(s, {0}, acts);
  live(s, {2}, acts);  // a gap at 1: fill starts
  read(acts);
  // The fill holds batch 2; max_held_back - 1 more reach the bound.
  for (uint64_t q = 3; q < 2 + engine_stream::max_held_back; ++q) s.on_live(q, batch(q), t0, acts);
  auto r = read(acts);
  CHECK_FALSE(s.filling());  // ended by the bound, not by time
  REQUIRE(r.published.size() == engine_stream::max_held_back);
  CHECK(r.published.front() == 2);
  CHECK(s.counters().lost == 1);
  const uint64_t next = *s.expected();
  s.on_undecodable_live(next);
  live(s, {next + 1}, acts);
  CHECK(read(acts).published == std::vector<int64_t>{static_cast<int64_t>(next + 1)});
  CHECK(s.counters().gaps == 1);
}

TEST_CASE("drain publishes what a fill holds back") {
  auto s = make(true);
  stream_actions acts;
  live(s, {0, 3}, acts);
  read(acts);
  s.replay_batch(1, batch(1), t0, acts);
  s.drain(t0, acts);
  CHECK(read(acts).published == std::vector<int64_t>{1, 3});
  CHECK(s.counters().lost == 1);
}

TEST_CASE("a burst of new streams within restart_min_interval: one fence now, one owed") {
  // Random seqs on one connection (issue #35: 105 fences for one burst).
  engine_stream s({0, false, 100, 1s, 1s});
  stream_actions acts;
  live(s, {0, 1}, acts);
  read(acts);
  live(s, {900000, 5, 800000, 3}, acts, t0 + 10ms);  // 4 new streams in 10 ms
  auto r = read(acts);
  CHECK(r.published == std::vector<int64_t>{-1, 900000, 5, 800000, 3});
  CHECK(s.counters().engine_restarts == 1);
  CHECK(s.counters().restarts_coalesced == 3);
  CHECK(s.counters().skipped == 2);  // the two forward jumps, one batch each
  CHECK(s.counters().lost == 0);
  // The owed fence is due when the interval has passed: the bridge ticks then.
  REQUIRE(s.deadline().has_value());
  CHECK(*s.deadline() == t0 + 10ms + 1s);
  s.on_tick(t0 + 500ms, acts);
  CHECK(read(acts).published.empty());
  s.on_tick(t0 + 10ms + 1s, acts);
  r = read(acts);
  CHECK(r.published == std::vector<int64_t>{-1});
  CHECK(has(r.warns, "owed"));
  CHECK(s.counters().engine_restarts == 2);
  CHECK_FALSE(s.deadline().has_value());
  // The stream goes on from the last batch; nothing more is owed.
  live(s, {4, 5}, acts, t0 + 2s);
  CHECK(read(acts).published == std::vector<int64_t>{4, 5});
  CHECK(s.counters().engine_restarts == 2);
}

TEST_CASE("an owed fence is published before the next batch after the interval") {
  engine_stream s({0, false, 100, 1s, 1s});
  stream_actions acts;
  live(s, {0, 1, 2}, acts);
  live(s, {0}, acts, t0 + 1ms);       // went back: fenced
  live(s, {500000}, acts, t0 + 2ms);  // jumped: coalesced
  CHECK(read(acts).published == std::vector<int64_t>{0, 1, 2, -1, 0, 500000});
  live(s, {500001}, acts, t0 + 3s);  // no tick came: the batch pays it first
  CHECK(read(acts).published == std::vector<int64_t>{-1, 500001});
  CHECK(s.counters().engine_restarts == 2);
  CHECK(s.counters().restarts_coalesced == 1);
}

TEST_CASE("the first new stream after a reconnect is fenced at once, within the interval") {
  engine_stream s({0, false, 100, 1s, 1s});
  stream_actions acts;
  s.on_connected(t0, acts);
  live(s, {0, 1, 2}, acts);
  live(s, {0}, acts, t0 + 1ms);  // fenced
  s.on_connected(t0 + 2ms, acts);  // the engine connection came back
  live(s, {7, 0}, acts, t0 + 3ms);  // a new stream again: fenced at once
  auto r = read(acts);
  CHECK(r.published == std::vector<int64_t>{0, 1, 2, -1, 0, 7, -1, 0});
  CHECK(s.counters().engine_restarts == 2);
  CHECK(s.counters().restarts_coalesced == 0);
}
