// Deterministic tests of the cache actors one at a time (CAF's
// test_coordinator, host transfer backend, pools in shared memory): the
// store's reserve/commit/lookup/acquire bookkeeping, the transfer actor's
// copies byte for byte, the registry's registration and reaping. Failures
// come back through caf::error with the kind and the text that is logged.
#include "actor_cache_fixture.hpp"

using namespace kvs;
using namespace kvs::test;

namespace {

std::vector<uint64_t> hashes(uint64_t first, size_t n) {
  std::vector<uint64_t> out;
  for (size_t i = 0; i < n; ++i)
    out.push_back(first + i);
  return out;
}

store_finish finish_of(bool commit, const std::vector<uint64_t>& hs) {
  store_finish f;
  f.commit = commit;
  f.hashes = hs;
  f.tokens.resize(hs.size());
  f.parents.resize(hs.size());
  f.model = "m";
  return f;
}

} // namespace

TEST_CASE_FIXTURE(fixture, "store: configure, reserve, commit, lookup, acquire, release") {
  auto l1 = make_l1();
  auto st = spawn_store(l1);
  sched.run();
  auto& state = state_of<store_state>(st);

  // An instance whose chunks cannot fit in L1 is refused with the reason.
  auto big = ask<store_configure_reply>(st, store_configure{1, l1->capacity_bytes() * 2});
  REQUIRE(big.failure);
  CHECK(big.failure->kind == "l1_too_small");
  CHECK(big.failure->detail.find("do not fit in the L1 region") != std::string::npos);

  // Not registered: refused, counted.
  auto refused = ask<store_reserve_reply>(st, store_reserve{7, 0, hashes(100, 2)});
  REQUIRE(refused.failure);
  CHECK(refused.failure->kind == "not_registered");
  CHECK(refused.failure->detail == "instance 7 is not registered");
  CHECK(state.refused == 1);

  auto cfgd = ask<store_configure_reply>(st, store_configure{7, 8192});
  REQUIRE(cfgd.value);
  CHECK(cfgd.value->slot_bytes == 8192);

  // Three chunks reserved, their slots distinct and writable.
  auto res = ask<store_reserve_reply>(st, store_reserve{7, 0, hashes(100, 3)});
  REQUIRE(res.value);
  REQUIRE(res.value->chunks.size() == 3);
  CHECK(res.value->slot_bytes == 8192);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(res.value->chunks[i].position == i);
    std::memset(res.value->chunks[i].slot, static_cast<int>(0x40 + i), 8192);
  }
  CHECK(state.index->stats().reserved == 3);
  // Nothing is visible before the commit.
  CHECK(ask<uint64_t>(st, store_lookup{"s0", hashes(100, 3), 1, 1, "m", ""}).value == 0u);
  caf::anon_send(st, finish_of(true, hashes(100, 3)));
  sched.run();
  CHECK(state.stored == 3);
  CHECK(state.index->stats().chunks == 3);

  // Stored again: what L1 holds is left out of the reply.
  auto again = ask<store_reserve_reply>(st, store_reserve{7, 0, hashes(99, 3)});
  REQUIRE(again.value);
  REQUIRE(again.value->chunks.size() == 1);
  CHECK(again.value->chunks[0].position == 0); // hash 99 only
  caf::anon_send(st, finish_of(false, {99}));  // aborted: gone
  sched.run();
  CHECK(state.index->stats().chunks == 3);
  CHECK(state.index->stats().reserved == 0);

  // A lookup locks the hit prefix: 3 of 4.
  CHECK(ask<uint64_t>(st, store_lookup{"s1", hashes(100, 4), 1, 1, "m", ""}).value == 3u);
  CHECK(state.index->stats().outstanding_readers == 3);

  // A read past what the lookup found is refused, and gives back the locks
  // of its range.
  auto past = ask<store_acquire_reply>(st, store_acquire{"s1", 0, 2, hashes(102, 2)});
  REQUIRE(past.failure);
  CHECK(past.failure->kind == "not_looked_up");
  CHECK(past.failure->detail == "chunks 3..3 are past the 3 its lookup found");
  // A session that looked nothing up reads nothing.
  auto none = ask<store_acquire_reply>(st, store_acquire{"s9", 0, 0, hashes(100, 1)});
  REQUIRE(none.failure);
  CHECK(none.failure->detail == "no lookup of this request found chunks to retrieve");

  // Chunks 0..1 of s1: pinned, the bytes committed above.
  auto acq = ask<store_acquire_reply>(st, store_acquire{"s1", 0, 0, hashes(100, 2)});
  REQUIRE(acq.value);
  REQUIRE(acq.value->slots.size() == 2);
  CHECK(acq.value->ticket != 0);
  CHECK(acq.value->slot_bytes >= 8192);
  CHECK(acq.value->slots[1][0] == 0x41);
  CHECK(acq.value->slots[1][8191] == 0x41);
  CHECK(state.tickets.size() == 1);
  caf::anon_send(st, store_release{acq.value->ticket});
  sched.run();
  CHECK(state.tickets.empty());

  // Ending the session releases what it still holds.
  auto ended = ask<uint64_t>(st, store_end_session{"s1"});
  REQUIRE(ended.value);
  CHECK(state.index->stats().outstanding_readers == 0);
  CHECK(!state.ledger->has_session("s1"));
}

