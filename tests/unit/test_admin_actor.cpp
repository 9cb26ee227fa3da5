// The admin actor (admin/admin_actor.hpp) on CAF's test scheduler, with a
// stand-in store: /status from the store's figures; answers that need an
// actor not there come at once (503), never a hang; a store that does not
// answer makes a 504 at admin_store_timeout; a prefetch job from submitted
// to completed, reported once; checksums hash the locked bytes and give
// the locks back.
#include "caf_test_fixture.hpp"

#include "admin/admin_actor.hpp"
#include "cache/md5.hpp"
#include "config/config.hpp"

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace kvs;
using namespace kvs::test;

namespace {

/// What the stand-in store was sent, and how it answers.
struct store_log {
  bool silent = false; ///< status queries are never answered
  std::vector<caf::response_promise> held;
  uint64_t hit = 0; ///< every LOOKUP's hit
  std::vector<std::string> lookups, ended;
  std::vector<std::byte> chunk = std::vector<std::byte>(4096, std::byte{7});
  std::vector<lock_token> unlocked;
};

caf::behavior fake_store(caf::event_based_actor* self, store_log* log) {
  return {
    [self, log](store_status_query) -> caf::result<store_status> {
      if (log->silent) {
        log->held.push_back(self->make_response_promise());
        return caf::delegated<store_status>{};
      }
      store_status s;
      s.chunks = 3;
      s.capacity_bytes = 1000;
      s.used_bytes = 250;
      return s;
    },
    [log](store_lookup& q) -> uint64_t {
      log->lookups.push_back(q.session);
      return log->hit;
    },
    [log](store_end_session& e) -> uint64_t {
      log->ended.push_back(e.session);
      return 0;
    },
    [log](store_lock_chunks& q) -> store_locked_chunks {
      store_locked_chunks out;
      for (size_t i = 0; i < q.keys.size(); ++i) {
        stored_object o;
        o.key = q.keys[i];
        if (i == 0) { // the first is in L1; the rest are not
          o.found = true;
          o.bytes = log->chunk.size();
          o.data = log->chunk.data();
          out.tokens.push_back(lock_token{q.keys[i], 1});
        }
        out.objects.push_back(o);
      }
      return out;
    },
    [log](store_unlock_chunks& u) {
      log->unlocked.insert(log->unlocked.end(), u.tokens.begin(), u.tokens.end());
    },
  };
}

struct admin_fixture : caf_test_fixture {
  const config cfg = load_config("", {}).value(); // cache.enabled by default
  store_log log;
  admin_actor a = sys.spawn(admin, admin_params{&cfg, {}});

  // The system ends once every actor has: the admin actor is told to, and
  // its asks' pending deadlines (which hold it) fire.
  ~admin_fixture() {
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    sched.run();
    sched.trigger_timeouts();
    sched.run();
  }

  void watch_store() {
    auto st = caf::actor_cast<store_actor>(sys.spawn(fake_store, &log));
    caf::anon_send(a, watch_atom_v, st, l2_actor{}, gpu_transfer_actor{});
    sched.run();
  }

  /// The admin actor's answer to `call`, once every message is delivered
  /// (nullopt: none yet).
  template <class Call>
  std::shared_ptr<std::optional<http_answer>> ask(Call call) {
    auto out = std::make_shared<std::optional<http_answer>>();
    // Arguments, not captures: CAF 0.17 dereferences a null argument tuple
    // for an actor function without arguments (UBSan reports it).
    sys.spawn(
      [](caf::event_based_actor* self, admin_actor to, Call c,
         std::shared_ptr<std::optional<http_answer>> into) {
        self->request(to, caf::infinite, std::move(c))
          .then([into](http_answer& r) { *into = std::move(r); },
                [into](caf::error& e) { *into = http_answer{0, caf::to_string(e)}; });
      },
      a, std::move(call), out);
    sched.run();
    return out;
  }
  template <class Call>
  http_answer answer(Call call) {
    auto r = ask(std::move(call));
    REQUIRE(r->has_value());
    return **r;
  }
};

bool has(const std::string& body, const std::string& part) {
  return body.find(part) != std::string::npos;
}

} // namespace

