#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "cache/chunk_index.hpp"

using namespace kvs;
using namespace std::chrono_literals;

namespace {

const cache_clock::time_point t0{std::chrono::hours(1000)};

struct fixture {
  std::unique_ptr<slot_pool> pool;
  std::unique_ptr<chunk_index> index;

  explicit fixture(size_t slots, index_options o = {}) {
    pool_options po;
    po.capacity_bytes = slots * 64;
    po.hugepages = false;
    po.slot_align = 64;
    pool = slot_pool::create(po).value();
    REQUIRE(pool);
    index = std::make_unique<chunk_index>(*pool, o);
  }
  // reserve + commit
  reserve_result put(uint64_t h, int rank = 0, size_t bytes = 64) {
    auto r = index->reserve(chunk_key{h, rank}, bytes, t0);
    if (r.status == reserve_status::reserved) REQUIRE(index->commit(chunk_key{h, rank}));
    return r;
  }
  void check() {
    auto inv = index->check_invariants();
    INFO((inv ? "" : inv.error_value().detail));
    CHECK(inv);
  }
};

std::vector<uint64_t> keys_of(const std::vector<chunk_key>& v) {
  std::vector<uint64_t> out;
  for (auto& k : v) out.push_back(k.hash);
  return out;
}

} // namespace

TEST_CASE("single-rank prefix: contiguous leading run of committed chunks") {
  fixture f(16);
  const uint64_t h[] = {11, 12, 13, 14};
  f.put(11);
  f.put(12);
  f.put(13);
  CHECK(f.index->lookup_prefix_rank(h, 4, 0) == 3);
  CHECK(f.index->lookup_prefix_rank(h, 2, 0) == 2);
  CHECK(f.index->lookup_prefix_rank(h, 0, 0) == 0);
  CHECK(f.index->lookup_prefix_rank(h, 4, 1) == 0);  // other rank has nothing
  // A hole stops the run even when later chunks are present.
  REQUIRE(f.index->erase(chunk_key{12, 0}));
  CHECK(f.index->lookup_prefix_rank(h, 4, 0) == 1);
  f.check();
}

TEST_CASE("reserved chunks are invisible until committed") {
  fixture f(16);
  const uint64_t h[] = {1, 2};
  f.put(1);
  auto r = f.index->reserve(chunk_key{2, 0}, 64, t0);
  REQUIRE(r.status == reserve_status::reserved);
  CHECK(f.index->lookup_prefix_rank(h, 2, 0) == 1);
  REQUIRE(f.index->commit(chunk_key{2, 0}));
  CHECK(f.index->lookup_prefix_rank(h, 2, 0) == 2);
  CHECK_FALSE(f.index->commit(chunk_key{2, 0}));  // already committed
  f.check();
}

TEST_CASE("multi-rank lookup: a chunk hits only if every rank has it") {
  fixture f(32);
  const uint64_t h[] = {1, 2, 3};
  for (uint64_t x : h) f.put(x, 0);
  f.put(1, 1);
  f.put(3, 1);  // rank 1 misses chunk 2
  CHECK(f.index->lookup_prefix(h, 3, 1) == 3);
  CHECK(f.index->lookup_prefix(h, 3, 2) == 1);
  CHECK(f.index->lookup_prefix(h, 3, 3) == 0);  // rank 2 has nothing
  CHECK(f.index->lookup_prefix(h, 3, 0) == 0);  // nonsense world size
  f.put(2, 1);
  CHECK(f.index->lookup_prefix(h, 3, 2) == 3);
  // Rank 1 still reserving chunk 3 of a longer prefix: not a hit yet.
  const uint64_t h4[] = {1, 2, 3, 4};
  f.put(4, 0);
  REQUIRE(f.index->reserve(chunk_key{4, 1}, 64, t0).status == reserve_status::reserved);
  CHECK(f.index->lookup_prefix(h4, 4, 2) == 3);
  f.check();
}

TEST_CASE("lookup stats count hits and misses") {
  fixture f(8);
  const uint64_t h[] = {1, 2, 3, 4, 5};
  f.put(1);
  f.put(2);
  CHECK(f.index->lookup_prefix_rank(h, 5, 0) == 2);
  CHECK(f.index->lookup_prefix(h, 5, 1) == 2);
  auto s = f.index->stats();
  CHECK(s.lookups == 2);
  CHECK(s.hit_chunks == 4);
  CHECK(s.miss_chunks == 6);
}