TEST_CASE_FIXTURE(fixture, "gpu_transfer: opens pools, copies pages into L1 and back, drains") {
  engine_pools engine;
  auto l1 = make_l1();
  auto gpu = spawn_gpu(l1);
  sched.run();
  auto& state = state_of<gpu_transfer_state>(gpu);
  auto layout = std::make_shared<const kv_layout>(engine.layout());
  auto chunk_bytes = layout->chunk_bytes(static_cast<uint64_t>(chunk));
  REQUIRE(chunk_bytes == 2 * engine_pools::kLayers * static_cast<uint64_t>(chunk)
                           * engine_pools::kTokenBytes);

  // Pools that do not exist: refused with the backend's reason.
  auto bad_tensors = engine.tensors;
  bad_tensors[0].shm_name = "/kvs_test_actor_does_not_exist";
  auto bad = ask<gpu_status_reply>(
    gpu, gpu_open{3, engine_type::sglang, std::make_shared<const std::vector<tensor_desc>>(bad_tensors),
                  layout});
  REQUIRE(bad.failure);
  CHECK(bad.failure->kind == "open_failed");
  CHECK(state.instances.empty());

  auto opened = ask<gpu_status_reply>(
    gpu, gpu_open{3, engine_type::sglang, std::make_shared<const std::vector<tensor_desc>>(engine.tensors),
                  layout});
  REQUIRE(opened.value);
  CHECK(state.instances.size() == 1);

  // Not registered: refused, counted.
  gpu_copy none;
  none.instance_id = 4;
  auto refused = ask<gpu_copy_started>(gpu, none);
  REQUIRE(refused.failure);
  CHECK(refused.failure->kind == "not_registered");
  CHECK(refused.failure->detail == "instance 4 is not registered");
  CHECK(state.failed == 1);

  // STORE: pages 0..15 (one chunk) into an L1 slot. The host backend
  // finishes at once: no ticket to await.
  const auto pages_per_chunk = chunk / engine_pools::kPage;
  std::vector<uint8_t> slot(chunk_bytes, 0xEE);
  gpu_copy in;
  in.instance_id = 3;
  in.to_l1 = true;
  in.block_ids = {{}};
  for (int64_t p = 0; p < pages_per_chunk; ++p)
    in.block_ids[0].push_back(p);
  in.chunk_positions = {0};
  in.slots = {slot.data()};
  in.chunk_tokens = static_cast<uint64_t>(chunk);
  in.slot_bytes = chunk_bytes;
  auto started = ask<gpu_copy_started>(gpu, in);
  REQUIRE(started.value);
  CHECK(started.value->complete);
  CHECK(started.value->ticket == 0);
  CHECK(std::count(slot.begin(), slot.end(), 0xEE) < static_cast<ptrdiff_t>(slot.size() / 2));

  // RETRIEVE the slot into pages 32..47: they become the bytes of 0..15.
  gpu_copy out = in;
  out.to_l1 = false;
  for (auto& p : out.block_ids[0])
    p += 2 * pages_per_chunk;
  auto back = ask<gpu_copy_started>(gpu, out);
  REQUIRE(back.value);
  CHECK(back.value->complete);
  for (int64_t p = 0; p < pages_per_chunk; ++p)
    CHECK(engine.page_bytes(p) == engine.page_bytes(p + 2 * pages_per_chunk));
  CHECK(engine.page_bytes(0) != engine.page_bytes(pages_per_chunk)); // untouched pages differ
  CHECK(state.copies == 2);
  CHECK(state.directions[0].bytes == chunk_bytes);
  CHECK(state.directions[1].bytes == chunk_bytes);

  // An unknown ticket fails.
  auto unknown = ask<gpu_copy_done>(gpu, gpu_await{42});
  REQUIRE(unknown.failure);
  CHECK(unknown.failure->kind == "unknown_ticket");

  // Drained: nothing in flight, and no copy starts afterwards.
  CHECK(ask<uint64_t>(gpu, drain_atom_v).value == 0u);
  auto late = ask<gpu_copy_started>(gpu, in);
  REQUIRE(late.failure);
  CHECK(late.failure->kind == "shutting_down");
  CHECK(late.failure->detail == "the sidecar is shutting down: no new copies");
  CHECK(state.refused_at_shutdown == 1);
}

