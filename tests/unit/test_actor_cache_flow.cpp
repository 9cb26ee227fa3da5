// Deterministic tests of the cache server's request flows through the
// session router (CAF's test_coordinator, host transfer backend, an engine's
// pools in shared memory): register, STORE, LOOKUP, the prefetch queries,
// RETRIEVE byte for byte, END_SESSION; unknown jobs; the idle sweep, reaped
// instances and cache.max_sessions ending or refusing sessions.
#include "actor_cache_fixture.hpp"

#include "actors/cache/session.hpp"

using namespace kvs;
using namespace kvs::test;

namespace {

/// Everything behind the engine bridge, which a recording stand-in replaces.
struct server : fixture {
  engine_pools engine;
  std::shared_ptr<slot_pool> l1 = make_l1();
  gpu_transfer_actor gpu = spawn_gpu(l1);
  store_actor st = spawn_store(l1);
  registry_actor reg = spawn_registry(gpu, st);
  bridge_log log;
  engine_bridge_actor bridge = spawn(fake_bridge, &log);
  session_router_actor router;
  int64_t uid = 100;
  const int64_t pages_per_chunk = chunk / engine_pools::kPage;

  void start(session_router_params p) {
    router = spawn(session_router, std::move(p));
    // As the engine bridge does when it opens, before any request.
    caf::anon_send(router, bridge_atom_v, bridge);
    sched.run();
  }
  void start() { start(router_params(reg, st, gpu)); }

  session_router_state& routing() { return state_of<session_router_state>(router); }
  store_state& storing() { return state_of<store_state>(st); }

  /// Sends `body` as the engine bridge does and returns the replies it got.
  std::vector<mp_reply> send(mp_op op, mp_request_body body) {
    auto before = log.replies.size();
    caf::send_as(bridge, router, call_of(op, std::move(body), ++uid));
    sched.run();
    return {log.replies.begin() + static_cast<ptrdiff_t>(before), log.replies.end()};
  }
  /// The one reply to `op`'s request.
  mp_reply one(mp_op op, mp_request_body body) {
    auto got = send(op, std::move(body));
    REQUIRE(got.size() == 1);
    CHECK(got[0].uid_frame == "uid-" + std::to_string(uid));
    return got[0];
  }

  void register_engine(int64_t id) {
    register_kv_cache_req r;
    r.instance_id = id;
    r.kv_caches = engine.tensors;
    r.model_name = "m";
    r.world_size = 1;
    r.engine = engine_type::sglang;
    r.hints.tokens_per_block = engine_pools::kPage;
    auto got = one(mp_op::register_kv_cache, r);
    REQUIRE(got.op_frame == "op-1"); // echoed: registered
  }

  std::vector<std::vector<int64_t>> pages(int64_t first_chunk, int64_t n_chunks) const {
    std::vector<int64_t> ids;
    for (int64_t p = first_chunk * pages_per_chunk; p < (first_chunk + n_chunks) * pages_per_chunk;
         ++p)
      ids.push_back(p);
    return {ids};
  }

  /// STORE or RETRIEVE of `key`'s chunks, from/to the pages of chunks
  /// first_chunk, first_chunk + 1, ...
  template <class Req>
  mp_reply copy_req_of(mp_op op, int64_t instance, const cache_key& key, int64_t first_chunk) {
    Req r;
    r.key = key;
    r.instance_id = instance;
    r.block_ids = pages(first_chunk, static_cast<int64_t>(key.token_ids.size()) / chunk);
    return one(op, r);
  }
  mp_reply store_req_of(int64_t instance, const cache_key& key, int64_t first_chunk) {
    return copy_req_of<store_req>(mp_op::store, instance, key, first_chunk);
  }
  mp_reply retrieve_req_of(int64_t instance, const cache_key& key, int64_t first_chunk) {
    return copy_req_of<retrieve_req>(mp_op::retrieve, instance, key, first_chunk);
  }

  /// LOOKUP (acked at once), then the status the prefetch query reports.
  int64_t lookup(const cache_key& key) {
    auto ack = one(mp_op::lookup, lookup_req{key, 1});
    CHECK(!ack.body);
    auto status = one(mp_op::query_prefetch_status, query_prefetch_status_req{key.request_id});
    REQUIRE(status.body);
    return decode_int(*status.body);
  }

