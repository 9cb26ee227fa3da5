// Deterministic actor tests (CAF's test_coordinator, no threads): the
// publisher numbers batches 0, 1, 2, … with no gaps, fills the rank in,
// encodes exactly as the codec does, and hands each batch to the PUB bridge
// and the replay actor; the replay actor answers with what it kept.
#include "actors/publisher.hpp"
#include "actors/replay.hpp"
#include "messages/kv_event_codec.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/send.hpp>
#include <doctest/doctest.h>

using namespace kvs;

namespace {

struct fixture {
  static caf::actor_system_config& init(caf::actor_system_config& cfg) {
    cfg.set("scheduler.policy", caf::atom("testing"));
    return cfg;
  }
  caf::actor_system_config cfg;
  caf::actor_system sys{init(cfg)};
  caf::scheduler::test_coordinator& sched =
    dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
};

/// Stands in for the PUB bridge: records what it is asked to send.
pub_bridge_actor::behavior_type fake_pub(pub_bridge_actor::pointer,
                                         std::vector<encoded_batch>* sent) {
  return {[sent](publish_atom, encoded_batches& bs) {
    for (auto& b : bs.items)
      sent->push_back(b);
  }};
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
  }};
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
  auto rep = sys.spawn(replay, int64_t{1}, size_t{3}, size_t{0}, std::chrono::nanoseconds{0});
  auto queue = std::make_shared<relay_queue>(100);
  auto p = sys.spawn(publisher, int64_t{1}, event_dialect::vllm, pub, rep, queue,
                     std::chrono::nanoseconds{0});
  sched.run();
  // Seq 0 is the publisher's own AllBlocksCleared: routers drop whatever they
  // kept from before this sidecar started.
  REQUIRE(sent.size() == 1);
  CHECK(sent[0].seq == 0);
  {
    auto res = decode_event_batch(reinterpret_cast<const uint8_t*>(sent[0].payload->data()),
                                  sent[0].payload->size());
    REQUIRE(std::holds_alternative<event_decode_result>(res));
    auto& got = std::get<event_decode_result>(res).batch;
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
  CHECK(queue->queued.load() == 6);

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

TEST_CASE("relay queue: admits up to max, then drops and counts") {
  relay_queue q{2};
  CHECK(q.admit());
  CHECK(q.admit());
  CHECK_FALSE(q.admit());
  CHECK(q.dropped_full.load() == 1);
  q.release();
  CHECK(q.admit());
  CHECK(q.queued.load() == 2);
}