TEST_CASE("double reserve never copies twice") {
  fixture f(8);
  auto a = f.index->reserve(chunk_key{5, 0}, 64, t0);
  REQUIRE(a.status == reserve_status::reserved);
  auto b = f.index->reserve(chunk_key{5, 0}, 64, t0);
  CHECK(b.status == reserve_status::already_present);
  CHECK(b.existing == entry_state::reserved);
  CHECK(b.data == nullptr);
  REQUIRE(f.index->commit(chunk_key{5, 0}));
  auto c = f.index->reserve(chunk_key{5, 0}, 64, t0);
  CHECK(c.status == reserve_status::already_present);
  CHECK(c.existing == entry_state::committed);
  // Same hash on another rank is another chunk.
  CHECK(f.index->reserve(chunk_key{5, 1}, 64, t0).status == reserve_status::reserved);
  CHECK(f.pool->slots_used() == 2);
  f.check();
}

TEST_CASE("abort frees a reservation and its slot") {
  index_options o;
  o.evict_high = 1.0;  // no eviction in a 2-slot pool
  fixture f(2, o);
  auto a = f.index->reserve(chunk_key{1, 0}, 64, t0);
  auto b = f.index->reserve(chunk_key{2, 0}, 32, t0);
  REQUIRE(a.status == reserve_status::reserved);
  REQUIRE(b.status == reserve_status::reserved);
  CHECK(a.slot != b.slot);
  CHECK(a.data == f.pool->data(a.slot));
  CHECK(b.offset == f.pool->offset(b.slot));
  CHECK(f.index->stats().bytes_used == 96);
  CHECK(f.index->abort(chunk_key{1, 0}));
  CHECK_FALSE(f.index->abort(chunk_key{1, 0}));
  CHECK_FALSE(f.index->find(chunk_key{1, 0}).has_value());
  CHECK(f.pool->slots_used() == 1);
  CHECK(f.index->stats().bytes_used == 32);
  REQUIRE(f.index->commit(chunk_key{2, 0}));
  CHECK_FALSE(f.index->abort(chunk_key{2, 0}));  // committed: not abortable
  // The freed slot is reused.
  auto c = f.index->reserve(chunk_key{3, 0}, 64, t0);
  CHECK(c.status == reserve_status::reserved);
  CHECK(c.slot == a.slot);
  f.check();
}

TEST_CASE("watermarks: evict LRU down to evict_low when evict_high is crossed") {
  index_options o;
  o.evict_high = 0.9;
  o.evict_low = 0.5;
  fixture f(10, o);
  for (uint64_t i = 0; i < 9; ++i) {
    auto r = f.put(100 + i);
    CHECK(r.evicted.empty());  // up to 9 of 10 slots: at the high mark
  }
  auto r = f.put(109);  // 10th slot would exceed 90%
  REQUIRE(r.status == reserve_status::reserved);
  // Evicted until used + new <= 5, oldest first.
  CHECK(keys_of(r.evicted) == std::vector<uint64_t>{100, 101, 102, 103, 104});
  CHECK(f.pool->slots_used() == 5);
  CHECK(f.index->stats().evictions == 5);
  CHECK(f.index->stats().chunks == 5);
  f.check();
}

TEST_CASE("eviction follows recency: touch and lock-release refresh") {
  index_options o;
  o.evict_high = 1.0;
  o.evict_low = 1.0;  // evict exactly one when full
  fixture f(4, o);
  for (uint64_t i = 1; i <= 4; ++i) f.put(i);
  CHECK(f.index->touch(chunk_key{1, 0}));           // order now 2 3 4 1
  CHECK_FALSE(f.index->touch(chunk_key{99, 0}));
  auto r = f.put(5);
  CHECK(keys_of(r.evicted) == std::vector<uint64_t>{2});
  // A lock taken and released makes the chunk most recent.
  auto t = f.index->lock(chunk_key{3, 0}, 1, t0);
  REQUIRE(t);
  CHECK(f.index->unlock(*t) == 1);                  // order now 4 1 5 3
  CHECK(keys_of(f.put(6).evicted) == std::vector<uint64_t>{4});
  CHECK(keys_of(f.put(7).evicted) == std::vector<uint64_t>{1});
  f.check();
}