TEST_CASE_FIXTURE(admin_fixture, "admin actor: /status from the store's figures, 503 before it") {
  auto early = answer(admin_req::status{});
  CHECK(early.status == 503);
  CHECK(has(early.body, "the cache server is starting"));
  watch_store();
  auto r = answer(admin_req::status{});
  CHECK(r.status == 200);
  CHECK_MESSAGE(has(r.body, "\"total_object_count\":3"), r.body);
  CHECK(has(r.body, "\"memory_usage_ratio\":0.25"));
}

TEST_CASE_FIXTURE(admin_fixture, "admin actor: what it cannot ask is answered at once") {
  watch_store();
  admin_req::objects_list l2_list; // tier l2 by default, and no L2 tier here
  auto r = answer(l2_list);
  CHECK(r.status == 503);
  CHECK(has(r.body, "no L2 adapters configured"));
  admin_req::objects_delete l2_delete;
  CHECK(answer(l2_delete).status == 503);
  admin_req::cache_clear all;
  all.tier = "all";
  CHECK(answer(all).status == 400);
  admin_req::block_checksums blocks; // no gpu-transfer actor
  CHECK(answer(blocks).status == 503);
}

TEST_CASE_FIXTURE(admin_fixture, "admin actor: a store that does not answer is a 504 at the deadline") {
  watch_store();
  log.silent = true;
  auto r = ask(admin_req::status{});
  CHECK(!r->has_value());
  // Other calls are served meanwhile: the wait is not the actor's.
  CHECK(answer(admin_req::root{}).status == 200);
  sched.trigger_timeouts();
  sched.run();
  REQUIRE(r->has_value());
  CHECK((*r)->status == 504);
  CHECK(has((*r)->body, "the store did not answer within 2000 ms"));
}

TEST_CASE_FIXTURE(admin_fixture, "admin actor: a prefetch runs as a store LOOKUP, reported once") {
  watch_store();
  log.hit = 2;
  admin_req::prefetch_submit p;
  p.model = "m";
  p.world_size = 2;
  p.tokens.assign(static_cast<size_t>(cfg.cache.chunk_size) * 3, 5); // three chunks
  auto r = answer(p);
  CHECK(r.status == 202);
  CHECK_MESSAGE(has(r.body, "\"request_id\":\"pf-1\""), r.body);
  CHECK(has(r.body, "\"chunks\":3"));
  REQUIRE(log.lookups == std::vector<std::string>{"http-prefetch:pf-1"});
  CHECK(log.ended == log.lookups); // the session's locks given back at once
  auto done = answer(admin_req::prefetch_status{"pf-1"});
  CHECK(done.status == 200);
  CHECK_MESSAGE(has(done.body, "\"found_keys\":4"), done.body); // 2 chunks x 2 ranks
  CHECK(has(done.body, "\"total_keys\":6"));
  CHECK(answer(admin_req::prefetch_status{"pf-1"}).status == 404);
}

TEST_CASE_FIXTURE(admin_fixture, "admin actor: checksums hash the locked bytes, then unlock them") {
  watch_store();
  admin_req::chunk_checksums c;
  c.model = "m";
  c.world_size = 1;
  c.tokens.assign(static_cast<size_t>(cfg.cache.chunk_size) * 2, 9);
  auto r = answer(c);
  CHECK(r.status == 200);
  auto digest = md5_hex(log.chunk.data(), log.chunk.size());
  CHECK_MESSAGE(has(r.body, "\"chunk_checksums\":[\"" + digest + "\",null]"), r.body);
  REQUIRE(log.unlocked.size() == 1);
  CHECK(log.unlocked[0].epoch == 1);
}
