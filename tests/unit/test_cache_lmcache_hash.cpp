// BLAKE3 (cache/blake3.hpp) against the specification's published test
// vectors, and LMCache's chunk hash (cache/lmcache_token_hash.hpp) against
// goldens made by the LMCache wheel's own TokenHasher on 3000 random token
// lists (tests/tools/make_lmcache_hash_goldens.py; 0.5.6 and 0.5.7rc2 agree).
#include <doctest/doctest.h>

#include "cache/blake3.hpp"
#include "cache/lmcache_token_hash.hpp"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace kvs;

namespace {

std::string hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(d[p[i] >> 4]);
    s.push_back(d[p[i] & 15]);
  }
  return s;
}
std::string hex(const std::string& b) {
  return hex(reinterpret_cast<const uint8_t*>(b.data()), b.size());
}

/// The vectors' input: bytes 0, 1, ..., 250, 0, 1, ...
std::vector<uint8_t> vector_input(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i % 251);
  return v;
}

/// splitmix64, as tests/tools/make_lmcache_hash_goldens.py draws its cases.
struct splitmix64 {
  uint64_t s;
  uint64_t next() {
    s += 0x9E3779B97F4A7C15ULL;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
};

void case_tokens(uint64_t i, size_t* cs, std::vector<int64_t>* toks) {
  static const size_t sizes[] = {1, 2, 3, 16, 64, 256};
  splitmix64 r{i};
  *cs = sizes[r.next() % 6];
  size_t n = r.next() % (*cs * 9 + 1);
  bool big = r.next() % 4 == 0;
  toks->clear();
  for (size_t k = 0; k < n; ++k)
    toks->push_back(static_cast<int64_t>(big ? r.next() % (uint64_t{1} << 32) : r.next() % 152064));
}

} // namespace

TEST_CASE("blake3: the specification's test vectors (hash mode)") {
  // test_vectors/test_vectors.json of BLAKE3-team/BLAKE3: the first 32
  // bytes of each case's "hash".
  struct tv { size_t len; const char* hash; };
  const tv cases[] = {
    {0, "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"},
    {1, "2d3adedff11b61f14c886e35afa036736dcd87a74d27b5c1510225d0f592e213"},
    {1023, "10108970eeda3eb932baac1428c7a2163b0e924c9a9e25b35bba72b28f70bd11"},
    {1024, "42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7"},
    {1025, "d00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444"},
    {2048, "e776b6028c7cd22a4d0ba182a8bf62205d2ef576467e838ed6f2529b85fba24a"},
    {2049, "5f4d72f40d7a5f82b15ca2b2e44b1de3c2ef86c426c95c1af0b6879522563030"},
    {3072, "b98cb0ff3623be03326b373de6b9095218513e64f1ee2edd2525c7ad1e5cffd2"},
    {4096, "015094013f57a5277b59d8475c0501042c0b642e531b0a1c8f58d2163229e969"},
    {5121, "628bd2cb2004694adaab7bbd778a25df25c47b9d4155a55f8fbd79f2fe154cff"},
    {8192, "aae792484c8efe4f19e2ca7d371d8c467ffb10748d8a5a1ae579948f718a2a63"},
    {31744, "62b6960e1a44bcc1eb1a611a8d6235b6b4b78f32e7abc4fb4c6cdcce94895c47"},
    {102400, "bc3e3d41a1146b069abffad3c0d44860cf664390afce4d9661f7902e7943e085"},
  };
  for (auto& c : cases) {
    CAPTURE(c.len);
    auto in = vector_input(c.len);
    auto d = blake3(in.data(), in.size());
    CHECK(hex(d.data(), d.size()) == c.hash);
    // Fed in uneven pieces (block and chunk boundaries fall mid-piece),
    // the incremental hasher gives the same digest.
    blake3_hasher h;
    for (size_t at = 0, step = 1; at < in.size(); at += step, step = step * 3 % 997 + 1)
      h.update(in.data() + at, std::min(step, in.size() - at));
    auto d2 = h.digest();
    CHECK(hex(d2.data(), d2.size()) == c.hash);
  }
}