TEST_CASE_FIXTURE(fixture, "registry: registers through the transfer actor and the store, "
                           "reaps silent instances") {
  engine_pools engine;
  auto l1 = make_l1();
  auto gpu = spawn_gpu(l1);
  auto st = spawn_store(l1);
  bridge_log log;
  auto bridge = spawn(fake_bridge, &log);
  registry_params rp;
  rp.chunk_size = chunk;
  rp.heartbeat_timeout = cfg.cache.heartbeat_timeout;
  // Never pinged: reaped after the grace; 1 ns makes the next round reap.
  rp.registration_grace = std::chrono::nanoseconds{1};
  rp.gpu = gpu;
  rp.store = st;
  rp.shm_allow_prefixes = cfg.cache.shm_allow_prefixes;
  auto reg = spawn(registry, rp);
  caf::anon_send(reg, bridge_atom_v, bridge); // as the session router passes it on
  sched.run();

  register_kv_cache_req r;
  r.instance_id = 11;
  r.kv_caches = engine.tensors;
  r.model_name = "m";
  r.world_size = 1;
  r.engine = engine_type::sglang;
  r.hints.tokens_per_block = engine_pools::kPage;
  caf::send_as(bridge, reg, call_of(mp_op::register_kv_cache, r, 5));
  sched.run();
  REQUIRE(log.replies.size() == 1);
  CHECK(log.replies[0].uid_frame == "uid-5");
  CHECK(log.replies[0].op_frame == "op-1"); // echoed: a success
  CHECK(!log.replies[0].body);
  CHECK(state_of<registry_state>(reg).instances.size() == 1);
  CHECK(state_of<registry_state>(reg).registered == 1);
  CHECK(state_of<gpu_transfer_state>(gpu).instances.count(11) == 1);
  auto slot = engine.layout().chunk_bytes(static_cast<uint64_t>(chunk));
  CHECK(state_of<store_state>(st).chunk_bytes.at(11) == slot);

  // Pools the transfer actor cannot open (tensor 0 lies past the end of its
  // object): the failure reply names the reason, and the bridge frees the
  // id's binding.
  register_kv_cache_req wrong = r;
  wrong.instance_id = 12;
  wrong.kv_caches[0].shm_offset_bytes = engine_pools::kPoolBytes;
  caf::send_as(bridge, reg, call_of(mp_op::register_kv_cache, wrong, 6));
  sched.run();
  REQUIRE(log.replies.size() == 2);
  CHECK(log.replies[1].op_frame != "op-1"); // the failure op frame
  CHECK(log.replies[1].op_frame.find("register_kv_cache failed: opening its memory: ")
        != std::string::npos);
  CHECK(log.reaped == std::vector<int64_t>{12});
  CHECK(state_of<registry_state>(reg).failed == 1);

  // Silent past the grace: reaped at the next round, its pools closed and
  // its slot size forgotten.
  sched.trigger_timeouts();
  sched.run();
  CHECK(state_of<registry_state>(reg).instances.empty());
  CHECK(state_of<registry_state>(reg).reaped == 1);
  CHECK(log.reaped == std::vector<int64_t>{12, 11});
  CHECK(state_of<gpu_transfer_state>(gpu).instances.empty());
  CHECK(state_of<store_state>(st).chunk_bytes.empty());
}

