#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cache/chunk_hash.hpp"
#include "cache/chunk_index.hpp"
#include "cache/lock_ledger.hpp"
#include "cache_world.hpp"

using namespace kvs;
using namespace std::chrono_literals;

using kvs_test::t0;
using kvs_test::world;

TEST_CASE("lookup locks the hit prefix on every rank") {
  world w(32);
  const std::vector<uint64_t> h{1, 2, 3, 4};
  w.put_all({1, 2, 3}, 2);
  CHECK(w.ledger->lookup("r1", h.data(), h.size(), 2, 1, t0) == 3);
  CHECK(w.ledger->locked_end("r1") == 3);
  CHECK(w.index->outstanding_readers() == 6);
  CHECK(w.ledger->held_readers() == 6);
  CHECK(w.readers(1, 0) == 1);
  CHECK(w.readers(3, 1) == 1);
  CHECK(w.index->locked_entries() == 6);
  // A miss still creates the session (END_SESSION will follow).
  const std::vector<uint64_t> m{9};
  CHECK(w.ledger->lookup("r2", m.data(), 1, 2, 1, t0) == 0);
  CHECK(w.ledger->has_session("r2"));
  CHECK(w.ledger->session_count() == 2);
}

TEST_CASE("a lookup from chunk `base` (LMCache 0.5.7's key.start): absolute indices") {
  world w(32);
  // Chunks 2 and 3 stored; 0 and 1 are the engine's own (never stored here).
  w.put_all({3, 4}, 1);
  const std::vector<uint64_t> suffix{3, 4, 5};
  CHECK(w.ledger->lookup("r", suffix.data(), suffix.size(), 1, 1, t0, 2) == 2);
  // The end of the locked range, absolute: a retrieve of chunks 2..3 is allowed.
  CHECK(w.ledger->locked_end("r") == 4);
  CHECK(w.ledger->held_readers() == 2);
  // Below base nothing is held; releases there count nothing.
  CHECK(w.ledger->release_range("r", 0, 2, t0) == 0);
  CHECK(w.ledger->release_rank("r", 0, 0, 3, t0) == 1); // chunk 2 only
  CHECK(w.readers(3, 0) == 0);
  CHECK(w.readers(4, 0) == 1);
  CHECK(w.ledger->release_range("r", 3, 10, t0) == 1);
  CHECK(w.ledger->held_readers() == 0);
  CHECK(w.index->outstanding_readers() == 0);
  // A repeated lookup from 0 replaces it and releases what it held.
  CHECK(w.ledger->lookup("r", suffix.data(), suffix.size(), 1, 1, t0, 2) == 2);
  CHECK(w.ledger->lookup("r", suffix.data(), suffix.size(), 1, 1, t0) == 2);
  CHECK(w.ledger->locked_end("r") == 2);
  CHECK(w.ledger->end_session("r") == 2);
  CHECK(w.index->outstanding_readers() == 0);
}

TEST_CASE("each rank's retrieve releases its own share") {
  world w(32);
  const std::vector<uint64_t> h{1, 2, 3};
  w.put_all(h, 2);
  REQUIRE(w.ledger->lookup("r", h.data(), 3, 2, 1, t0) == 3);
  CHECK(w.ledger->release_rank("r", 0, 0, 3, t0) == 3);
  CHECK(w.readers(1, 0) == 0);
  CHECK(w.readers(1, 1) == 1);
  CHECK(w.index->outstanding_readers() == 3);
  // Rank 0 again: nothing left to release, nothing stolen from rank 1.
  CHECK(w.ledger->release_rank("r", 0, 0, 3, t0) == 0);
  CHECK(w.index->outstanding_readers() == 3);
  // Out-of-range requests are clamped or ignored.
  CHECK(w.ledger->release_rank("r", 1, 2, 99, t0) == 1);
  CHECK(w.ledger->release_rank("r", 5, 0, 3, t0) == 0);
  CHECK(w.ledger->release_rank("nope", 1, 0, 3, t0) == 0);
  CHECK(w.ledger->release_rank("r", 1, 0, 2, t0) == 2);
  CHECK(w.index->outstanding_readers() == 0);
  CHECK(w.index->locked_entries() == 0);
  CHECK(w.ledger->held_readers() == 0);
}

TEST_CASE("num_kv_readers > 1: each reader releases one") {
  world w(8);
  const std::vector<uint64_t> h{1};
  w.put_all(h, 1);
  REQUIRE(w.ledger->lookup("r", h.data(), 1, 1, 3, t0) == 1);
  CHECK(w.readers(1, 0) == 3);
  CHECK(w.ledger->release_rank("r", 0, 0, 1, t0) == 1);
  CHECK(w.ledger->release_rank("r", 0, 0, 1, t0) == 1);
  CHECK(w.readers(1, 0) == 1);
  CHECK(w.ledger->end_session("r") == 1);
  CHECK(w.index->outstanding_readers() == 0);
}