TEST_CASE("a locked chunk is never evicted") {
  index_options o;
  o.evict_high = 1.0;
  o.evict_low = 0.0;  // evict everything evictable when full
  fixture f(4, o);
  for (uint64_t i = 1; i <= 4; ++i) f.put(i);
  auto t1 = f.index->lock(chunk_key{1, 0}, 2, t0);
  auto t3 = f.index->lock(chunk_key{3, 0}, 1, t0);
  REQUIRE(t1);
  REQUIRE(t3);
  auto r = f.put(5);
  REQUIRE(r.status == reserve_status::reserved);
  CHECK(keys_of(r.evicted) == std::vector<uint64_t>{2, 4});
  CHECK(f.index->find(chunk_key{1, 0})->readers == 2);
  CHECK(f.index->find(chunk_key{3, 0})->readers == 1);
  CHECK(f.index->stats().locked_entries == 2);
  CHECK(f.index->outstanding_readers() == 3);
  f.check();
}

TEST_CASE("no space: every slot locked or reserved, with a reason") {
  index_options o;
  o.evict_high = 1.0;
  fixture f(3, o);
  f.put(1);
  f.put(2);
  REQUIRE(f.index->reserve(chunk_key{3, 0}, 64, t0).status == reserve_status::reserved);
  REQUIRE(f.index->lock(chunk_key{1, 0}, 1, t0));
  REQUIRE(f.index->lock(chunk_key{2, 0}, 1, t0));
  auto r = f.index->reserve(chunk_key{4, 0}, 64, t0);
  CHECK(r.status == reserve_status::no_space);
  CHECK(r.reason == no_space_reason::all_pinned);
  CHECK(std::string(to_string(r.reason)) == "all_pinned");
  CHECK(r.detail.find("2 read-locked and 1 reserved") != std::string::npos);
  CHECK(r.evicted.empty());
  CHECK(f.index->stats().reserve_no_space == 1);
  CHECK_FALSE(f.index->find(chunk_key{4, 0}).has_value());
  f.check();
}

TEST_CASE("no space reasons: oversized and empty chunks") {
  pool_options po;
  po.capacity_bytes = 4096;
  po.hugepages = false;
  auto pool = slot_pool::create(po).value();
  REQUIRE(pool);
  chunk_index idx(*pool);
  auto r = idx.reserve(chunk_key{1, 0}, 4097, t0);
  CHECK(r.status == reserve_status::no_space);
  CHECK(r.reason == no_space_reason::chunk_too_large);
  CHECK(r.detail.find("4097") != std::string::npos);
  r = idx.reserve(chunk_key{1, 0}, 0, t0);
  CHECK(r.reason == no_space_reason::invalid_size);
  // Any size up to the region gets a slot of its own size.
  r = idx.reserve(chunk_key{1, 0}, 500, t0);
  CHECK(r.status == reserve_status::reserved);
  CHECK(idx.find(chunk_key{1, 0})->bytes == 500);
  r = idx.reserve(chunk_key{2, 0}, 3000, t0);
  CHECK(r.status == reserve_status::reserved);
  CHECK(idx.find(chunk_key{2, 0})->bytes == 3000);
  CHECK(idx.stats().reserve_no_space == 2);
}

// --- several chunk sizes in one region (several models / layouts) ----------