namespace {

/// Stands in for cache.events_rank's publisher: records every batch the
/// store announces.
publisher_actor::behavior_type fake_events(publisher_actor::pointer,
                                           std::vector<kv_event_batch>* got) {
  return {[got](publish_atom, kv_event_batches& in) {
            for (auto& b : in.items)
              got->push_back(std::move(b));
          },
          [](cleared_atom, clear_listener_actor&) {}, [](tick_atom) {}, [](stats_atom) {},
          [](metrics_atom, const caf::actor&) {}};
}

/// The BlockStored events of `batches`, in order: (hash, parent, tokens).
std::vector<std::tuple<uint64_t, std::optional<uint64_t>, std::vector<int64_t>>>
stored_of(const std::vector<kv_event_batch>& batches) {
  std::vector<std::tuple<uint64_t, std::optional<uint64_t>, std::vector<int64_t>>> out;
  for (auto& b : batches)
    for (auto& ev : b.events)
      if (auto* s = std::get_if<block_stored>(&ev)) {
        REQUIRE(s->block_hashes.size() == 1);
        CHECK(s->medium == std::optional<std::string>{"CPU"});
        out.emplace_back(s->block_hashes[0], s->parent_block_hash, s->token_ids);
      }
  return out;
}

} // namespace

TEST_CASE_FIXTURE(fixture, "store: after its rank's AllBlocksCleared, L1's rank-0 chunks are "
                           "announced again, oldest first, evicted ones not") {
  auto l1 = make_l1();
  std::vector<kv_event_batch> got;
  auto p = store_params_for(l1);
  p.events = sys.spawn(fake_events, &got);
  p.events_queue = std::make_shared<relay_queue>(1000);
  auto st = spawn(store, std::move(p));
  sched.run();
  auto& state = state_of<store_state>(st);
  // Chunks of 512 KiB: 8 fit in the 4 MiB L1 (eviction starts above 90%).
  const size_t slot = size_t{512} << 10;
  REQUIRE(ask<store_configure_reply>(st, store_configure{7, slot}).value);
  auto commit = [&](int32_t rank, const std::vector<uint64_t>& hs) {
    auto res = ask<store_reserve_reply>(st, store_reserve{7, rank, hs});
    REQUIRE(res.value);
    REQUIRE(res.value->chunks.size() == hs.size());
    store_finish f = finish_of(true, hs);
    f.rank = rank;
    for (size_t i = 0; i < hs.size(); ++i) {
      f.tokens[i] = {int64_t(hs[i]) * 10, int64_t(hs[i]) * 10 + 1};
      f.parents[i] = i == 0 ? std::nullopt : std::optional<uint64_t>{hs[i - 1]};
    }
    caf::anon_send(st, f);
    sched.run();
  };
  commit(0, hashes(100, 3));
  commit(1, hashes(100, 1)); // rank 1's copy of chunk 100: never announced
  const auto first = stored_of(got);
  REQUIRE(first.size() == 3);
  CHECK(std::get<0>(first[0]) == 100);
  CHECK(std::get<1>(first[1]) == std::optional<uint64_t>{100});
  CHECK(std::get<2>(first[2]) == std::vector<int64_t>{1020, 1021});

  got.clear();
  caf::anon_send(st, cleared_atom_v);
  sched.run();
  CHECK(stored_of(got) == first); // the same events again, in commit order
  CHECK(state.reannounced == 3);

  // Five more chunks evict the oldest (LRU): what L1 no longer holds is
  // announced removed, and not announced again after the next clear.
  got.clear();
  commit(0, hashes(200, 5));
  REQUIRE(state.evicted >= 1);
  std::vector<uint64_t> held;
  for (uint64_t h : {100, 101, 102, 200, 201, 202, 203, 204})
    if (auto e = state.index->find(chunk_key{h, 0}); e && e->state == entry_state::committed)
      held.push_back(h);
  REQUIRE(held.size() < 8);
  REQUIRE(!held.empty());
  got.clear();
  caf::anon_send(st, cleared_atom_v);
  sched.run();
  std::vector<uint64_t> again;
  for (auto& [h, parent, tokens] : stored_of(got))
    again.push_back(h);
  CHECK(again == held);
}
