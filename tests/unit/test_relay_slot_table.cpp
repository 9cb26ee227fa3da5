// slot_table (the block index's hash table) against std::unordered_map under
// random inserts, finds and erases, with hashes chosen to collide: runs that
// wrap around the end of the array, equal tags, erase from the middle of a
// run (the backward shift must keep every other entry findable).
#include "relay/slot_table.hpp"

#include <doctest/doctest.h>

#include <random>
#include <unordered_map>
#include <vector>

using namespace kvs;

namespace {

/// Keys are slot indices here; each has a hash from `hash_of`.
template <typename Hash>
void run_against_model(Hash hash_of, int ops, uint32_t keys) {
  std::mt19937_64 rng{7};
  slot_table t;
  std::unordered_map<uint32_t, bool> model;
  auto matches = [](uint32_t want) { return [want](uint32_t slot) { return slot == want; }; };
  for (int op = 0; op < ops; ++op) {
    const auto k = static_cast<uint32_t>(rng() % keys);
    const uint64_t h = hash_of(k);
    const bool present = model.count(k) != 0;
    REQUIRE(t.find(h, matches(k)) == (present ? k : slot_table::none));
    if (rng() % 3 == 0) {
      if (present) {
        t.erase(h, k);
        model.erase(k);
      }
    } else if (!present) {
      t.insert(h, k);
      model[k] = true;
    }
    REQUIRE(t.size() == model.size());
  }
  for (uint32_t k = 0; k < keys; ++k)
    CHECK(t.find(hash_of(k), matches(k)) == (model.count(k) ? k : slot_table::none));
}

} // namespace

TEST_CASE("slot_table finds exactly what was inserted and not erased") {
  SUBCASE("well-mixed hashes") {
    run_against_model([](uint32_t k) { return uint64_t{k} * uint64_t{0x9e3779b97f4a7c15ULL}; }, 200000,
                      5000);
  }
  SUBCASE("every key in 8 home buckets, equal tags in pairs: long runs that wrap") {
    run_against_model([](uint32_t k) { return uint64_t{(k / 2) % 8} | (uint64_t{k % 8} << 28); },
                      100000, 600);
  }
  SUBCASE("homes at the very end of the array") {
    run_against_model([](uint32_t k) { return uint64_t{0xffffffffu - k % 3}; }, 50000, 300);
  }
}

TEST_CASE("slot_table clear empties it and it grows again") {
  slot_table t;
  for (uint32_t k = 0; k < 1000; ++k)
    t.insert(k * 0x9e3779b97f4a7c15ULL, k);
  CHECK(t.size() == 1000);
  CHECK(t.memory_bytes() >= 2 * 1000 * 8);
  t.clear();
  CHECK(t.size() == 0);
  CHECK(t.memory_bytes() == 0);
  CHECK(t.find(5 * 0x9e3779b97f4a7c15ULL, [](uint32_t) { return true; }) == slot_table::none);
  t.insert(42, 7);
  CHECK(t.find(42, [](uint32_t s) { return s == 7; }) == 7);
}
