// store_l1_keys: what the store reports of its L1 to the LMCache coordinator
// (LMCache's L1 events: store / delete on tier l1, backend "dram"; access
// with backend ""), under the LMCache key a chunk was committed with, and
// nothing for a chunk without one or when not reporting.
#include "actors/cache/store_coordinator.hpp"
#include "l2/lmcache_object_name.hpp"

#include <doctest/doctest.h>

#include <vector>

using namespace kvs;

namespace {
struct collected final : cache_event_sink {
  std::vector<cache_event> events;
  void offer(cache_event e) override { events.push_back(std::move(e)); }
  figures read() const override { return {}; }
};
} // namespace

TEST_CASE("a reported chunk's store, reads and removal carry its LMCache key") {
  auto sink = std::make_shared<collected>();
  store_l1_keys keys{sink};
  REQUIRE(keys.reporting());
  const std::string digest(32, '\x7f');
  chunk_key k{0x1234, 1};
  keys.stored(k, "org/m", "tenant", 2, 0, digest, 4096);
  keys.read(k);
  keys.removed(k);
  keys.removed(k); // gone already: nothing more
  keys.read(k);
  REQUIRE(sink->events.size() == 3);
  auto& s = sink->events[0];
  CHECK(s.kind == cache_event_kind::store);
  CHECK(s.l1);
  CHECK(s.backend == "dram");
  CHECK(s.size_bytes == 4096);
  CHECK(s.key.model == "org/m");
  CHECK(s.key.salt == "tenant");
  CHECK(s.key.chunk_hash == digest);
  CHECK(s.key.kv_rank == lmcache_kv_rank(2, 1));
  CHECK(sink->events[1].kind == cache_event_kind::access);
  CHECK(sink->events[1].backend.empty());
  CHECK(sink->events[1].key.chunk_hash == digest);
  CHECK(sink->events[2].kind == cache_event_kind::remove);
  CHECK(sink->events[2].backend == "dram");
  CHECK(sink->events[2].size_bytes == 0);
  CHECK(keys.size() == 0);
}

TEST_CASE("no LMCache key, a name LMCache refuses, or no sink: nothing reported") {
  auto sink = std::make_shared<collected>();
  store_l1_keys keys{sink};
  keys.stored({1, 0}, "org/m", "", 1, 0, "", 4096);                     // no key
  keys.stored({2, 0}, "org@m", "", 1, 0, std::string(32, 'a'), 4096);   // '@' in the model
  keys.read({1, 0});
  keys.removed({2, 0});
  CHECK(sink->events.empty());
  store_l1_keys off{nullptr};
  CHECK_FALSE(off.reporting());
  off.stored({3, 0}, "org/m", "", 1, 0, std::string(32, 'a'), 4096);
  CHECK(off.size() == 0);
}