  static int64_t decode_int(const std::string& body) {
    // The msgpack ints these tests see: positive fixint or 0xcc/0xcd.
    auto b = static_cast<uint8_t>(body[0]);
    if (b < 0x80)
      return b;
    if (b == 0xcc)
      return static_cast<uint8_t>(body[1]);
    REQUIRE(b == 0xcd);
    return (static_cast<uint8_t>(body[1]) << 8) | static_cast<uint8_t>(body[2]);
  }
};

const std::string stored_ok = encode_reply_event_ok("", true);
const std::string copy_failed = encode_reply_event_ok("", false);

} // namespace

TEST_CASE_FIXTURE(server, "router: store, lookup, retrieve byte for byte, end the session") {
  start();
  register_engine(21);
  auto n = static_cast<size_t>(2 * chunk);

  // STORE two chunks from pages of chunks 0..1: answered once committed.
  auto stored = store_req_of(21, key_of("w", n, 3), 0);
  REQUIRE(stored.body);
  CHECK(*stored.body == stored_ok);
  CHECK(storing().stored == 2);
  CHECK(storing().index->stats().chunks == 2);
  CHECK(routing().sessions.count("w") == 1);
  CHECK(routing().sessions.at("w").instances == std::vector<int64_t>{21});

  // LOOKUP in another request finds both, and holds them locked.
  CHECK(lookup(key_of("r", n, 3, std::nullopt)) == 2);
  CHECK(storing().index->stats().outstanding_readers == 2);
  // The hits stay queryable; the status was consumed by the first query.
  auto hits = one(mp_op::query_prefetch_lookup_hits, query_prefetch_lookup_hits_req{"r"});
  REQUIRE(hits.body);
  CHECK(decode_int(*hits.body) == 2);
  auto again = one(mp_op::query_prefetch_status, query_prefetch_status_req{"r"});
  REQUIRE(again.body);
  CHECK(decode_int(*again.body) == 0);

  // RETRIEVE into the pages of chunks 2..3: they become the stored pages.
  auto got = retrieve_req_of(21, key_of("r", n, 3), 2);
  REQUIRE(got.body);
  CHECK(*got.body == stored_ok);
  for (int64_t p = 0; p < 2 * pages_per_chunk; ++p)
    CHECK(engine.page_bytes(p) == engine.page_bytes(p + 2 * pages_per_chunk));
  CHECK(storing().tickets.empty()); // released after the copy

  // END_SESSION: answered None once released; the session is gone.
  auto ended = one(mp_op::end_session, end_session_req{"r"});
  CHECK(!ended.body);
  CHECK(routing().sessions.count("r") == 0);
  CHECK(!storing().ledger->has_session("r"));
  CHECK(storing().index->stats().outstanding_readers == 0);
  one(mp_op::end_session, end_session_req{"w"});
  CHECK(routing().sessions.empty());
  CHECK(routing().started == 2);
  CHECK(routing().ended == 2);
}

TEST_CASE_FIXTURE(server, "router: refusals and unknown jobs get LMCache's answers") {
  start();
  register_engine(22);
  auto n = static_cast<size_t>(chunk);

  // Unknown job: status 0, hits None, END_SESSION None; no session spawned.
  auto status = one(mp_op::wait_prefetch_status, wait_prefetch_status_req{"nobody", 1.0});
  REQUIRE(status.body);
  CHECK(decode_int(*status.body) == 0);
  CHECK(!one(mp_op::query_prefetch_lookup_hits, query_prefetch_lookup_hits_req{"nobody"}).body);
  CHECK(!one(mp_op::end_session, end_session_req{"nobody"}).body);
  CHECK(routing().sessions.empty());

  // A STORE for an instance that is not registered: (b"", False), nothing kept.
  auto refused = store_req_of(99, key_of("x", n, 1), 0);
  REQUIRE(refused.body);
  CHECK(*refused.body == copy_failed);
  CHECK(storing().refused == 1);
  CHECK(storing().index->stats().reserved == 0);
  CHECK(state_of<session_state>(routing().sessions.at("x").actor).jobs.empty());

  // A RETRIEVE that no lookup of its request found: refused the same way.
  auto unseen = retrieve_req_of(22, key_of("x", n, 1), 1);
  REQUIRE(unseen.body);
  CHECK(*unseen.body == copy_failed);
  CHECK(storing().tickets.empty());

  // A STORE without worker_id is refused before it reaches the store.
  auto anon = store_req_of(22, key_of("x", n, 1, std::nullopt), 0);
  CHECK(*anon.body == copy_failed);
  CHECK(storing().refused == 1);

  // An op the router has no route for: the failure reply, never silence.
  auto odd = send(mp_op::ping, ping_req{22});
  REQUIRE(odd.size() == 1);
  CHECK(odd[0].op_frame != "op-22");
}

