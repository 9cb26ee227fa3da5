// block_index: what a rank holds after its events, and snapshots that are
// exactly the state at their start even while live events keep coming.
#include "relay/block_index.hpp"
#include "events_wire/kv_event_codec.hpp"
#include "tests/unit/random_events.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>
#include <tuple>

using namespace kvs;

namespace {

block_stored stored(std::vector<uint64_t> hashes, std::optional<uint64_t> parent,
                    std::string medium = "GPU", int64_t block_size = 2) {
  block_stored s;
  s.block_hashes = std::move(hashes);
  s.parent_block_hash = parent;
  s.block_size = block_size;
  s.medium = std::move(medium);
  for (size_t i = 0; i < s.block_hashes.size() * static_cast<size_t>(block_size); ++i)
    s.token_ids.push_back(static_cast<int64_t>(s.block_hashes[i / block_size] * 10 + i % block_size));
  return s;
}

block_removed removed(std::vector<uint64_t> hashes, std::string medium = "GPU") {
  block_removed r;
  r.block_hashes = std::move(hashes);
  r.medium = std::move(medium);
  return r;
}

/// One block as a router would hold it.
using flat = std::tuple<uint64_t, std::string, std::optional<uint64_t>, std::vector<int64_t>,
                        std::string /* extra key */, std::optional<int64_t> /* lora */>;

/// Flattens BlockStored events into blocks, in order.
std::vector<flat> flatten(const std::vector<kv_event>& evs) {
  std::vector<flat> out;
  for (auto& e : evs) {
    auto& s = std::get<block_stored>(e);
    std::vector<std::string> keys;
    if (s.extra_keys_msgpack) {
      // Test data only uses 1-byte elements (nil or positive fixint).
      REQUIRE(s.extra_keys_msgpack->size() == 1 + s.block_hashes.size());
      for (size_t i = 0; i < s.block_hashes.size(); ++i)
        keys.push_back(s.extra_keys_msgpack->substr(1 + i, 1));
    }
    for (size_t b = 0; b < s.block_hashes.size(); ++b) {
      auto bs = static_cast<size_t>(s.block_size);
      std::vector<int64_t> t(s.token_ids.begin() + static_cast<std::ptrdiff_t>(b * bs),
                             s.token_ids.begin() + static_cast<std::ptrdiff_t>((b + 1) * bs));
      out.emplace_back(s.block_hashes[b], s.medium.value_or("-"),
                       b == 0 ? s.parent_block_hash : std::optional<uint64_t>{s.block_hashes[b - 1]},
                       t, keys.empty() ? std::string{} : keys[b], s.lora_id);
    }
  }
  return out;
}

std::vector<kv_event> snapshot_all(block_index& idx, size_t step = 1000) {
  std::vector<kv_event> out;
  idx.begin_snapshot();
  while (!idx.snapshot_next(step, out)) {
  }
  return out;
}

std::vector<flat> sorted(std::vector<flat> v) {
  std::sort(v.begin(), v.end());
  return v;
}

/// Every block whose parent is in the snapshot comes after it.
/// Encodes `evs` in `dialect`; applies the decoded events to `full` and the
/// pass-through batch (its record as the ingest bridge makes it) to
/// `recorded`. Returns that batch.
kv_event_batch apply_both(const std::vector<kv_event>& evs, event_dialect dialect,
                          block_index& full, block_index& recorded) {
  kv_event_batch batch;
  batch.events = evs;
  std::string bytes;
  encode_event_batch(batch, dialect, bytes);
  // What the bytes say (tokenspeed's have no medium).
  auto decoded = decode_event_batch(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  REQUIRE(decoded);
  for (const auto& ev : decoded->batch.events)
    full.apply(ev);
  auto events = std::make_shared<canonical_events>();
  auto layout = check_canonical_event_batch(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            bytes.size(), dialect, events.get());
  REQUIRE(layout); // what the encoder writes is canonical
  kv_event_batch wire;
  wire.wire = canonical_wire{std::make_shared<const std::string>(bytes), dialect, *layout,
                             std::make_shared<const canonical_record>(*events)};
  recorded.apply(wire);
  return wire;
}

void check_parents_first(const std::vector<flat>& blocks) {
  std::map<std::pair<uint64_t, std::string>, size_t> pos;
  for (size_t i = 0; i < blocks.size(); ++i)
    pos[{std::get<0>(blocks[i]), std::get<1>(blocks[i])}] = i;
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto& parent = std::get<2>(blocks[i]);
    if (!parent)
      continue;
    auto it = pos.find({*parent, std::get<1>(blocks[i])});
    if (it != pos.end())
      CHECK(it->second < i);
  }
}

} // namespace

