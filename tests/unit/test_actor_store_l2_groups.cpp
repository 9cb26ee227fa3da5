// Deterministic tests of the store's L2 prefetch for a hybrid-KV model
// (actors/cache/store_l2.cpp, l2_prefetch_groups) against a fake L2 actor that
// holds objects by (hash, layout) and records every fetch: the two phases
// (full-attention groups from the end of their L1 run, then each window
// ending where those runs end), the chunks entering L1 in their group's
// format, the locks the hit takes, and a session that ends while its
// prefetch is in flight taking no locks at all.
#include "actor_cache_fixture.hpp"

#include "cache/chunk_hash.hpp"
#include "cache/group_lookup.hpp"

#include <map>

using namespace kvs;
using namespace kvs::test;

namespace {

constexpr size_t full_bytes = 8192;   // group 0: full attention, two planes
constexpr size_t window_bytes = 4096; // group 1: a 1-chunk window, one plane
const std::vector<uint64_t> prompt{501, 502, 503, 504};

/// What the fake L2 holds and saw.
struct fake_l2_log {
  std::map<std::pair<uint64_t, uint64_t>, std::string> objects; ///< (hash, layout) -> payload
  std::vector<l2_fetch> fetches;
  /// Sent to the store (as its own message, ahead of the reply) when the
  /// first fetch arrives: a session ending while its prefetch is in flight.
  std::optional<store_end_session> end_first;
  store_actor store;
};

/// The longest prefix of f.hashes held for f.layout (world size 1).
l2_actor::behavior_type fake_l2(std::shared_ptr<fake_l2_log> log) {
  return {
    [](l2_write&) {},
    [log](l2_fetch& f) -> l2_fetch_reply {
      log->fetches.push_back(f);
      if (log->end_first) // enqueued ahead of this reply
        caf::anon_send(log->store, *std::exchange(log->end_first, std::nullopt));
      l2_fetch_reply r;
      for (auto h : f.hashes) {
        auto i = log->objects.find({h, f.layout});
        if (i == log->objects.end())
          break;
        r.bytes.push_back(i->second);
        r.skip.push_back(0);
        ++r.chunks;
      }
      return r;
    },
    [](recycle_atom, l2_fetch_reply&) {},
    [](cleared_atom) {},
    [](reannounce_atom) {},
    [](stats_atom) {},
    [](metrics_atom, const caf::actor&) {},
    [](clear_l2_atom) -> uint64_t { return 0; },
    [](l2_quota_limit&) {},
    [](l2_usage_atom) -> l2_usage { return {}; },
    [](l2_list_objects&) -> l2_objects_page { return {}; },
    [](l2_delete_objects&) -> l2_deleted { return {}; },
    [](tick_atom) {},
  };
}

struct groups_fixture : fixture {
  std::shared_ptr<fake_l2_log> log = std::make_shared<fake_l2_log>();
  std::shared_ptr<slot_pool> l1 = make_l1();
  store_actor st;

  groups_fixture() {
    auto p = store_params_for(l1);
    p.l2.actor = spawn(fake_l2, log);
    p.l2.queue = std::make_shared<admit_budget>(int64_t{1} << 30);
    st = spawn(store, std::move(p));
    log->store = st;
    sched.run();
    store_configure c{9, full_bytes};
    c.group_slot_bytes = {full_bytes, window_bytes};
    c.group_windows = {-1, 1};
    c.group_formats = {chunk_format_kv_2ltd, chunk_format_single_plane};
    c.model = "m";
    c.world_size = 1;
    REQUIRE(ask<store_configure_reply>(st, c).value);
  }
  /// Group g's part of chunk c in L2, filled with `fill`.
  void in_l2(uint32_t g, size_t c, char fill) {
    const size_t n = g == 0 ? full_bytes : window_bytes;
    log->objects[{group_hash(prompt[c], g), n}] = std::string(n, fill);
  }
  uint64_t lookup(const std::string& session, size_t n) {
    auto r = ask<uint64_t>(
      st, store_lookup{session, {prompt.begin(), prompt.begin() + static_cast<ptrdiff_t>(n)}, 1,
                       1, "m", ""});
    REQUIRE(r.value);
    return *r.value;
  }
  store_state& state() { return state_of<store_state>(st); }
  std::optional<entry_info> l1_entry(uint32_t g, size_t c) {
    return state().index->find(chunk_key{group_hash(prompt[c], g), 0});
  }
};

std::vector<uint64_t> group_keys(uint32_t g, std::vector<size_t> cs) {
  std::vector<uint64_t> out;
  for (auto c : cs)
    out.push_back(group_hash(prompt[c], g));
  return out;
}

} // namespace