TEST_CASE("blake3: extended output past one block (131 bytes, as the vectors give)") {
  auto in = vector_input(1);
  blake3_hasher h;
  h.update(in.data(), in.size());
  uint8_t out[131];
  h.finalize(out, sizeof out);
  CHECK(hex(out, sizeof out)
        == "2d3adedff11b61f14c886e35afa036736dcd87a74d27b5c1510225d0f592e213c3a6cb8bf623e20c"
           "db535f8d1a5ffb86342d9c0b64aca3bce1d31f60adfa137b358ad4d79f97b47c3d5e79f179df87a3"
           "b9776ef8325f8329886ba42f07fb138bb502f4081cbcec3195c5871e6c23e2cc97d3c69a613eba13"
           "1e5f1351f3f1da786545e5");
}

TEST_CASE("lmcache token hash: the wheel's TokenHasher on 3000 random token lists") {
  std::ifstream in(std::string(KVS_SOURCE_DIR) + "/tests/fixtures/lmcache_token_hash_goldens.txt");
  REQUIRE(in.good());
  std::string line;
  size_t cases = 0, chunk_lines = 0, nonempty = 0;
  std::vector<std::string> last_hashes;
  uint64_t last_case = UINT64_MAX;
  std::vector<int64_t> toks;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string kind;
    ls >> kind;
    if (kind == "none") {
      std::string h;
      ls >> h;
      auto none = lmcache_none_hash();
      CHECK(hex(none.data(), none.size()) == h);
    } else if (kind == "case") {
      uint64_t i = 0;
      size_t cs = 0, n = 0, chunks = 0;
      std::string last;
      ls >> i >> cs >> n >> chunks >> last;
      size_t my_cs = 0;
      case_tokens(i, &my_cs, &toks);
      REQUIRE(my_cs == cs); // the same draw as the generator
      REQUIRE(toks.size() == n);
      last_hashes.clear();
      last_case = i;
      CHECK(append_lmcache_chunk_hashes(toks.data(), toks.size(), cs, last_hashes) == chunks);
      REQUIRE(last_hashes.size() == chunks);
      if (chunks > 0) {
        CAPTURE(i);
        CHECK(hex(last_hashes.back()).substr(0, 32) == last);
        ++nonempty;
      } else {
        CHECK(last == "-");
      }
      ++cases;
    } else if (kind == "chunk") {
      uint64_t i = 0;
      size_t k = 0;
      std::string h;
      ls >> i >> k >> h;
      REQUIRE(i == last_case);
      REQUIRE(k < last_hashes.size());
      CHECK(hex(last_hashes[k]) == h);
      ++chunk_lines;
    }
  }
  CHECK(cases == 3000);
  CHECK(nonempty > 2500);
  CHECK(chunk_lines > 50);
}

TEST_CASE("lmcache token hash: stops before a chunk with a token outside uint32") {
  std::vector<int64_t> toks = {1, 2, 3, 4, -1, 6, 7, 8};
  std::vector<std::string> out;
  CHECK(append_lmcache_chunk_hashes(toks.data(), toks.size(), 4, out) == 1);
  toks[4] = int64_t{1} << 32;
  out.clear();
  CHECK(append_lmcache_chunk_hashes(toks.data(), toks.size(), 4, out) == 1);
  toks[4] = 0xffffffffLL; // the largest that fits
  out.clear();
  CHECK(append_lmcache_chunk_hashes(toks.data(), toks.size(), 4, out) == 2);
  CHECK(out[0].size() == 32);
}

TEST_CASE("lmcache token hash: keys' uint32 tokens hash as the same int64 tokens") {
  std::vector<uint32_t> k;
  for (uint32_t i = 0; i < 512; ++i) k.push_back(i * 2654435761u);
  std::vector<int64_t> w(k.begin(), k.end());
  std::vector<std::string> a, b;
  CHECK(append_lmcache_chunk_hashes(k.data(), k.size(), 256, a) == 2);
  CHECK(append_lmcache_chunk_hashes(w.data(), w.size(), 256, b) == 2);
  CHECK(a == b);
}