TEST_CASE("block index follows stores, removals by hash and medium, and clears") {
  block_index idx{100};
  auto s = stored({1, 2, 3}, std::nullopt);
  s.lora_id = 7;
  s.extra_keys_msgpack = std::string{"\x93\xc0\x01\x02", 4}; // [nil, 1, 2]
  idx.apply(s);
  idx.apply(stored({1}, std::nullopt, "CPU"));
  CHECK(idx.size() == 4);
  CHECK(idx.memory_bytes() > 0);

  auto blocks = flatten(snapshot_all(idx));
  CHECK(blocks.size() == 4);
  // GPU chain 1 <- 2 <- 3 comes back as one event with every field.
  auto evs = snapshot_all(idx);
  auto& first = std::get<block_stored>(evs[0]);
  CHECK(first.block_hashes == std::vector<uint64_t>{1, 2, 3});
  CHECK(first.token_ids == s.token_ids);
  CHECK(first.lora_id == 7);
  CHECK(first.medium == "GPU");
  CHECK(first.extra_keys_msgpack == s.extra_keys_msgpack);
  CHECK(!first.parent_block_hash);

  idx.apply(removed({2})); // GPU only: the CPU copy of 1 and GPU 1, 3 stay
  CHECK(idx.size() == 3);
  blocks = flatten(snapshot_all(idx));
  CHECK(sorted(blocks) == sorted({flat{1, "CPU", std::nullopt, {10, 11}, "", std::nullopt},
                                  flat{1, "GPU", std::nullopt, {10, 11}, "\xc0", 7},
                                  flat{3, "GPU", 2, {30, 31}, "\x02", 7}}));
  idx.apply(removed({1}, "CPU"));
  idx.apply(removed({99}));            // unknown hash: nothing
  idx.apply(removed({3}, "DISK"));     // unknown medium: nothing
  CHECK(idx.size() == 2);
  idx.apply(all_blocks_cleared{});
  CHECK(idx.size() == 0);
  CHECK(snapshot_all(idx).empty());
}

TEST_CASE("token ids past int32 come back exactly") {
  block_index idx{10};
  auto s = stored({1, 2}, std::nullopt);
  s.token_ids = {-5, int64_t{1} << 40, 7, INT64_MIN};
  idx.apply(s);
  auto evs = snapshot_all(idx);
  REQUIRE(evs.size() == 1);
  CHECK(std::get<block_stored>(evs[0]).token_ids == s.token_ids);
}

TEST_CASE("block index keys blocks by KV-cache group too") {
  block_index idx{100};
  auto g0 = stored({5}, std::nullopt);
  g0.group_idx = 0;
  auto g1 = stored({5}, std::nullopt);
  g1.group_idx = 1;
  idx.apply(g0);
  idx.apply(g1);
  CHECK(idx.size() == 2);
  auto r = removed({5});
  r.group_idx = 1;
  idx.apply(r);
  CHECK(idx.size() == 1);
  CHECK(std::get<block_stored>(snapshot_all(idx)[0]).group_idx == 0);
}

TEST_CASE("block index never grows past its bound") {
  block_index idx{3};
  idx.apply(stored({1, 2, 3, 4, 5}, std::nullopt));
  CHECK(idx.size() == 3);
  CHECK(idx.refused() == 2);
  auto before = idx.memory_bytes();
  for (uint64_t h = 10; h < 1000; ++h)
    idx.apply(stored({h}, std::nullopt));
  CHECK(idx.size() == 3);
  CHECK(idx.refused() == 2 + 990);
  CHECK(idx.memory_bytes() <= before + 1024);
  idx.apply(removed({3}));
  idx.apply(stored({42}, 2));
  CHECK(idx.size() == 3);
}

TEST_CASE("a re-stored block is replaced, not duplicated") {
  block_index idx{100};
  idx.apply(stored({1, 2}, std::nullopt));
  auto again = stored({2}, 1);
  again.lora_id = 3;
  idx.apply(again);
  CHECK(idx.size() == 2);
  auto blocks = flatten(snapshot_all(idx));
  CHECK(blocks.size() == 2);
  CHECK(std::get<5>(blocks[1]) == 3);
}