TEST_CASE("free_lookup_locks releases a chunk range on all ranks") {
  world w(32);
  const std::vector<uint64_t> h{1, 2, 3, 4};
  w.put_all(h, 2);
  REQUIRE(w.ledger->lookup("r", h.data(), 4, 2, 1, t0) == 4);
  // The engine will only retrieve chunks [2, 4): free [0, 2).
  CHECK(w.ledger->release_range("r", 0, 2, t0) == 4);
  CHECK(w.readers(1, 0) == 0);
  CHECK(w.readers(2, 1) == 0);
  CHECK(w.readers(3, 0) == 1);
  CHECK(w.readers(4, 1) == 1);
  CHECK(w.ledger->release_range("r", 0, 2, t0) == 0);  // idempotent
  CHECK(w.ledger->release_rank("r", 0, 2, 4, t0) == 2);
  CHECK(w.ledger->release_range("r", 0, 4, t0) == 2);  // the rest of rank 1
  CHECK(w.index->outstanding_readers() == 0);
}

TEST_CASE("a repeated lookup releases the earlier locks first") {
  world w(32);
  const std::vector<uint64_t> a{1, 2, 3};
  const std::vector<uint64_t> b{1, 5};
  w.put_all({1, 2, 3, 5}, 1);
  REQUIRE(w.ledger->lookup("r", a.data(), 3, 1, 1, t0) == 3);
  REQUIRE(w.ledger->lookup("r", b.data(), 2, 1, 1, t0) == 2);
  CHECK(w.readers(1, 0) == 1);  // released then locked again: not 2
  CHECK(w.readers(2, 0) == 0);
  CHECK(w.readers(3, 0) == 0);
  CHECK(w.readers(5, 0) == 1);
  CHECK(w.index->outstanding_readers() == 2);
  CHECK(w.ledger->locked_end("r") == 2);
}

TEST_CASE("end_session releases everything; sessions are independent") {
  world w(32);
  const std::vector<uint64_t> h{1, 2};
  w.put_all(h, 2);
  REQUIRE(w.ledger->lookup("a", h.data(), 2, 2, 1, t0) == 2);
  REQUIRE(w.ledger->lookup("b", h.data(), 2, 2, 1, t0) == 2);
  CHECK(w.readers(2, 1) == 2);
  CHECK(w.ledger->end_session("a") == 4);
  CHECK_FALSE(w.ledger->has_session("a"));
  CHECK(w.ledger->end_session("a") == 0);
  CHECK(w.readers(2, 1) == 1);  // b still holds its share
  CHECK(w.index->outstanding_readers() == 4);
  CHECK(w.ledger->end_session("b") == 4);
  CHECK(w.index->outstanding_readers() == 0);
  CHECK(w.ledger->session_count() == 0);
}

TEST_CASE("idle sessions expire and release their locks") {
  ledger_options lo;
  lo.session_ttl = 600s;
  world w(16, {}, lo);
  const std::vector<uint64_t> h{1};
  w.put_all(h, 1);
  REQUIRE(w.ledger->lookup("old", h.data(), 1, 1, 1, t0) == 1);
  REQUIRE(w.ledger->lookup("new", h.data(), 1, 1, 1, t0 + 300s) == 1);
  CHECK(w.ledger->expire_sessions(t0 + 599s) == 0);
  CHECK(w.ledger->expire_sessions(t0 + 600s) == 1);
  CHECK_FALSE(w.ledger->has_session("old"));
  CHECK(w.readers(1, 0) == 1);
  // Activity keeps a session alive.
  w.ledger->release_range("new", 5, 6, t0 + 800s);
  CHECK(w.ledger->expire_sessions(t0 + 1300s) == 0);
  CHECK(w.ledger->expire_sessions(t0 + 1400s) == 1);
  CHECK(w.index->outstanding_readers() == 0);
}

TEST_CASE("a lock the index expired is not released twice") {
  index_options io;
  io.lock_ttl = 300s;
  world w(16, io);
  const std::vector<uint64_t> h{1};
  w.put_all(h, 1);
  REQUIRE(w.ledger->lookup("slow", h.data(), 1, 1, 1, t0) == 1);
  REQUIRE(w.index->expire_locks(t0 + 300s) == 1);
  // Another request locks the same chunk in a new lock lifetime.
  REQUIRE(w.ledger->lookup("fresh", h.data(), 1, 1, 1, t0 + 301s) == 1);
  // The slow worker finally retrieves: its share is gone, fresh keeps its.
  w.ledger->release_rank("slow", 0, 0, 1, t0 + 302s);
  CHECK(w.readers(1, 0) == 1);
  CHECK(w.index->stats().stale_unlocks == 1);
  CHECK(w.ledger->end_session("slow") == 0);
  CHECK(w.ledger->end_session("fresh") == 1);
  CHECK(w.index->outstanding_readers() == 0);
  CHECK(w.ledger->held_readers() == 0);
}