TEST_CASE("two chunk sizes share the region and one LRU") {
  index_options o;
  o.evict_high = 1.0;
  o.evict_low = 1.0;  // evict only what the new chunk needs
  fixture f(8, o);    // 8 x 64 bytes
  // Model A: 64-byte chunks; model B: 128-byte chunks.
  f.put(1, 0, 64);   // [0, 64)
  f.put(2, 0, 128);  // [64, 192)
  f.put(3, 0, 64);   // [192, 256)
  f.put(4, 0, 128);  // [256, 384)
  f.put(5, 0, 64);   // [384, 448)
  f.put(6, 0, 64);   // [448, 512): full
  CHECK(f.index->find(chunk_key{2, 0})->bytes == 128);
  CHECK(f.index->stats().slot_bytes_used == 512);
  // Two 64-byte holes: 128 bytes free in all, but not in one run.
  REQUIRE(f.index->erase(chunk_key{3, 0}));
  REQUIRE(f.index->erase(chunk_key{6, 0}));
  // LRU: 1, 2, 4, 5. Freeing 1 opens 64 bytes only: it stays. Freeing 2
  // joins the hole after it (128 + 64): the oldest chunk that helps goes.
  auto r = f.put(7, 0, 128);
  REQUIRE(r.status == reserve_status::reserved);
  CHECK(keys_of(r.evicted) == std::vector<uint64_t>{2});
  CHECK(f.index->find(chunk_key{1, 0}).has_value());
  f.check();
  // Best fit fills the 64-byte holes without eviction.
  CHECK(f.put(8, 0, 64).evicted.empty());
  CHECK(f.put(9, 0, 64).evicted.empty());
  CHECK(f.index->stats().slot_bytes_used == 512);
  // Full: a 64-byte chunk evicts the globally oldest chunk (1), and a
  // 128-byte chunk the next oldest (4, of the other size).
  CHECK(keys_of(f.put(10, 0, 64).evicted) == std::vector<uint64_t>{1});
  CHECK(keys_of(f.put(11, 0, 128).evicted) == std::vector<uint64_t>{4});
  f.check();
}

TEST_CASE("older chunks that would not open a run stay; a neighbour of a hole qualifies") {
  index_options o;
  o.evict_high = 1.0;
  o.evict_low = 1.0;
  fixture f(8, o);
  f.put(10, 0, 64);   // a [0, 64)
  f.put(11, 0, 64);   // b [64, 128)
  f.put(12, 0, 64);   // c [128, 192)
  f.put(13, 0, 64);   // d [192, 256)
  f.put(14, 0, 128);  // e [256, 384)
  f.put(15, 0, 64);   // f [384, 448)
  f.put(16, 0, 64);   // g [448, 512)
  REQUIRE(f.index->erase(chunk_key{11, 0}));  // hole [64, 128)
  REQUIRE(f.index->erase(chunk_key{15, 0}));  // hole [384, 448)
  f.index->touch(chunk_key{10, 0});
  f.index->touch(chunk_key{12, 0});
  // LRU: d, e, g, a, c. d is walled in by c and e (64 only): it stays; e
  // joins the hole after it (128 + 64): e goes, though larger.
  auto r = f.put(20, 0, 128);
  CHECK(keys_of(r.evicted) == std::vector<uint64_t>{14});
  CHECK(f.index->find(chunk_key{13, 0}).has_value());
  f.check();
  // 20 took [256, 384) (best fit in the merged run [256, 448)); free:
  // [64, 128) and [384, 448). LRU: d, g, a, c, 20. d is still walled in;
  // g borders the hole before it (64 + 64): g goes.
  r = f.put(21, 0, 128);
  CHECK(keys_of(r.evicted) == std::vector<uint64_t>{16});
  CHECK(f.index->find(chunk_key{13, 0}).has_value());
  f.check();
}

TEST_CASE("when no single chunk opens a run, the oldest go until one does") {
  index_options o;
  o.evict_high = 1.0;
  o.evict_low = 1.0;
  fixture f(4, o);
  for (uint64_t h = 1; h <= 4; ++h) f.put(h, 0, 64);
  // 256 bytes need all four: evicted oldest first, all of them.
  auto r = f.put(9, 0, 256);
  REQUIRE(r.status == reserve_status::reserved);
  CHECK(keys_of(r.evicted) == std::vector<uint64_t>{1, 2, 3, 4});
  f.check();
  // With one of four locked, a 256-byte chunk cannot fit: no space, and
  // the unlocked ones went trying (the log says why).
  fixture g(4, o);
  for (uint64_t h = 1; h <= 4; ++h) g.put(h, 0, 64);
  REQUIRE(g.index->lock(chunk_key{3, 0}, 1, t0));
  r = g.index->reserve(chunk_key{9, 0}, 256, t0);
  CHECK(r.status == reserve_status::no_space);
  CHECK(r.reason == no_space_reason::all_pinned);
  CHECK(r.detail.find("1 read-locked and 0 reserved") != std::string::npos);
  g.check();
}