TEST_CASE("a snapshot is the state at its start while live events continue") {
  block_index idx{100};
  idx.apply(stored({1, 2, 3}, std::nullopt));
  idx.apply(stored({4, 5}, 3));
  idx.apply(stored({6}, 1));
  auto expected = sorted(flatten(snapshot_all(idx)));

  idx.begin_snapshot();
  std::vector<kv_event> out;
  CHECK(!idx.snapshot_next(1, out)); // one block yielded, the rest still owed
  idx.apply(removed({5, 3}));        // owed blocks: their pre-images are kept
  idx.apply(stored({7, 8}, 6));      // stored after the start: not in it
  auto changed = stored({4}, 99);    // re-stored after the start: old version
  changed.lora_id = 1;
  idx.apply(changed);
  CHECK(!idx.snapshot_next(1, out));
  idx.apply(all_blocks_cleared{});   // everything still owed is kept
  idx.apply(stored({9}, std::nullopt));
  while (!idx.snapshot_next(2, out)) {
  }
  auto got = flatten(out);
  check_parents_first(got);
  CHECK(sorted(got) == expected);
  CHECK(!idx.snapshot_active());
  CHECK(idx.preimages() > 0);
  CHECK(idx.size() == 1);
}

TEST_CASE("snapshots stay exact under random live traffic") {
  std::mt19937_64 rng{42};
  for (int round = 0; round < 50; ++round) {
    block_index idx{400};
    auto random_op = [&] {
      auto roll = rng() % 100;
      const char* medium = rng() % 4 == 0 ? "CPU" : "GPU";
      if (roll < 55) {
        // Parents hash lower than children (no cycles, as in real chains).
        std::optional<uint64_t> parent;
        uint64_t lo = 1;
        if (rng() % 3) {
          parent = 1 + rng() % 250;
          lo = *parent + 1;
        }
        std::vector<uint64_t> hs;
        for (size_t i = 0, n = 1 + rng() % 4; i < n; ++i)
          hs.push_back(lo = lo + 1 + rng() % 20);
        idx.apply(stored(hs, parent, medium));
      } else if (roll < 98) {
        idx.apply(removed({1 + rng() % 300, 1 + rng() % 300}, medium));
      } else {
        idx.apply(all_blocks_cleared{});
      }
    };
    for (int i = 0; i < 300; ++i)
      random_op();
    auto expected = sorted(flatten(snapshot_all(idx)));
    CHECK(expected.size() == idx.size());
    idx.begin_snapshot();
    std::vector<kv_event> out;
    while (!idx.snapshot_next(1 + rng() % 8, out))
      for (int i = 0, n = static_cast<int>(rng() % 6); i < n; ++i)
        random_op();
    auto got = flatten(out);
    check_parents_first(got);
    REQUIRE(sorted(got) == expected);
  }
}

TEST_CASE("a cancelled snapshot leaves the index usable") {
  block_index idx{10};
  idx.apply(stored({1, 2}, std::nullopt));
  idx.begin_snapshot();
  std::vector<kv_event> out;
  idx.snapshot_next(1, out);
  idx.cancel_snapshot();
  CHECK(!idx.snapshot_active());
  idx.apply(removed({1}));
  CHECK(flatten(snapshot_all(idx)).size() == 1);
}

TEST_CASE("events with equal attributes share them; any difference keeps its own") {
  block_index idx{100};
  // Three events of one chain: the first two alike (their blocks share one
  // attributes object, and the snapshot may merge them into one event), the
  // third differs only in session_id and keeps it.
  idx.apply(kv_event{stored({1}, std::nullopt)});
  idx.apply(kv_event{stored({2}, 1)});
  const auto shared_bytes = idx.memory_bytes();
  auto third = stored({3}, 2);
  third.session_id = "req-7";
  idx.apply(kv_event{third});
  CHECK(idx.memory_bytes() > shared_bytes);
  auto evs = snapshot_all(idx);
  std::vector<std::optional<std::string>> sessions;
  std::vector<uint64_t> hashes;
  for (auto& e : evs) {
    auto& s = std::get<block_stored>(e);
    for (auto h : s.block_hashes) {
      hashes.push_back(h);
      sessions.push_back(s.session_id);
    }
  }
  CHECK(hashes == std::vector<uint64_t>{1, 2, 3});
  CHECK(sessions == std::vector<std::optional<std::string>>{std::nullopt, std::nullopt, "req-7"});
  // Blocks 1 and 2 came from two events with the same attributes: one
  // BlockStored in the snapshot (a chain), block 3 its own.
  CHECK(evs.size() == 2);
  CHECK(flatten(evs) == flatten({kv_event{stored({1, 2}, std::nullopt)}, kv_event{stored({3}, 2)}}));
}