TEST_CASE("locks taken by a lookup protect chunks from eviction") {
  index_options io;
  io.evict_high = 1.0;
  io.evict_low = 0.0;
  world w(4, io);
  const std::vector<uint64_t> h{1, 2};
  w.put_all({1, 2, 3, 4}, 1);
  REQUIRE(w.ledger->lookup("r", h.data(), 2, 1, 1, t0) == 2);
  auto r = w.index->reserve(chunk_key{5, 0}, 64, t0);
  REQUIRE(r.status == reserve_status::reserved);
  CHECK(r.evicted.size() == 2);
  for (auto& k : r.evicted) CHECK((k.hash == 3 || k.hash == 4));
  CHECK(w.ledger->release_rank("r", 0, 0, 2, t0) == 2);
  REQUIRE(w.index->commit(chunk_key{5, 0}));
  w.put(6, 0);  // fills the pool: 1 2 5 6
  // Unlocked now: evictable again.
  auto r2 = w.index->reserve(chunk_key{7, 0}, 64, t0);
  REQUIRE(r2.status == reserve_status::reserved);
  std::vector<uint64_t> ev;
  for (auto& k : r2.evicted) ev.push_back(k.hash);
  CHECK(ev == std::vector<uint64_t>{1, 2, 5, 6});
}