TEST_CASE("watermarks count bytes of every size") {
  index_options o;
  o.evict_high = 0.75;
  o.evict_low = 0.5;
  fixture f(8, o);  // 512 bytes: high 384, low 256
  f.put(1, 0, 128);
  f.put(2, 0, 64);
  f.put(3, 0, 128);  // 320 used
  auto r = f.put(4, 0, 64);  // 384: at the high mark, no eviction
  CHECK(r.evicted.empty());
  // 384 + 128 > 384: evict least-recently-used first, whatever the size,
  // until used + 128 <= 256.
  r = f.put(5, 0, 128);
  CHECK(keys_of(r.evicted) == std::vector<uint64_t>{1, 2, 3});
  CHECK(f.index->stats().slot_bytes_used == 64 + 128);
  f.check();
}

TEST_CASE("locks: counts, refresh, unlock, wrong targets") {
  index_options o;
  o.lock_ttl = 10s;
  fixture f(8, o);
  f.put(1);
  REQUIRE(f.index->reserve(chunk_key{2, 0}, 64, t0).status == reserve_status::reserved);
  CHECK_FALSE(f.index->lock(chunk_key{2, 0}, 1, t0));  // reserved: not lockable
  CHECK_FALSE(f.index->lock(chunk_key{9, 0}, 1, t0));  // absent
  CHECK_FALSE(f.index->lock(chunk_key{1, 0}, 0, t0));  // no readers
  auto a = f.index->lock(chunk_key{1, 0}, 2, t0);
  auto b = f.index->lock(chunk_key{1, 0}, 1, t0 + 5s);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->epoch == b->epoch);  // one lifetime
  CHECK(f.index->find(chunk_key{1, 0})->readers == 3);
  CHECK(f.index->find(chunk_key{1, 0})->lock_expiry == t0 + 15s);
  CHECK(f.index->unlock(*a, 5) == 3);  // clamps to what is held
  CHECK(f.index->outstanding_readers() == 0);
  CHECK(f.index->locked_entries() == 0);
  // The lifetime ended: its tokens are stale now, even after a new lock.
  auto c = f.index->lock(chunk_key{1, 0}, 1, t0);
  REQUIRE(c);
  CHECK(c->epoch != a->epoch);
  CHECK_FALSE(f.index->lock_alive(*a));
  CHECK(f.index->lock_alive(*c));
  CHECK(f.index->unlock(*b) == 0);
  CHECK(f.index->stats().stale_unlocks == 1);
  CHECK(f.index->find(chunk_key{1, 0})->readers == 1);
  CHECK(f.index->unlock(*c) == 1);
  f.check();
}

TEST_CASE("lock TTL: expire_locks drops stale locks; late unlocks are no-ops") {
  index_options o;
  o.lock_ttl = 10s;
  o.evict_high = 1.0;
  o.evict_low = 1.0;
  fixture f(2, o);
  f.put(1);
  f.put(2);
  auto t1 = f.index->lock(chunk_key{1, 0}, 1, t0);
  auto t2 = f.index->lock(chunk_key{2, 0}, 1, t0 + 5s);
  REQUIRE(t1);
  REQUIRE(t2);
  CHECK(f.index->reserve(chunk_key{3, 0}, 64, t0).reason == no_space_reason::all_pinned);
  CHECK(f.index->expire_locks(t0 + 9s) == 0);
  CHECK(f.index->expire_locks(t0 + 10s) == 1);  // chunk 1's lock ran out
  CHECK(f.index->outstanding_readers() == 1);
  CHECK(f.index->stats().expired_locks == 1);
  // Chunk 1 is evictable again.
  auto r = f.index->reserve(chunk_key{3, 0}, 64, t0 + 10s);
  REQUIRE(r.status == reserve_status::reserved);
  CHECK(keys_of(r.evicted) == std::vector<uint64_t>{1});
  REQUIRE(f.index->commit(chunk_key{3, 0}));
  // Re-stored under the same key: the old token must not touch the new lock.
  REQUIRE(f.index->expire_locks(t0 + 15s) == 1);
  // 2's lock ended after 3 was committed, so 3 is now least recent.
  CHECK(keys_of(f.put(1).evicted) == std::vector<uint64_t>{3});
  auto t1b = f.index->lock(chunk_key{1, 0}, 1, t0 + 20s);
  REQUIRE(t1b);
  CHECK(f.index->unlock(*t1) == 0);
  CHECK(f.index->unlock(*t2) == 0);
  CHECK(f.index->find(chunk_key{1, 0})->readers == 1);
  CHECK(f.index->unlock(*t1b) == 1);
  CHECK(f.index->outstanding_readers() == 0);
  f.check();
}