TEST_CASE_FIXTURE(groups_fixture, "hybrid prefetch: full attention first, then the window where "
                                  "its run ends; each group's chunks enter L1 in its format") {
  for (size_t c = 0; c < 4; ++c)
    in_l2(0, c, static_cast<char>('a' + c));
  in_l2(1, 3, 'w');
  in_l2(1, 1, 'v');
  CHECK(lookup("s", 4) == 4u);
  REQUIRE(log->fetches.size() == 2);
  CHECK(log->fetches[0].layout == full_bytes);
  CHECK(log->fetches[0].hashes == group_keys(0, {0, 1, 2, 3}));
  CHECK(log->fetches[0].model == "m");
  CHECK(log->fetches[1].layout == window_bytes);
  CHECK(log->fetches[1].hashes == group_keys(1, {3})); // the window ending at chunk 4
  auto w = l1_entry(1, 3);
  REQUIRE(w);
  CHECK(w->format == chunk_format_single_plane);
  CHECK(w->bytes == window_bytes);
  auto f = l1_entry(0, 2);
  REQUIRE(f);
  CHECK(f->format == chunk_format_kv_2ltd);
  CHECK(!l1_entry(1, 1)); // outside the window: never fetched
  CHECK(state().p.l2.prefetched_chunks == 5);
  // Locks: group 0's 4 chunks and the window's 1, each under its session.
  CHECK(state().index->stats().outstanding_readers == 5);
  CHECK(ask<uint64_t>(st, store_end_session{"s"}).value == 5u);
  CHECK(state().index->stats().outstanding_readers == 0);

  // Everything is in L1 now: a second lookup asks L2 nothing.
  log->fetches.clear();
  CHECK(lookup("t", 4) == 4u);
  CHECK(log->fetches.empty());
  ask<uint64_t>(st, store_end_session{"t"});
}

TEST_CASE_FIXTURE(groups_fixture, "hybrid prefetch: a shorter full-attention run moves the "
                                  "window; L1's part is not fetched again") {
  in_l2(0, 0, 'a');
  in_l2(0, 1, 'b'); // chunks 2..3 of group 0 are nowhere
  in_l2(1, 1, 'v');
  in_l2(1, 3, 'w');
  CHECK(lookup("s", 4) == 2u);
  REQUIRE(log->fetches.size() == 2);
  CHECK(log->fetches[0].hashes == group_keys(0, {0, 1, 2, 3}));
  CHECK(log->fetches[1].hashes == group_keys(1, {1})); // the window ending at chunk 2
  ask<uint64_t>(st, store_end_session{"s"});

  // Group 0's chunk 2 arrives in L2 later; 0..1 are in L1 already.
  in_l2(0, 2, 'c');
  in_l2(1, 2, 'u');
  log->fetches.clear();
  CHECK(lookup("s2", 3) == 3u);
  REQUIRE(log->fetches.size() == 2);
  CHECK(log->fetches[0].hashes == group_keys(0, {2}));
  CHECK(log->fetches[1].hashes == group_keys(1, {2}));
  ask<uint64_t>(st, store_end_session{"s2"});
}

TEST_CASE_FIXTURE(groups_fixture, "hybrid prefetch: a session that ends while its prefetch is "
                                  "in flight gets no hit and holds no lock") {
  for (size_t c = 0; c < 4; ++c)
    in_l2(0, c, 'a');
  in_l2(1, 3, 'w');
  log->end_first = store_end_session{"s"};
  CHECK(lookup("s", 4) == 0u);
  CHECK(log->fetches.size() == 1); // the second phase is not asked for
  CHECK(state().index->stats().outstanding_readers == 0);
  CHECK(!state().ledger->has_session("s"));
  CHECK(state().p.l2.fetches.empty());
  // What came back is in L1 all the same, for the next request.
  CHECK(lookup("r", 4) == 4u);
  CHECK(log->fetches.size() == 2);
  ask<uint64_t>(st, store_end_session{"r"});
}

TEST_CASE_FIXTURE(groups_fixture, "hybrid prefetch: an object of the group's layout but another "
                                  "size ends the run there, never a short L1 entry") {
  in_l2(0, 0, 'a');
  in_l2(0, 1, 'b');
  log->objects[{group_hash(prompt[1], 0), full_bytes}] = std::string(full_bytes / 2, 'x');
  in_l2(0, 2, 'c');
  in_l2(1, 0, 'v');
  in_l2(1, 2, 'w');
  CHECK(lookup("s", 3) == 1u);
  CHECK(!l1_entry(0, 1));
  CHECK(!l1_entry(0, 2)); // loading stops at the bad object
  REQUIRE(log->fetches.size() == 2);
  CHECK(log->fetches[1].hashes == group_keys(1, {0})); // the window ending at chunk 1
  ask<uint64_t>(st, store_end_session{"s"});
}
