// Deterministic actor tests (CAF's test_coordinator, no threads): the
// publisher numbers batches 0, 1, 2, … with no gaps, fills the rank in,
// encodes exactly as the codec does, and hands each batch to the PUB bridge
// and the replay actor; the replay actor answers with what it kept; the
// indexer follows the published batches and serves snapshots of them.
#include "actors/relay/indexer.hpp"
#include "actors/relay/publisher.hpp"
#include "actors/relay/replay.hpp"
#include "events_wire/kv_event_codec.hpp"
#include "relay/fence.hpp"
#include "caf_test_fixture.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/send.hpp>
#include <doctest/doctest.h>

using namespace kvs;

namespace {

using fixture = test::caf_test_fixture;

/// Stands in for the PUB bridge: records what it is asked to send.
pub_bridge_actor::behavior_type fake_pub(pub_bridge_actor::pointer,
                                         std::vector<encoded_batch>* sent) {
  return {[sent](publish_atom, encoded_batches& bs) {
            for (auto& b : bs.items)
              sent->push_back(b);
          },
          // The bridges' built-ins (bridge_actor): nothing here sends them.
          [](stop_atom) {}, [](stats_atom) {}, [](metrics_atom, const caf::actor&) {}};
}

/// Stands in for the replay bridge: asks once, records the stream.
replay_bridge_actor::behavior_type fake_replay_client(replay_bridge_actor::pointer self,
                                                      replay_actor replay, uint64_t start,
                                                      std::vector<uint64_t>* got) {
  self->send(replay, replay_atom_v, replay_request{"client-1", start});
  return {[got](replay_stream& s) {
            CHECK(s.client == "client-1");
            for (auto& b : s.batches)
              got->push_back(b.seq);
          },
          [](snapshot_part&) { FAIL("a replay got a snapshot part"); },
          [](stop_atom) {}, [](stats_atom) {}, [](metrics_atom, const caf::actor&) {}};
}

/// Stands in for the replay bridge serving a snapshot: asks, then credits
/// every part until the last.
replay_bridge_actor::behavior_type fake_snapshot_client(replay_bridge_actor::pointer self,
                                                        indexer_actor indexer,
                                                        std::vector<snapshot_part>* parts) {
  self->send(indexer, snapshot_request{7});
  return {[](replay_stream&) { FAIL("a snapshot got a replay stream"); },
          [self, indexer, parts](snapshot_part& p) {
            CHECK(p.id == 7);
            parts->push_back(p);
            if (!p.last)
              self->send(indexer, snapshot_credit{7, false});
          },
          [](stop_atom) {}, [](stats_atom) {}, [](metrics_atom, const caf::actor&) {}};
}

publisher_params publisher_with(int64_t rank, pub_bridge_actor pub, replay_actor rep,
                                relay_queue_ptr queue, indexer_actor idx = {}) {
  publisher_params p;
  p.rank = rank;
  p.pub_bridge = std::move(pub);
  p.replay = std::move(rep);
  p.indexer = std::move(idx);
  p.queue = std::move(queue);
  return p;
}

indexer_params indexer_with(int64_t rank, size_t max_blocks, relay_queue_ptr queue) {
  indexer_params p;
  p.rank = rank;
  p.max_blocks = max_blocks;
  p.queue = std::move(queue);
  return p;
}

kv_event_batch batch_with(uint64_t hash, std::optional<int64_t> rank) {
  block_stored e;
  e.block_hashes = {hash};
  e.token_ids = {1, 2, 3, 4};
  e.block_size = 4;
  e.medium = "GPU";
  kv_event_batch b;
  b.ts = 1.5;
  b.events.emplace_back(e);
  b.dp_rank = rank;
  return b;
}

} // namespace

