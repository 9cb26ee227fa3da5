// The store's /cache/objects and /cache/checksums side
// (actors/cache/store_objects.cpp), driven deterministically: pages that add up,
// filters by salt and model, a delete that keeps what a reader holds and
// takes the rest off the quota accounting, and the checksum read locks.
#include "actor_cache_fixture.hpp"

#include <cstring>
#include <map>

using namespace kvs;
using namespace kvs::test;

namespace {

/// Stores `hs` (8 KiB chunks of instance 7) under `salt`, each filled with
/// the low byte of its hash.
void put(fixture& f, store_actor st, std::vector<uint64_t> hs,
         const std::string& salt) {
  auto res = f.ask<store_reserve_reply>(st, store_reserve{7, 0, hs});
  REQUIRE(res.value);
  REQUIRE(res.value->chunks.size() == hs.size());
  for (auto& c : res.value->chunks)
    std::memset(c.slot, static_cast<int>(hs[c.position] & 0xff), 8192);
  store_finish fin;
  fin.commit = true;
  fin.hashes = hs;
  fin.tokens.resize(hs.size());
  fin.parents.resize(hs.size());
  fin.model = "org/m";
  fin.salt = salt;
  caf::anon_send(st, fin);
  f.sched.run();
}

} // namespace

TEST_CASE_FIXTURE(fixture, "store objects: listed in pages, deleted by salt, locked for checksums") {
  auto l1 = make_l1();
  auto st = spawn_store(l1);
  sched.run();
  auto& state = state_of<store_state>(st);
  REQUIRE(ask<store_configure_reply>(st, store_configure{7, 8192}).value);
  put(*this, st, {1, 2, 3}, "a");
  put(*this, st, {4, 5}, "");

  // Pages of two add up to the five, each with its salt and model.
  std::map<uint64_t, stored_object> seen;
  store_list_objects q;
  q.limit = 2;
  int pages = 0;
  for (bool done = false; !done && pages < 10; ++pages) {
    auto r = ask<store_objects_page>(st, q);
    REQUIRE(r.value);
    CHECK(r.value->objects.size() <= 2);
    for (auto& o : r.value->objects)
      CHECK(seen.emplace(o.key.hash, o).second);
    done = r.value->done;
    q.cursor = r.value->next_cursor;
  }
  CHECK(pages == 3);
  REQUIRE(seen.size() == 5);
  for (auto& [h, o] : seen) {
    CHECK(o.salt == (h <= 3 ? "a" : ""));
    CHECK(o.model == "org/m");
    CHECK(o.bytes == 8192);
    CHECK(!o.locked);
  }
  // A filter: salt "" only, model "x" none.
  store_list_objects by_salt;
  by_salt.limit = 100;
  by_salt.filter.by_salt = true;
  auto empty_salt = ask<store_objects_page>(st, by_salt);
  REQUIRE(empty_salt.value);
  CHECK(empty_salt.value->objects.size() == 2);
  store_list_objects by_model = by_salt;
  by_model.filter.by_salt = false;
  by_model.filter.by_model = true;
  by_model.filter.model = "x";
  CHECK(ask<store_objects_page>(st, by_model).value->objects.empty());

  // Checksum locks: the bytes in place, read-locked until given back.
  store_lock_chunks lock;
  lock.keys = {chunk_key{2, 0}, chunk_key{9, 0}};
  auto locked = ask<store_locked_chunks>(st, lock);
  REQUIRE(locked.value);
  REQUIRE(locked.value->objects.size() == 2);
  CHECK(locked.value->objects[0].found);
  CHECK(locked.value->objects[0].data[0] == std::byte{2});
  CHECK(locked.value->objects[0].data[8191] == std::byte{2});
  CHECK(!locked.value->objects[1].found);
  CHECK(state.index->stats().outstanding_readers == 1);

  // Delete salt "a": chunk 2 is held, so it stays and is counted.
  store_delete_objects del;
  del.filter.by_salt = true;
  del.filter.salt = "a";
  auto d = ask<store_deleted>(st, del);
  REQUIRE(d.value);
  CHECK(d.value->removed == 2);
  CHECK(d.value->locked == 1);
  CHECK(state.index->stats().chunks == 3);
  CHECK(state.quota.usage("a").bytes == 8192);
  CHECK(state.quota.usage("").bytes == 2 * 8192);

  caf::anon_send(st, store_unlock_chunks{locked.value->tokens});
  sched.run();
  CHECK(state.index->stats().outstanding_readers == 0);
  // Given back, it goes with the next delete; by key it must name its salt.
  store_delete_objects by_key;
  by_key.by_keys = true;
  stored_object wrong;
  wrong.key = chunk_key{2, 0};
  wrong.model = "org/m";
  wrong.salt = "b";
  by_key.named = {wrong};
  CHECK(ask<store_deleted>(st, by_key).value->removed == 0);
  by_key.named[0].salt = "a";
  CHECK(ask<store_deleted>(st, by_key).value->removed == 1);
  CHECK(state.quota.usage("a").bytes == 0);
  CHECK(state.index->stats().chunks == 2);
}
