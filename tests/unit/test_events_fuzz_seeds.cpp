// Every seed of fuzz_events_decode decodes in full: the fuzzer starts from
// real engine batches (tests/tools/make_fuzz_seeds.py), not from bytes the
// decoder refuses at the first field.
#include "fuzz_seeds.hpp"

#include "events_wire/kv_event_codec.hpp"

#include <cstdint>

TEST_CASE("fuzz_events_decode seeds: every one decodes with no event dropped") {
  auto seeds = kvs_seeds::load("fuzz_events_decode");
  CHECK(seeds.size() >= 20);
  for (const auto& [name, bytes] : seeds) {
    const auto& seed = name; // clang 14: CAPTURE's lambda cannot name a structured binding
    CAPTURE(seed);
    auto r = kvs::decode_event_batch(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    REQUIRE(kvs_seeds::decoded(r));
    CHECK(kvs_seeds::value(r).dropped.empty());
  }
}
