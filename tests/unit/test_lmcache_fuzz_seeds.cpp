// Every seed of fuzz_lmcache_decode, fuzz_pickle and fuzz_tensor_envelope decodes: the fuzzers
// start from real LMCache requests, wrappers and pickles
// (tests/tools/make_fuzz_seeds.py), not from bytes refused at the first field.
#include "fuzz_seeds.hpp"

#include "lmcache_wire/lmcache_kv_events.hpp"
#include "lmcache_wire/lmcache_ops.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"
#include "lmcache_wire/pickle_reader.hpp"
#include "lmcache_wire/tensor_envelope.hpp"
#include "lmcache_wire/tensor_wrappers.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace {

/// fuzz_lmcache_decode's request layout after byte 0: each frame as
/// [u16 little-endian length][bytes]. Seeds are well formed, so unlike the
/// fuzzer this needs no rule for short or missing lengths.
std::vector<std::string_view> request_frames(std::string_view in) {
  std::vector<std::string_view> frames;
  while (in.size() >= 2) {
    size_t n = static_cast<uint8_t>(in[0]) | size_t{static_cast<uint8_t>(in[1])} << 8;
    in.remove_prefix(2);
    REQUIRE(n <= in.size());
    frames.push_back(in.substr(0, n));
    in.remove_prefix(n);
  }
  REQUIRE(in.empty());
  return frames;
}

} // namespace

TEST_CASE("fuzz_lmcache_decode seeds: every request and wrapper decodes") {
  auto seeds = kvs_seeds::load("fuzz_lmcache_decode");
  CHECK(seeds.size() >= 20);
  size_t requests = 0, wrappers = 0;
  for (const auto& [name, bytes] : seeds) {
    const auto& seed = name; // clang 14: CAPTURE's lambda cannot name a structured binding
    CAPTURE(seed);
    REQUIRE(bytes.size() >= 2);
    std::string_view in(bytes);
    if ((static_cast<uint8_t>(in[0]) & 1) == 0) {
      auto frames = request_frames(in.substr(1));
      REQUIRE(frames.size() >= 2);
      ++requests;
      if (kvs::streamed_row(frames[1])) {
        // A stream: the bridge decodes its arguments itself, before decode_mp_request.
        std::vector<std::string_view> args(frames.begin() + 2, frames.end());
        CHECK(kvs_seeds::decoded(kvs::decode_subscribe_kv_events(args)));
      } else {
        CHECK(kvs_seeds::decoded(kvs::decode_mp_request(frames)));
      }
    } else {
      int8_t ext = (static_cast<uint8_t>(in[1]) & 1) ? kvs::kvs_host_shm_ext : kvs::lmcache_ipc_wrapper_ext;
      ++wrappers;
      CHECK(kvs_seeds::decoded(kvs::decode_kv_cache_wrapper(ext, in.substr(2))));
    }
  }
  CHECK(requests > 0);
  CHECK(wrappers > 0);
}

TEST_CASE("fuzz_pickle seeds: every pickled wrapper decodes") {
  auto seeds = kvs_seeds::load("fuzz_pickle");
  CHECK(seeds.size() >= 10);
  for (const auto& [name, bytes] : seeds) {
    const auto& seed = name; // clang 14: CAPTURE's lambda cannot name a structured binding
    CAPTURE(seed);
    CHECK(kvs_seeds::decoded(kvs::decode_pickled_ipc_wrapper(bytes)));
  }
}

TEST_CASE("fuzz_tensor_envelope seeds: every envelope decodes, tensors of its shape") {
  auto seeds = kvs_seeds::load("fuzz_tensor_envelope");
  CHECK(seeds.size() >= 4);
  size_t tensors = 0;
  for (const auto& [name, bytes] : seeds) {
    const auto& seed = name; // clang 14: CAPTURE's lambda cannot name a structured binding
    CAPTURE(seed);
    std::vector<kvs::envelope_tensor> all;
    if (name.rfind("grouped_", 0) == 0) { // a hybrid-KV worker's GroupedTensorEnvelope
      auto got = kvs::decode_grouped_tensor_envelope(bytes);
      REQUIRE(kvs_seeds::decoded(got));
      CHECK(got->size() >= 2);
      for (const auto& g : *got)
        all.insert(all.end(), g.tensors.begin(), g.tensors.end());
    } else {
      auto got = kvs::decode_tensor_envelope(bytes);
      REQUIRE(kvs_seeds::decoded(got));
      all = *got;
    }
    for (const auto& t : all) {
      uint64_t n = t.dtype == "float32" ? 4 : 2;
      for (int64_t d : t.shape)
        n *= static_cast<uint64_t>(d);
      CHECK(t.data.size() == n);
      ++tensors;
    }
  }
  CHECK(tensors >= 10);
}