// The central invariant: whatever the engine does, in any order, ending all
// sessions (and releasing the store's own direct locks) leaves no reader in
// the index. Along the way, every lock the ledger or a direct holder still
// believes alive matches the index exactly, locked chunks survive every
// store, and the index's internal structures stay consistent.
TEST_CASE("randomized: ending all sessions always leaves zero locks") {
  index_options io;
  io.evict_high = 0.9;
  io.evict_low = 0.6;
  io.lock_ttl = 50s;
  io.reserve_ttl = 100s;
  ledger_options lo;
  lo.session_ttl = 200s;
  world w(24, io, lo);
  const int ws = 2;
  const int n_sessions = 12;
  const size_t seq_chunks = 8;

  // Six sequences; pairs share leading chunks so prefixes overlap.
  std::vector<std::vector<uint64_t>> seqs;
  {
    std::mt19937_64 tok_rng(7);
    const uint64_t seed = identity_seed("model", ws, "");
    std::vector<int64_t> base(seq_chunks * 4);
    for (int s = 0; s < 6; ++s) {
      if (s % 2 == 0)
        for (auto& t : base) t = static_cast<int64_t>(tok_rng() % 1000);
      else
        for (size_t i = 12; i < base.size(); ++i)
          base[i] = static_cast<int64_t>(tok_rng() % 1000);  // share 3 chunks
      seqs.push_back(chunk_hashes(base.data(), base.size(), 4, seed));
      REQUIRE(seqs.back().size() == seq_chunks);
    }
    CHECK(seqs[0][2] == seqs[1][2]);
    CHECK(seqs[0][3] != seqs[1][3]);
  }

  std::mt19937_64 rng(20261130);
  auto pick = [&](uint64_t n) { return static_cast<size_t>(rng() % n); };
  auto now = t0;
  std::vector<chunk_key> pending;     // reservations not yet committed
  std::vector<lock_token> direct;     // the store's own short locks
  uint64_t lookups_with_hits = 0, releases = 0;

  auto alive_tokens = [&]() {
    std::vector<lock_token> out;
    w.ledger->for_each_held([&](const std::string&, const lock_token& t, uint32_t) {
      if (w.index->lock_alive(t)) out.push_back(t);
    });
    for (auto& t : direct)
      if (w.index->lock_alive(t)) out.push_back(t);
    return out;
  };

  auto check_all = [&](int step) {
    auto inv = w.index->check_invariants();
    INFO("step " << step << ": " << (inv ? "" : inv.error_value().detail));
    REQUIRE(inv);
    // Every reader the index counts belongs to a live ledger hold or a live
    // direct lock, and vice versa.
    std::map<std::pair<uint64_t, int32_t>, uint64_t> expect;
    w.ledger->for_each_held([&](const std::string&, const lock_token& t, uint32_t n) {
      if (w.index->lock_alive(t)) expect[{t.key.hash, t.key.rank}] += n;
    });
    for (auto& t : direct)
      if (w.index->lock_alive(t)) expect[{t.key.hash, t.key.rank}] += 1;
    uint64_t sum = 0;
    for (auto& [k, n] : expect) {
      auto e = w.index->find(chunk_key{k.first, k.second});
      REQUIRE(e);
      REQUIRE(e->state == entry_state::committed);
      REQUIRE(e->readers == n);
      sum += n;
    }
    REQUIRE(sum == w.index->outstanding_readers());
  };

  for (int step = 0; step < 20000; ++step) {
    const size_t op = pick(100);
    const std::string sid = "req-" + std::to_string(pick(n_sessions));
    const auto& seq = seqs[pick(seqs.size())];
    if (op < 30) {  // STORE of a prefix by every rank (sometimes just one)
      const auto before = alive_tokens();
      const size_t len = 1 + pick(seq_chunks);
      const bool one_rank = pick(5) == 0;
      const int only = static_cast<int>(pick(ws));
      for (size_t j = 0; j < len * ws; ++j) {
        const size_t i = j / ws;
        const int rank = one_rank ? only : static_cast<int>(j % ws);
        chunk_key k{seq[i], rank};
        auto r = w.index->reserve(k, 64, now);
        if (r.status != reserve_status::reserved) continue;
        const size_t fate = pick(20);
        if (fate < 17) REQUIRE(w.index->commit(k));
        else if (fate < 19) REQUIRE(w.index->abort(k));
        else pending.push_back(k);
      }
      for (auto& t : before) REQUIRE(w.index->lock_alive(t));  // never evicted
    } else if (op < 35) {  // a copy in flight finishes
      if (!pending.empty()) {
        const size_t i = pick(pending.size());
        if (pick(2)) w.index->commit(pending[i]);
        else w.index->abort(pending[i]);
        pending.erase(pending.begin() + static_cast<long>(i));
      }
    } else if (op < 55) {  // LOOKUP (worker_id nil)
      const size_t n = 1 + pick(seq_chunks);
      const uint32_t readers = pick(5) == 0 ? 2 : 1;
      if (w.ledger->lookup(sid, seq.data(), n, ws, readers, now) > 0) ++lookups_with_hits;
    } else if (op < 70) {  // a worker's RETRIEVE finished
      const size_t b = pick(seq_chunks), e = b + pick(seq_chunks + 1);
      releases += w.ledger->release_rank(sid, static_cast<int>(pick(ws)), b, e, now);
    } else if (op < 78) {  // FREE_LOOKUP_LOCKS
      const size_t b = pick(seq_chunks), e = b + pick(seq_chunks + 1);
      releases += w.ledger->release_range(sid, b, e, now);
    } else if (op < 85) {  // END_SESSION
      releases += w.ledger->end_session(sid);
    } else if (op < 89) {  // the store locks a chunk for a direct retrieve
      chunk_key k{seq[pick(seq_chunks)], static_cast<int32_t>(pick(ws))};
      if (auto t = w.index->lock(k, 1, now)) direct.push_back(*t);
    } else if (op < 93) {  // ... and releases it
      if (!direct.empty()) {
        const size_t i = pick(direct.size());
        w.index->unlock(direct[i]);
        direct.erase(direct.begin() + static_cast<long>(i));
      }
    } else if (op < 99) {  // time passes; TTLs run
      now += std::chrono::seconds(pick(40));
      w.index->expire_locks(now);
      w.ledger->expire_sessions(now);
      for (auto& k : w.index->expire_reservations(now)) {
        for (size_t i = 0; i < pending.size(); ++i)
          if (pending[i] == k) {
            pending.erase(pending.begin() + static_cast<long>(i));
            break;
          }
      }
    } else {  // CLEAR
      w.index->clear();
    }
    check_all(step);
  }

  // The run must have exercised the interesting paths.
  const auto s = w.index->stats();
  CHECK(lookups_with_hits > 500);
  CHECK(releases > 500);
  CHECK(s.evictions > 100);
  CHECK(s.reserve_no_space > 0);
  CHECK(s.expired_locks > 0);
  CHECK(s.stale_unlocks > 0);
  CHECK(s.expired_reservations > 0);
  MESSAGE("evictions=" << s.evictions << " no_space=" << s.reserve_no_space
          << " expired_locks=" << s.expired_locks
          << " stale_unlocks=" << s.stale_unlocks
          << " lookups_with_hits=" << lookups_with_hits);

  for (int i = 0; i < n_sessions; ++i) w.ledger->end_session("req-" + std::to_string(i));
  for (auto& t : direct) w.index->unlock(t);
  CHECK(w.ledger->session_count() == 0);
  CHECK(w.ledger->held_readers() == 0);
  CHECK(w.index->outstanding_readers() == 0);
  CHECK(w.index->locked_entries() == 0);
  auto inv = w.index->check_invariants();
  INFO((inv ? "" : inv.error_value().detail));
  CHECK(inv);
}