TEST_CASE_FIXTURE(fixture, "publisher: gapless seq, rank filled in, same bytes to PUB and replay") {
  std::vector<encoded_batch> sent;
  auto pub = sys.spawn(fake_pub, &sent);
  replay_params rp;
  rp.rank = 1;
  rp.buffer_steps = 3;
  auto rep = sys.spawn(replay, rp);
  auto queue = std::make_shared<relay_queue>(100);
  auto p = sys.spawn(publisher, publisher_with(1, pub, rep, queue));
  sched.run();
  // Seq 0 is the publisher's own AllBlocksCleared: routers drop whatever they
  // kept from before this sidecar started.
  REQUIRE(sent.size() == 1);
  CHECK(sent[0].seq == 0);
  {
    auto res = decode_event_batch(reinterpret_cast<const uint8_t*>(sent[0].payload->data()),
                                  sent[0].payload->size());
    REQUIRE(res.has_value());
    auto& got = res.value().batch;
    REQUIRE(got.events.size() == 1);
    CHECK(std::holds_alternative<all_blocks_cleared>(got.events[0]));
    CHECK(got.dp_rank == std::optional<int64_t>{1});
  }
  for (uint64_t i = 0; i < 5; ++i) {
    REQUIRE(queue->admit());
    kv_event_batches one;
    one.items.push_back(batch_with(100 + i, i == 4 ? std::optional<int64_t>{0} : std::nullopt));
    caf::anon_send(p, publish_atom_v, std::move(one));
  }
  sched.run();
  REQUIRE(sent.size() == 6);
  for (uint64_t i = 0; i < 5; ++i) {
    CHECK(sent[i + 1].seq == i + 1);
    // The payload is exactly the codec's encoding, with the rank filled in
    // where the engine left it out (and kept where it set it).
    auto expect = batch_with(100 + i, i == 4 ? 0 : 1);
    std::string bytes;
    encode_event_batch(expect, event_dialect::vllm, bytes);
    CHECK(*sent[i + 1].payload == bytes);
  }
  // The PUB bridge releases the queue; the fake does not, so all 6 are queued.
  CHECK(queue->queued() == 6);

  // The replay actor kept the last 3 and serves from a start seq.
  std::vector<uint64_t> from0, from4, from9;
  sys.spawn(fake_replay_client, rep, 0, &from0);
  sys.spawn(fake_replay_client, rep, 4, &from4);
  sys.spawn(fake_replay_client, rep, 9, &from9);
  sched.run();
  CHECK(from0 == std::vector<uint64_t>{3, 4, 5});
  CHECK(from4 == std::vector<uint64_t>{4, 5});
  CHECK(from9.empty());
  caf::anon_send_exit(p, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(rep, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(pub, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "publisher: events.published_dp_rank = zero: every batch says rank 0") {
  std::vector<encoded_batch> sent;
  auto pub = sys.spawn(fake_pub, &sent);
  auto queue = std::make_shared<relay_queue>(100);
  auto pp = publisher_with(1, pub, replay_actor{}, queue);
  pp.published_rank = 0;
  auto p = sys.spawn(publisher, pp);
  sched.run();
  REQUIRE(queue->admit());
  kv_event_batches one;
  one.items.push_back(batch_with(7, 1)); // the engine's rank 1
  caf::anon_send(p, publish_atom_v, std::move(one));
  sched.run();
  REQUIRE(sent.size() == 2);
  for (auto& e : sent) {
    auto res = decode_event_batch(reinterpret_cast<const uint8_t*>(e.payload->data()),
                                  e.payload->size());
    REQUIRE(res.has_value());
    CHECK(res.value().batch.dp_rank == std::optional<int64_t>{0});
  }
  // The same bytes the codec writes for that batch with rank 0.
  std::string bytes;
  encode_event_batch(batch_with(7, 0), event_dialect::vllm, bytes);
  CHECK(*sent[1].payload == bytes);
  caf::anon_send_exit(p, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(pub, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "publisher: events.keepalive_interval: an empty batch after a quiet interval") {
  std::vector<encoded_batch> sent;
  auto pub = sys.spawn(fake_pub, &sent);
  auto queue = std::make_shared<relay_queue>(100);
  auto pp = publisher_with(0, pub, replay_actor{}, queue);
  pp.keepalive = std::chrono::seconds(1);
  auto p = sys.spawn(publisher, pp);
  sched.run();
  REQUIRE(sent.size() == 1); // the start fence
  // The interval that saw the fence was not quiet: nothing yet.
  sched.trigger_timeouts();
  sched.run();
  CHECK(sent.size() == 1);
  // A quiet interval: one empty batch with the next seq.
  sched.trigger_timeouts();
  sched.run();
  REQUIRE(sent.size() == 2);
  CHECK(sent[1].seq == 1);
  auto res = decode_event_batch(reinterpret_cast<const uint8_t*>(sent[1].payload->data()),
                                sent[1].payload->size());
  REQUIRE(res.has_value());
  CHECK(res.value().batch.events.empty());
  CHECK(res.value().batch.dp_rank == std::optional<int64_t>{0});
  // A real batch resets it: the next check stays silent, the one after speaks.
  REQUIRE(queue->admit());
  kv_event_batches one;
  one.items.push_back(batch_with(9, 0));
  caf::anon_send(p, publish_atom_v, std::move(one));
  sched.run();
  REQUIRE(sent.size() == 3);
  sched.trigger_timeouts();
  sched.run();
  CHECK(sent.size() == 3);
  sched.trigger_timeouts();
  sched.run();
  REQUIRE(sent.size() == 4);
  CHECK(sent[3].seq == 3);
  caf::anon_send_exit(p, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(pub, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "publisher: a snapshot is the state at its seq, live batches between parts") {
  std::vector<encoded_batch> sent;
  auto pub = sys.spawn(fake_pub, &sent);
  auto queue = std::make_shared<relay_queue>(100);
  auto idx = sys.spawn(indexer, indexer_with(0, 1000000, queue));
  // Asked before anything was published (the publisher is not even there
  // yet): just the end marker, a router replays from 0.
  std::vector<snapshot_part> before;
  sys.spawn(fake_snapshot_client, idx, &before);
  sched.run();
  REQUIRE(before.size() == 1);
  CHECK(before[0].last);
  CHECK(before[0].batches.empty());
  auto p = sys.spawn(publisher, publisher_with(0, pub, replay_actor{}, queue, idx));
  sched.run();

  // The publisher starts with a batch of its own (a fence, seq 0): a
  // snapshot now is one empty batch at that seq.
  const uint64_t base = sent.size();
  REQUIRE(base == 1);
  std::vector<snapshot_part> none;
  sys.spawn(fake_snapshot_client, idx, &none);
  sched.run();
  REQUIRE(none.size() == 1);
  CHECK(none[0].last);
  CHECK(none[0].seq == 0);
  REQUIRE(none[0].batches.size() == 1);
  CHECK(none[0].batches[0].events.empty());

  // Seq 0 and 1: 3000 blocks in one chain.
  for (uint64_t part = 0; part < 2; ++part) {
    block_stored e;
    for (uint64_t h = 0; h < 1500; ++h)
      e.block_hashes.push_back(part * 1500 + h + 1);
    if (part == 1)
      e.parent_block_hash = 1500;
    e.token_ids.assign(1500 * 2, 5);
    e.block_size = 2;
    e.medium = "GPU";
    kv_event_batches one;
    kv_event_batch b;
    b.ts = 1.0;
    b.events = {e};
    one.items.push_back(std::move(b));
    caf::anon_send(p, publish_atom_v, std::move(one));
  }
  sched.run();
  // The snapshot starts, then seq 2 removes every block: the parts keep
  // coming with what the rank held at seq 1.
  CHECK(queue->indexing() == 0); // the indexer applied all three
  std::vector<snapshot_part> parts;
  sys.spawn(fake_snapshot_client, idx, &parts);
  sched.run_once(); // the client asks
  sched.run_once(); // the indexer starts the snapshot
  block_removed gone;
  for (uint64_t h = 1; h <= 3000; ++h)
    gone.block_hashes.push_back(h);
  gone.medium = "GPU";
  kv_event_batches rm;
  kv_event_batch b;
  b.ts = 2.0;
  b.events = {gone};
  rm.items.push_back(std::move(b));
  caf::anon_send(p, publish_atom_v, std::move(rm));
  sched.run();
  REQUIRE(sent.size() == base + 3);
  REQUIRE(parts.size() >= 2);
  CHECK(parts.back().last);
  std::vector<uint64_t> hashes;
  for (auto& part : parts)
    for (auto& batch : part.batches) {
      CHECK(part.seq == base + 1);
      CHECK(batch.dp_rank == 0);
      for (auto& ev : batch.events) {
        auto& s = std::get<block_stored>(ev);
        CHECK(s.parent_block_hash == (hashes.empty() ? std::optional<uint64_t>{}
                                                     : std::optional<uint64_t>{hashes.back()}));
        hashes.insert(hashes.end(), s.block_hashes.begin(), s.block_hashes.end());
      }
    }
  REQUIRE(hashes.size() == 3000);
  for (uint64_t h = 0; h < 3000; ++h)
    CHECK(hashes[h] == h + 1); // one chain, parents first
  caf::anon_send_exit(p, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(idx, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(pub, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE("relay queue: admits up to max, then drops and counts") {
  relay_queue q{2};
  CHECK(q.admit());
  CHECK(q.admit());
  CHECK_FALSE(q.admit());
  CHECK(q.dropped_full() == 1);
  q.sent();
  CHECK(q.admit());
  CHECK(q.queued() == 2);
  // A restart fence gets through a full queue (routers must learn the
  // stream ended), counted apart from the drops.
  q.admit_always();
  CHECK(q.queued() == 3);
  CHECK(q.forced() == 1);
  CHECK(q.dropped_full() == 1);
  q.sent(3);
  CHECK(q.admit());
}

namespace {

/// What the ingest bridge hands over for an engine payload that is already
/// canonical for `d`: the bytes, undecoded.
kv_event_batch pass_through(const kv_event_batch& b, event_dialect d) {
  auto bytes = std::make_shared<std::string>();
  encode_event_batch(b, d, *bytes);
  auto events = std::make_shared<canonical_events>();
  auto c = check_canonical_event_batch(reinterpret_cast<const uint8_t*>(bytes->data()),
                                       bytes->size(), d, events.get());
  REQUIRE(c);
  kv_event_batch out;
  out.ts = c->ts;
  out.dp_rank = c->dp_rank;
  out.wire = canonical_wire{bytes, d, *c, std::make_shared<const canonical_record>(*events)};
  return out;
}

} // namespace

TEST_CASE_FIXTURE(fixture, "publisher: pass-through batches are forwarded, only the rank rewritten") {
  std::vector<encoded_batch> sent;
  auto pub = sys.spawn(fake_pub, &sent);
  auto queue = std::make_shared<relay_queue>(100);
  auto p = sys.spawn(publisher, publisher_with(1, pub, replay_actor{}, queue));
  sched.run();
  REQUIRE(sent.size() == 1); // seq 0: the publisher's own AllBlocksCleared
  sent.clear();
  kv_event_batches in;
  in.items.push_back(pass_through(batch_with(7, 1), event_dialect::vllm));        // rank kept
  in.items.push_back(pass_through(batch_with(8, std::nullopt), event_dialect::vllm)); // filled in
  in.items.push_back(pass_through(batch_with(9, 0), event_dialect::tokenspeed));  // other dialect
  const auto* shared = in.items[0].wire->bytes.get();
  caf::anon_send(p, publish_atom_v, std::move(in));
  sched.run();
  REQUIRE(sent.size() == 3);
  // The engine's bytes themselves, not a copy.
  CHECK(sent[0].payload.get() == shared);
  const std::pair<uint64_t, int64_t> want[] = {{7, 1}, {8, 1}, {9, 0}};
  for (size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    kv_event_batch b = batch_with(want[i].first, want[i].second);
    if (i == 2) // what tokenspeed's dialect carried: no medium
      std::get<block_stored>(b.events[0]).medium.reset();
    std::string bytes;
    encode_event_batch(b, event_dialect::vllm, bytes);
    CHECK(*sent[i].payload == bytes);
  }
  caf::anon_send_exit(p, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(pub, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "publisher: a live batch goes out before the indexer has applied it") {
  std::vector<encoded_batch> sent;
  auto pub = sys.spawn(fake_pub, &sent);
  auto queue = std::make_shared<relay_queue>(100);
  auto idx = sys.spawn(indexer, indexer_with(0, 1000, queue));
  auto p = sys.spawn(publisher, publisher_with(0, pub, replay_actor{}, queue, idx));
  sched.run();
  REQUIRE(sent.size() == 1); // the fence
  sent.clear();
  REQUIRE(queue->admit());
  kv_event_batches one;
  one.items.push_back(pass_through(batch_with(42, 0), event_dialect::vllm));
  caf::anon_send(p, publish_atom_v, std::move(one));
  // Only the publisher and the PUB bridge run: the batch is published while
  // the index update waits in the indexer's mailbox (the live path does not
  // decode it for the index, nor wait for snapshot parts).
  sched.prioritize(p);
  sched.run_once();
  sched.prioritize(pub);
  sched.run_once();
  REQUIRE(sent.size() == 1);
  CHECK(sent[0].seq == 1);
  CHECK(queue->indexing() == 1);
  // What the waiting batch holds: its frame, at least, and its record.
  CHECK(queue->indexing_bytes() > static_cast<int64_t>(sent[0].payload->size()));
  sched.run();
  CHECK(queue->indexing() == 0);
  CHECK(queue->indexing_bytes() == 0);
  // And the indexer got it: a snapshot now holds block 42 at seq 1.
  std::vector<snapshot_part> parts;
  sys.spawn(fake_snapshot_client, idx, &parts);
  sched.run();
  REQUIRE(parts.size() == 1);
  CHECK(parts[0].seq == 1);
  REQUIRE(parts[0].batches.size() == 1);
  REQUIRE(parts[0].batches[0].events.size() == 1);
  CHECK(std::get<block_stored>(parts[0].batches[0].events[0]).block_hashes
        == std::vector<uint64_t>{42});
  caf::anon_send_exit(p, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(idx, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(pub, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE("relay queue: an indexer holding max_indexing_bytes makes it drop, too") {
  relay_queue q{100, 1 << 20};
  q.to_indexer(1, 1 << 20);
  CHECK_FALSE(q.admit());
  CHECK(q.dropped_full() == 1);
  CHECK(q.indexed(0, 1) == 1); // one byte applied: the indexer holds just under the bound
  CHECK(q.indexing_bytes() == (1 << 20) - 1);
  CHECK(q.admit());
  // held_bytes counts a pass-through batch's frame and record, a decoded
  // batch's events.
  kv_event_batch wire = pass_through(batch_with(42, 0), event_dialect::vllm);
  CHECK(held_bytes(wire) >= static_cast<int64_t>(wire.wire->bytes->size() + sizeof(canonical_event)));
  kv_event_batch decoded = batch_with(42, 0);
  CHECK(held_bytes(decoded) >= static_cast<int64_t>(sizeof(kv_event)));
}

TEST_CASE("relay queue: an indexer max_size batches behind makes it drop, too") {
  relay_queue q{2};
  q.to_indexer(2, 0);
  CHECK_FALSE(q.admit());
  CHECK(q.dropped_full() == 1);
  CHECK(q.queued() == 0);
  CHECK(q.indexed(1, 0) == 2); // it was 2 behind before this one
  CHECK(q.admit());
}

namespace {

/// Stands in for the store: records how many batches the PUB bridge had
/// been handed when it was told of a clear. (A function with arguments:
/// CAF 0.17 spawns an argument-less lambda through a null tuple, which
/// UBSan reports.)
clear_listener_actor::behavior_type clear_listener(clear_listener_actor::pointer,
                                                   std::vector<size_t>* told,
                                                   const std::vector<encoded_batch>* sent) {
  return {[told, sent](cleared_atom) { told->push_back(sent->size()); }};
}

} // namespace

TEST_CASE_FIXTURE(fixture, "publisher: tells its listeners after each AllBlocksCleared it publishes") {
  std::vector<encoded_batch> sent;
  auto pub = sys.spawn(fake_pub, &sent);
  auto queue = std::make_shared<relay_queue>(100);
  auto p = sys.spawn(publisher, publisher_with(0, pub, replay_actor{}, queue));
  // The listener (the store, in the sidecar) records how many batches had
  // been sent when it was told: the clear must already be numbered.
  std::vector<size_t> told;
  auto listener = sys.spawn(clear_listener, &told, &sent);
  caf::anon_send(p, cleared_atom_v, listener);
  sched.run();
  REQUIRE(sent.size() == 1); // the seq-0 fence, before anyone listened
  CHECK(told.empty());

  auto publish = [&](kv_event_batch b) {
    kv_event_batches one;
    one.items.push_back(std::move(b));
    caf::anon_send(p, publish_atom_v, std::move(one));
    sched.run();
  };
  publish(batch_with(5, 0)); // a BlockStored: nothing to tell
  CHECK(told.empty());
  kv_event_batch removed = batch_with(6, 0);
  block_removed rm;
  rm.block_hashes = {6};
  rm.medium = "GPU";
  removed.events = {rm};
  publish(pass_through(removed, event_dialect::vllm)); // a pass-through BlockRemoved: neither
  CHECK(told.empty());
  publish(fence_batch(0)); // decoded (the ingest's restart fence)
  REQUIRE(told.size() == 1);
  CHECK(told[0] == sent.size()); // told after the clear went to the PUB bridge
  kv_event_batch mixed = batch_with(7, 0);
  mixed.events.emplace_back(all_blocks_cleared{});
  mixed.events.emplace_back(batch_with(8, 0).events[0]);
  publish(pass_through(mixed, event_dialect::vllm)); // an engine's, its bytes passed through
  REQUIRE(told.size() == 2);
  CHECK(told[1] == sent.size());
}