TEST_CASE("expire_reservations aborts old reservations only") {
  index_options o;
  o.reserve_ttl = 60s;
  fixture f(4, o);
  REQUIRE(f.index->reserve(chunk_key{1, 0}, 64, t0).status == reserve_status::reserved);
  REQUIRE(f.index->reserve(chunk_key{2, 0}, 64, t0 + 30s).status == reserve_status::reserved);
  CHECK(f.index->expire_reservations(t0 + 59s).empty());
  auto gone = f.index->expire_reservations(t0 + 60s);
  CHECK(keys_of(gone) == std::vector<uint64_t>{1});
  CHECK_FALSE(f.index->commit(chunk_key{1, 0}));  // too late
  CHECK(f.index->commit(chunk_key{2, 0}));
  CHECK(f.index->stats().expired_reservations == 1);
  f.check();
}

TEST_CASE("clear and erase_rank drop only unlocked committed chunks") {
  fixture f(16);
  for (uint64_t i = 1; i <= 3; ++i) {
    f.put(i, 0);
    f.put(i, 1);
  }
  REQUIRE(f.index->reserve(chunk_key{4, 0}, 64, t0).status == reserve_status::reserved);
  auto t = f.index->lock(chunk_key{2, 1}, 1, t0);
  REQUIRE(t);
  auto r1 = f.index->erase_rank(1);
  CHECK(r1.size() == 2);  // 1 and 3 of rank 1; 2 is locked
  for (auto& k : r1) CHECK(k.rank == 1);
  auto all = f.index->clear();
  CHECK(keys_of(all) == std::vector<uint64_t>{1, 2, 3});  // rank 0, LRU order
  CHECK(f.index->size() == 2);  // the locked chunk and the reservation
  CHECK(f.index->find(chunk_key{2, 1})->readers == 1);
  CHECK(f.index->find(chunk_key{4, 0})->state == entry_state::reserved);
  CHECK(f.index->stats().evictions == 0);  // removals are not evictions
  CHECK_FALSE(f.index->erase(chunk_key{2, 1}));
  f.index->unlock(*t);
  CHECK(f.index->erase(chunk_key{2, 1}));
  f.check();
}

TEST_CASE("stats report sizes and capacity") {
  fixture f(8);
  f.put(1, 0, 40);
  f.put(2, 0, 64);
  REQUIRE(f.index->reserve(chunk_key{3, 0}, 10, t0).status == reserve_status::reserved);
  auto s = f.index->stats();
  CHECK(s.chunks == 2);
  CHECK(s.reserved == 1);
  CHECK(s.bytes_used == 114);
  CHECK(s.slot_bytes_used == 3 * 64);
  CHECK(s.capacity_bytes == 8 * 64);
  CHECK(s.slots_used == 3);
  CHECK(s.largest_free_run == 5 * 64);
}

TEST_CASE("many entries: growth, deletion and lookups stay consistent") {
  // Small slots so 200k entries cost little memory; the hash table starts
  // small (expected_entries) to exercise growth and backward-shift deletes.
  pool_options po;
  po.capacity_bytes = 200000 * 64;
  po.hugepages = false;
  po.slot_align = 64;
  auto pool = slot_pool::create(po).value();
  REQUIRE(pool);
  index_options o;
  o.expected_entries = 16;
  o.evict_high = 1.0;
  o.evict_low = 1.0;
  chunk_index idx(*pool, o);
  const size_t n = 200000;
  for (uint64_t i = 0; i < n; ++i) {
    auto r = idx.reserve(chunk_key{i * 0x9E3779B97F4A7C15ull, static_cast<int32_t>(i % 4)}, 64, t0);
    REQUIRE(r.status == reserve_status::reserved);
    idx.commit(chunk_key{i * 0x9E3779B97F4A7C15ull, static_cast<int32_t>(i % 4)});
  }
  CHECK(idx.size() == n);
  // Remove every third, then verify presence of all.
  for (uint64_t i = 0; i < n; i += 3)
    REQUIRE(idx.erase(chunk_key{i * 0x9E3779B97F4A7C15ull, static_cast<int32_t>(i % 4)}));
  size_t present = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const bool has = idx.find(chunk_key{i * 0x9E3779B97F4A7C15ull, static_cast<int32_t>(i % 4)}).has_value();
    CHECK_MESSAGE(has == (i % 3 != 0), "i=" << i);
    present += has;
  }
  CHECK(present == n - (n + 2) / 3);
  auto inv = idx.check_invariants();
  INFO((inv ? "" : inv.error_value().detail));
  CHECK(inv);
}

