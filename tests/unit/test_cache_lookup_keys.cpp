// cache/lookup_keys: the one builder of a lookup's keys that the sessions
// (uint32 tokens) and the HTTP API (int64 tokens) share. The same tokens in
// either form give the same hashes, names and tokens; the int64 form stops
// LMCache's names at a token outside uint32; only full chunks within
// n_chunks count.
#include <doctest/doctest.h>

#include "cache/chunk_hash.hpp"
#include "cache/lmcache_token_hash.hpp"
#include "cache/lookup_keys.hpp"

#include <cstdint>
#include <string>
#include <vector>

using namespace kvs;

TEST_CASE("lookup keys: the engine's and the HTTP API's tokens give the same keys") {
  constexpr size_t cs = 4;
  std::vector<uint32_t> narrow;
  for (uint32_t i = 0; i < 10; ++i)
    narrow.push_back(4000000000u + i); // past int32: widened, not sign-extended
  std::vector<int64_t> wide(narrow.begin(), narrow.end());
  const uint64_t seed = identity_seed("m", 2, "salt");

  auto h32 = prefix_chunk_hashes(narrow.data(), narrow.size(), cs, 8, seed);
  auto h64 = prefix_chunk_hashes(wide.data(), wide.size(), cs, 8, seed);
  REQUIRE(h32.size() == 2); // 10 tokens: two full chunks
  CHECK(h32 == h64);
  CHECK(h32 == chunk_hashes(wide.data(), 8, cs, seed));
  // n_chunks bounds them.
  CHECK(prefix_chunk_hashes(narrow.data(), narrow.size(), cs, 1, seed)
        == std::vector<uint64_t>{h32[0]});

  auto n32 = prefix_l2_names(narrow.data(), narrow.size(), cs, 8);
  auto n64 = prefix_l2_names(wide.data(), wide.size(), cs, 8);
  std::vector<std::string> want;
  append_lmcache_chunk_hashes(narrow.data(), 8, cs, want);
  REQUIRE(n32.size() == 2);
  CHECK(n32 == want);
  CHECK(n64 == want);

  auto t32 = prefix_l2_tokens(narrow.data(), narrow.size(), 8);
  auto t64 = prefix_l2_tokens(wide.data(), wide.size(), 8);
  CHECK(*t32 == std::vector<uint32_t>(narrow.begin(), narrow.begin() + 8));
  CHECK(*t64 == *t32);
}

TEST_CASE("lookup keys: a token outside uint32 ends LMCache's names") {
  constexpr size_t cs = 2;
  std::vector<int64_t> tokens{1, 2, 3, 4, int64_t{1} << 32, 6, 7, 8};
  auto names = prefix_l2_names(tokens.data(), tokens.size(), cs, 4);
  CHECK(names.size() == 2); // the chunk holding 2^32 and every later one: none
  // kvsidecar's own hashes read int64 tokens: every full chunk.
  CHECK(prefix_chunk_hashes(tokens.data(), tokens.size(), cs, 4, 7).size() == 4);
  // No chunk size: no names (a misconfigured size never divides by zero).
  CHECK(prefix_l2_names(tokens.data(), tokens.size(), 0, 4).empty());
}