TEST_CASE("an engine's [None] extra keys are kept per block, and come back exact") {
  block_index idx{100};
  auto a = stored({1, 2}, std::nullopt);
  a.extra_keys_msgpack = std::string("\x92\xc0\xc0", 3);
  auto b = stored({3}, 2);
  b.extra_keys_msgpack = std::string("\x91\x05", 2);
  idx.apply(kv_event{a});
  idx.apply(kv_event{b});
  auto blocks = flatten(snapshot_all(idx));
  REQUIRE(blocks.size() == 3);
  CHECK(std::get<4>(blocks[0]) == std::string("\xc0", 1));
  CHECK(std::get<4>(blocks[1]) == std::string("\xc0", 1));
  CHECK(std::get<4>(blocks[2]) == std::string("\x05", 1));
}

TEST_CASE("a pass-through batch (recorded events, same_tail) builds the index its decode builds") {
  // The indexer applies a pass-through batch from what the ingest bridge's
  // check recorded, reusing what it derived from the previous event's tail;
  // a decoded batch's events go in one by one with nothing reused. Both
  // must give the same blocks.
  kvs_test::rng r;
  size_t same = 0;
  for (int round = 0; round < 300; ++round) {
    block_index full{1'000'000}, recorded{1'000'000};
    for (int k = 0; k < 4; ++k) {
      const auto dialect = r.coin() ? event_dialect::vllm : event_dialect::tokenspeed;
      auto wire = apply_both(kvs_test::random_batch(r).events, dialect, full, recorded);
      for (const auto& ev : wire.wire->events->events)
        same += ev.same_tail;
    }
    CHECK(recorded.size() == full.size());
    CHECK(recorded.refused() == full.refused());
    CHECK(recorded.memory_bytes() == full.memory_bytes());
    CHECK(snapshot_all(recorded) == snapshot_all(full));
  }
  CHECK(same > 200); // the reuse was exercised
}

TEST_CASE("a pass-through batch's first BlockStored reuses the previous batch's tail") {
  // Engines send the same block_size, medium and spec in every batch: the
  // first event of each batch is then not decoded again. A changed tail (a
  // new medium here) is, and the index still equals the decoded one.
  block_index full{1'000'000}, recorded{1'000'000};
  auto pass = [&](const std::vector<kv_event>& evs, event_dialect dialect) {
    apply_both(evs, dialect, full, recorded);
  };
  uint64_t h = 1;
  for (int b = 0; b < 10; ++b, h += 4)
    pass({stored({h, h + 1}, std::nullopt), stored({h + 2, h + 3}, h + 1)}, event_dialect::vllm);
  CHECK(recorded.decoded_events() == 1); // the very first event only
  pass({stored({h, h + 1}, std::nullopt, "CPU"), stored({h + 2, h + 3}, h + 1, "CPU")},
       event_dialect::vllm);
  CHECK(recorded.decoded_events() == 2); // the new medium
  h += 4;
  pass({kv_event{removed({1})}, stored({h, h + 1}, std::nullopt, "CPU")}, event_dialect::vllm);
  CHECK(recorded.decoded_events() == 4); // a removal invalidates what was prepared
  h += 2;
  pass({stored({h, h + 1}, std::nullopt, "CPU")}, event_dialect::vllm);
  CHECK(recorded.decoded_events() == 4);
  // Another dialect's tail is never taken for this one's.
  h += 2;
  pass({stored({h, h + 1}, std::nullopt, "CPU")}, event_dialect::tokenspeed);
  CHECK(recorded.decoded_events() == 5);
  // Three blocks instead of two: the same tail bytes, but what was prepared
  // (per-block extra keys) is for two.
  h += 2;
  pass({stored({h, h + 1, h + 2}, std::nullopt, "CPU")}, event_dialect::tokenspeed);
  CHECK(recorded.decoded_events() == 6);
  CHECK(recorded.size() == full.size());
  CHECK(recorded.memory_bytes() == full.memory_bytes());
  CHECK(snapshot_all(recorded) == snapshot_all(full));
}
