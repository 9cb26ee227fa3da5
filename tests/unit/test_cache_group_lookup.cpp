// The LOOKUP of hybrid-KV models (cache/group_lookup.hpp): LMCache 0.5.7's
// fold_grouped rule for the hit, and exactly each group's in-window chunks
// read-locked under its own ledger session.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "cache/chunk_hash.hpp"
#include "cache/chunk_index.hpp"
#include "cache/group_lookup.hpp"
#include "cache/lock_ledger.hpp"
#include "cache_world.hpp"

using namespace kvs;

namespace {

using kvs_test::t0;

/// A world whose chunks are the parts of groups (group_hash) of five chunks.
struct groups_world : kvs_test::world {
  std::vector<uint64_t> hashes{101, 102, 103, 104, 105};

  groups_world() : world(64) {}
  /// Group g's part of chunks `cs`, on ranks 0..ranks-1.
  void put(uint32_t g, std::vector<size_t> cs, int ranks = 1) {
    for (auto c : cs)
      for (int r = 0; r < ranks; ++r)
        world::put(group_hash(hashes[c], g), r);
  }
  size_t lookup(const std::vector<int32_t>& windows, size_t n, int ranks = 1, size_t base = 0) {
    std::vector<uint64_t> hs(hashes.begin(), hashes.begin() + static_cast<ptrdiff_t>(n));
    return lookup_groups(*index, *ledger, "req", hs, windows, ranks, 1, t0, base);
  }
  uint32_t readers(uint32_t g, size_t c, int rank = 0) const {
    return world::readers(group_hash(hashes[c], g), rank);
  }
};

} // namespace

TEST_CASE("group_hash: group 0 is the prefix hash itself, other groups differ per group") {
  CHECK(group_hash(42, 0) == 42);
  CHECK(group_hash(42, 1) != 42);
  CHECK(group_hash(42, 1) != group_hash(42, 2));
  CHECK(group_hash(42, 1) != group_hash(43, 1));
  CHECK(group_hash(42, 1) == group_hash(42, 1));
  CHECK(group_session("r", 0) == "r");
  CHECK(group_session("r", 1) != group_session("r", 2));
}

TEST_CASE("full attention needs every chunk, a window only its last ones") {
  groups_world w;
  w.put(0, {0, 1, 2, 3});
  w.put(1, {2, 3}); // a 2-chunk window: chunks 0 and 1 were all-null, never stored
  CHECK(w.lookup({-1, 2}, 4) == 4);
  // Locks: group 0 on 0..3, group 1 on 2..3 only.
  for (size_t c = 0; c < 4; ++c)
    CHECK(w.readers(0, c) == 1);
  CHECK(w.readers(1, 2) == 1);
  CHECK(w.readers(1, 3) == 1);
  CHECK(w.ledger->locked_end("req") == 4);
  CHECK(w.ledger->locked_end(group_session("req", 1)) == 4);
  CHECK(w.ledger->held_readers() == 6);
  // A second lookup of the request replaces every group's locks. Over two
  // chunks the window needs chunks 0..1, which the group never stored: no
  // prefix is servable, and nothing stays locked.
  CHECK(w.lookup({-1, 2}, 2) == 0);
  CHECK(w.ledger->held_readers() == 0);
  CHECK(w.ledger->end_session("req") + w.ledger->end_session(group_session("req", 1)) == 0);
  CHECK(w.index->outstanding_readers() == 0);
}

TEST_CASE("the hit is the longest servable prefix, not the first gap") {
  groups_world w;
  w.put(0, {0, 1, 2, 3, 4});
  w.put(1, {1, 3}); // window 1: prefixes of 2 and 4 chunks are servable, 3 and 5 not
  CHECK(w.lookup({-1, 1}, 5) == 4);
  CHECK(w.readers(1, 3) == 1);
  CHECK(w.readers(1, 1) == 0);
  CHECK(w.lookup({-1, 1}, 3) == 2);
  CHECK(w.readers(1, 1) == 1);
  CHECK(w.readers(1, 3) == 0);
  // A full-attention gap bounds everything.
  groups_world v;
  v.put(0, {0, 2, 3});
  v.put(1, {0, 1, 2, 3});
  CHECK(v.lookup({-1, 1}, 4) == 1);
  CHECK(v.lookup({-1, 1}, 4, 1, 0) == 1);
}

TEST_CASE("every rank holds each group's chunk; chunks below base are the engine's own") {
  groups_world w;
  w.put(0, {0, 1, 2}, 2);
  w.put(1, {2}, 1); // the window's chunk on rank 0 only
  CHECK(w.lookup({-1, 1}, 3, 2) == 0);
  w.world::put(group_hash(w.hashes[2], 1), 1);
  CHECK(w.lookup({-1, 1}, 3, 2) == 3);
  // From base 2 (LMCache 0.5.7's key.start): chunks 0..1 are not looked at,
  // and nothing below base is locked.
  groups_world b;
  b.put(0, {2}, 1);
  b.put(1, {2}, 1);
  CHECK(b.lookup({-1, 1}, 3, 1, 2) == 3);
  CHECK(b.ledger->held_readers() == 2);
  CHECK(b.readers(0, 2) == 1);
  CHECK(b.readers(1, 2) == 1);
  CHECK(b.ledger->locked_end("req") == 3);
  // Nothing of the window found: the engine's own prefix is the hit.
  groups_world m;
  m.put(0, {2}, 1);
  CHECK(m.lookup({-1, 1}, 3, 1, 2) == 2);
  CHECK(m.ledger->held_readers() == 0);
}

TEST_CASE("an L2 prefetch's plan: each group's L1 run and the chunks L1 lacks") {
  groups_world w;
  w.put(0, {0, 1, 3}, 2);
  w.put(1, {1}, 2);
  w.put(1, {2}, 1); // rank 1 lacks group 1's part of chunk 2
  const auto& hs = w.hashes;
  CHECK(group_run_end(*w.index, hs, 0, 2, 0) == 2);
  CHECK(group_run_end(*w.index, hs, 1, 2, 0) == 0);
  CHECK(group_run_end(*w.index, hs, 1, 2, 1) == 2);   // chunk 0 is the engine's own
  CHECK(group_run_end(*w.index, hs, 1, 1, 1) == 3);   // one rank: chunk 2 is there
  CHECK(group_chunks_missing(*w.index, hs, 0, 2, 5, 2, 0) == std::vector<size_t>{2, 4});
  CHECK(group_chunks_missing(*w.index, hs, 1, 0, 5, 2, 0) == std::vector<size_t>{0, 2, 3, 4});
  CHECK(group_chunks_missing(*w.index, hs, 1, 0, 3, 2, 1) == std::vector<size_t>{2});
  CHECK(group_chunks_missing(*w.index, hs, 1, 3, 9, 1, 0) == std::vector<size_t>{3, 4}); // to > n
  CHECK(group_chunks_missing(*w.index, hs, 0, 4, 2, 1, 0).empty());
}
