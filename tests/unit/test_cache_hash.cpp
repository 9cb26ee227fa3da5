// Chunk hashes are cache keys and KV-event block ids: they must never change
// between runs, builds or machines. Golden values were computed independently
// with python-xxhash 4.1 (xxh3_64) from the format in cache/chunk_hash.hpp.
#include <doctest/doctest.h>

#include <numeric>
#include <vector>

#include "cache/chunk_hash.hpp"

using namespace kvs;

TEST_CASE("identity seed golden values") {
  CHECK(identity_seed("", 1, "") == 0x56d767aa75c0d0cfull);
  CHECK(identity_seed("meta-llama/Llama-3.1-8B", 2, "tenant-a") ==
        0xe1219bec61e041c1ull);
  CHECK(identity_seed("meta-llama/Llama-3.1-8B", 4, "tenant-a") ==
        0xc70fa11fd42158a2ull);
}

TEST_CASE("identity seed separates model, world size and salt") {
  const uint64_t base = identity_seed("m", 2, "s");
  CHECK(identity_seed("m2", 2, "s") != base);
  CHECK(identity_seed("m", 4, "s") != base);
  CHECK(identity_seed("m", 2, "") != base);
  // Length prefixes: moving a byte from model to salt is a different identity.
  CHECK(identity_seed("ab", 1, "c") != identity_seed("a", 1, "bc"));
}

TEST_CASE("chunk hashes golden values") {
  std::vector<int64_t> t(10);
  std::iota(t.begin(), t.end(), 1);  // 1..10
  const auto h = chunk_hashes(t.data(), t.size(), 4, identity_seed("", 1, ""));
  REQUIRE(h.size() == 2);  // tokens 9, 10 are a partial chunk
  CHECK(h[0] == 0x348975b9ceeac075ull);
  CHECK(h[1] == 0xe91a1ed06b94416bull);

  std::vector<int64_t> big(512);
  std::iota(big.begin(), big.end(), 0);
  const auto g = chunk_hashes(big.data(), big.size(), 256,
                              identity_seed("meta-llama/Llama-3.1-8B", 2, "tenant-a"));
  REQUIRE(g.size() == 2);
  CHECK(g[0] == 0x8ad2c48232fada89ull);
  CHECK(g[1] == 0xe48b5eaabae29499ull);

  // Negative and > 32-bit tokens are hashed as full little-endian int64.
  const int64_t odd[] = {-1, int64_t{1} << 40, 7};
  const auto o = chunk_hashes(odd, 3, 3, identity_seed("", 1, ""));
  REQUIRE(o.size() == 1);
  CHECK(o[0] == 0xfbb908fc4654d5fdull);
}

TEST_CASE("only full chunks are hashed") {
  std::vector<int64_t> t(7, 5);
  CHECK(chunk_hashes(t.data(), 7, 8, 1).empty());
  CHECK(chunk_hashes(t.data(), 7, 0, 1).empty());
  CHECK(chunk_hashes(nullptr, 0, 4, 1).empty());
  CHECK(chunk_hashes(t.data(), 7, 3, 1).size() == 2);
  CHECK(chunk_hashes(t.data(), 7, 1, 1).size() == 7);
  CHECK(full_chunks(7, 3) == 2);
  CHECK(full_chunks(7, 0) == 0);
}

TEST_CASE("hashes are prefix-chained") {
  std::vector<int64_t> a(12), b(12);
  std::iota(a.begin(), a.end(), 100);
  b = a;
  b[5] = -3;  // differs in chunk 1 of 3 (chunk size 4)
  const auto ha = chunk_hashes(a.data(), a.size(), 4, 42);
  const auto hb = chunk_hashes(b.data(), b.size(), 4, 42);
  REQUIRE(ha.size() == 3);
  REQUIRE(hb.size() == 3);
  CHECK(ha[0] == hb[0]);
  // A change in chunk 1 changes every later chunk's hash, even where the
  // chunk's own tokens are equal.
  CHECK(ha[1] != hb[1]);
  CHECK(ha[2] != hb[2]);

  // The hash of chunk i depends only on the prefix: hashing a shorter
  // sequence yields a prefix of the hashes.
  const auto shorter = chunk_hashes(a.data(), 9, 4, 42);
  REQUIRE(shorter.size() == 2);
  CHECK(shorter[0] == ha[0]);
  CHECK(shorter[1] == ha[1]);

  // Same tokens in a chunk at different positions hash differently.
  std::vector<int64_t> rep(8, 9);
  const auto hr = chunk_hashes(rep.data(), rep.size(), 4, 42);
  CHECK(hr[0] != hr[1]);

  // The seed is part of every hash.
  CHECK(chunk_hashes(a.data(), a.size(), 4, 43)[0] != ha[0]);
}

TEST_CASE("append_chunk_hashes appends") {
  std::vector<int64_t> a(8, 1);
  std::vector<uint64_t> out{7};
  append_chunk_hashes(a.data(), a.size(), 4, 42, out);
  REQUIRE(out.size() == 3);
  CHECK(out[0] == 7);
  CHECK(out[1] == chunk_hashes(a.data(), a.size(), 4, 42)[0]);
}