TEST_CASE("1M chunks: 32-chunk prefix lookup is fast") {
  // 1,000,000 entries (250k chunks x 4 ranks) in a pool of 64-byte slots;
  // the pool is mapped without touching it, so this costs ~100 MB of index.
  const size_t n_chunks = 250000, ws = 4;
  pool_options po;
  po.capacity_bytes = n_chunks * ws * 64;
  po.hugepages = false;
  po.slot_align = 64;
  auto pool = slot_pool::create(po).value();
  REQUIRE(pool);
  index_options o;
  o.evict_high = 1.0;
  o.evict_low = 1.0;
  chunk_index idx(*pool, o);
  std::vector<uint64_t> hashes(n_chunks);
  for (size_t i = 0; i < n_chunks; ++i) hashes[i] = (i + 1) * 0xD6E8FEB86659FD93ull;
  for (size_t i = 0; i < n_chunks; ++i)
    for (size_t r = 0; r < ws; ++r) {
      chunk_key k{hashes[i], static_cast<int32_t>(r)};
      REQUIRE(idx.reserve(k, 64, t0).status == reserve_status::reserved);
      idx.commit(k);
    }
  REQUIRE(idx.size() == 1000000);
  const int iters = 20000;
  size_t total = 0;
  auto start = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; ++it) {
    const size_t off = (static_cast<size_t>(it) * 7919) % (n_chunks - 32);
    total += idx.lookup_prefix(hashes.data() + off, 32, static_cast<int>(ws));
  }
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                std::chrono::steady_clock::now() - start).count();
  CHECK(total == static_cast<size_t>(iters) * 32);
  MESSAGE("lookup_prefix(32 chunks x 4 ranks) over 1M entries: "
          << ns / iters << " ns per lookup");
  // Misses: a prefix whose first chunk is absent answers at once.
  const uint64_t miss[] = {12345, hashes[0]};
  CHECK(idx.lookup_prefix(miss, 2, 4) == 0);
}

TEST_CASE("scan: committed chunks in pages, locked ones included, reserved ones not") {
  fixture f(16);
  for (uint64_t h = 1; h <= 5; ++h)
    f.put(h);
  REQUIRE(f.index->reserve(chunk_key{99, 0}, 64, t0).status == reserve_status::reserved);
  REQUIRE(f.index->lock(chunk_key{3, 0}, 1, t0));
  std::vector<uint64_t> seen;
  std::vector<bool> locked;
  size_t pos = 0;
  int pages = 0;
  do {
    size_t n = 0;
    pos = f.index->scan(pos, SIZE_MAX, [&](chunk_key k, const entry_info& e) {
      seen.push_back(k.hash);
      locked.push_back(e.readers > 0);
      CHECK(e.bytes == 64);
      return ++n < 2; // pages of two
    });
    ++pages;
  } while (pos != SIZE_MAX && pages < 10);
  std::sort(seen.begin(), seen.end());
  CHECK(seen == std::vector<uint64_t>{1, 2, 3, 4, 5});
  CHECK(std::count(locked.begin(), locked.end(), true) == 1);
  CHECK(pages == 3);
  // The budget bounds the entries looked at, matching or not.
  size_t visited = 0;
  auto next = f.index->scan(0, 2, [&](chunk_key, const entry_info&) { return ++visited, true; });
  CHECK(next == 2);
  CHECK(visited <= 2);
}