TEST_CASE_FIXTURE(server, "router: idle sessions end at the sweep, releasing their locks") {
  auto p = router_params(reg, st, gpu);
  p.session_ttl = std::chrono::nanoseconds{0}; // idle at once
  start(p);
  register_engine(23);
  auto n = static_cast<size_t>(chunk);
  CHECK(*store_req_of(23, key_of("w", n, 5), 0).body == stored_ok);
  CHECK(lookup(key_of("r", n, 5, std::nullopt)) == 1);
  CHECK(storing().index->stats().outstanding_readers == 1);
  REQUIRE(routing().sessions.size() == 2);

  sched.trigger_timeouts(); // the sweep (and the store's, the registry's)
  sched.run();
  CHECK(routing().sessions.empty());
  CHECK(routing().ended == 2);
  CHECK(storing().index->stats().outstanding_readers == 0);
  CHECK(storing().ledger->session_count() == 0);
  // The chunk itself stays stored.
  CHECK(storing().index->stats().chunks == 1);
}

TEST_CASE_FIXTURE(server, "router: a reaped instance's sessions end; max_sessions refuses more") {
  auto p = router_params(reg, st, gpu);
  p.max_sessions = 2;
  start(p);
  register_engine(24);
  auto n = static_cast<size_t>(chunk);
  CHECK(*store_req_of(24, key_of("a", n, 7), 0).body == stored_ok);
  CHECK(lookup(key_of("b", n, 7, std::nullopt)) == 1);
  REQUIRE(routing().sessions.size() == 2);

  // A third request id: the LOOKUP is acked and finds nothing, a STORE fails.
  auto third = send(mp_op::lookup, lookup_req{key_of("c", n, 7, std::nullopt), 1});
  REQUIRE(third.size() == 1);
  CHECK(!third[0].body);
  CHECK(*store_req_of(24, key_of("c", n, 7), 0).body == copy_failed);
  CHECK(routing().sessions.size() == 2);
  CHECK(routing().rejected.total() == 2);
  CHECK(storing().index->stats().outstanding_readers == 1); // only b's

  // Instance 24 is gone: "a" stored through it and ends; "b" only looked up.
  caf::send_as(bridge, router, reaped_atom_v, int64_t{24});
  sched.run();
  CHECK(routing().sessions.size() == 1);
  CHECK(routing().sessions.count("b") == 1);
  // Room again for a new request id.
  CHECK(lookup(key_of("c", n, 7, std::nullopt)) == 1);
  CHECK(routing().sessions.size() == 2);
}

TEST_CASE_FIXTURE(server, "session: a WAIT_PREFETCH_STATUS parks while the lookup runs, and "
                          "answers None at its deadline without consuming the result") {
  start();
  register_engine(25);
  auto n = static_cast<size_t>(chunk);
  CHECK(*store_req_of(25, key_of("w", n, 9), 0).body == stored_ok);
  auto before = log.replies.size();
  caf::send_as(bridge, router, call_of(mp_op::lookup, lookup_req{key_of("q", n, 9, std::nullopt), 1}, 901));
  caf::send_as(bridge, router, call_of(mp_op::wait_prefetch_status,
                                       wait_prefetch_status_req{"q", 0.0}, 902));
  // The router hands both to the new session; the session asks the store
  // and parks the WAIT. The store has not answered yet.
  // (Only the router and the session run: each may take several resumes.)
  while (sched.prioritize(router))
    sched.run_once();
  auto session = routing().sessions.at("q").actor;
  auto& s = state_of<session_state>(session);
  while (s.waiters.empty() && sched.prioritize(session))
    sched.run_once();
  CHECK(s.lookup_running);
  REQUIRE(s.waiters.size() == 1);
  // Its deadline (0 s) comes before the store's answer: None.
  sched.trigger_timeouts();
  REQUIRE(sched.prioritize(session));
  sched.run_once();
  CHECK(s.waiters.empty());
  sched.run();
  std::vector<mp_reply> got(log.replies.begin() + static_cast<ptrdiff_t>(before),
                            log.replies.end());
  REQUIRE(got.size() == 2);
  CHECK(got[0].uid_frame == "uid-901"); // the LOOKUP's ack
  CHECK(!got[0].body);
  CHECK(got[1].uid_frame == "uid-902"); // the WAIT, timed out
  CHECK(!got[1].body);
  // The lookup's result is still there for the next query.
  CHECK(!s.lookup_running);
  auto status = one(mp_op::query_prefetch_status, query_prefetch_status_req{"q"});
  REQUIRE(status.body);
  CHECK(decode_int(*status.body) == 1);
}
