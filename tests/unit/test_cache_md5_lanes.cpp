// md5_hex_lanes: every path this CPU runs (scalar, AVX2 with loads or
// gathers, AVX-512VL, AVX-512 with loads or gathers) gives md5_stream's digest for
// RFC 1321's vectors, lengths around the padding edges, streams of unequal
// lengths sharing the lanes, and sources handing their bytes over in odd
// pieces from one reused buffer.
#include "cache/md5.hpp"
#include "cache/md5_lanes.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace kvs;

namespace {

const md5_path k_paths[] = {md5_path::best,     md5_path::scalar, md5_path::avx2,
                            md5_path::avx2_gather, md5_path::avx512vl, md5_path::avx512,
                            md5_path::avx512_gather};

std::vector<md5_path> runnable_paths() {
  std::vector<md5_path> out;
  for (md5_path p : k_paths) {
    if (md5_path_available(p))
      out.push_back(p);
    else
      MESSAGE("this CPU cannot run the ", md5_path_name(p), " path: not tested");
  }
  return out;
}

std::string random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s)
    c = static_cast<char>(rng());
  return s;
}

/// A source handing `data` over in pieces of the sizes in `cut` (cycled),
/// each copied into one buffer that the next call overwrites: the lanes
/// must be done with a piece before they ask for the next.
md5_source reused_buffer_source(const std::string& data, std::vector<size_t> cut) {
  return [&data, cut = std::move(cut), at = size_t{0}, turn = size_t{0},
          buf = std::string()]() mutable {
    if (at == data.size())
      return md5_piece{};
    size_t n = std::min(cut[turn++ % cut.size()], data.size() - at);
    std::fill(buf.begin(), buf.end(), '\xee'); // whatever the last piece left is gone
    buf.assign(data, at, n);
    at += n;
    return md5_piece{buf.data(), n};
  };
}

} // namespace

TEST_CASE("md5_hex_lanes matches RFC 1321's test suite on every path") {
  const std::vector<std::pair<std::string, std::string>> rfc = {
    {"", "d41d8cd98f00b204e9800998ecf8427e"},
    {"a", "0cc175b9c0f1b6a831c399e269772661"},
    {"abc", "900150983cd24fb0d6963f7d28e17f72"},
    {"message digest", "f96b697d7cb7938d525a2f31aaf161d0"},
    {"abcdefghijklmnopqrstuvwxyz", "c3fcd3d76192e4007dfb496cca67e13b"},
    {"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
     "d174ab98d277d9f5a5611c2c9f419d9f"},
    {"12345678901234567890123456789012345678901234567890123456789012345678901234567890",
     "57edf4a22be3c955ac49da2e2107b67a"},
  };
  for (md5_path path : runnable_paths()) {
    CAPTURE(md5_path_name(path));
    // Three rounds of the suite: 21 streams, more than 16 lanes, so lanes refill.
    std::vector<md5_source> sources;
    for (int round = 0; round < 3; ++round)
      for (auto& [text, digest] : rfc)
        sources.push_back(md5_pieces({{text.data(), text.size()}}));
    auto got = md5_hex_lanes(std::move(sources), path);
    REQUIRE(got.size() == 3 * rfc.size());
    for (size_t i = 0; i < got.size(); ++i)
      CHECK(got[i] == rfc[i % rfc.size()].second);
  }
}

TEST_CASE("md5_hex_lanes: unequal lengths around the padding edges, whole and in odd pieces") {
  const std::vector<size_t> lengths = {0,   1,   55,   56,   63,   64,    65,  119, 120,
                                       127, 128, 129,  1000, 4099, 65536, 777, 3,   (1u << 20) + 17};
  std::vector<std::string> data;
  std::vector<std::string> want;
  for (size_t i = 0; i < lengths.size(); ++i) {
    data.push_back(random_bytes(lengths[i], 1000 + i));
    want.push_back(md5_hex(data.back().data(), data.back().size()));
  }
  for (md5_path path : runnable_paths()) {
    CAPTURE(md5_path_name(path));
    SUBCASE("one piece each") {
      std::vector<md5_source> sources;
      for (auto& d : data)
        sources.push_back(md5_pieces({{d.data(), d.size()}}));
      CHECK(md5_hex_lanes(std::move(sources), path) == want);
    }
    SUBCASE("odd pieces, each stream cut differently, from a reused buffer") {
      const std::vector<std::vector<size_t>> cuts = {
        {1}, {7, 63}, {64}, {65, 1, 200}, {4099, 13}, {63, 64, 65}, {100000}, {3, 5, 4096}};
      std::vector<md5_source> sources;
      for (size_t i = 0; i < data.size(); ++i)
        sources.push_back(reused_buffer_source(data[i], cuts[i % cuts.size()]));
      CHECK(md5_hex_lanes(std::move(sources), path) == want);
    }
    SUBCASE("pieces listed up front, empty ones among them") {
      std::vector<md5_source> sources;
      for (auto& d : data) {
        std::vector<md5_piece> pieces;
        for (size_t at = 0, n = 5; at < d.size(); at += n, n = n * 3 + 1)
          pieces.push_back({d.data() + at, std::min(n, d.size() - at)});
        pieces.insert(pieces.begin() + static_cast<long>(pieces.size() / 2), md5_piece{});
        sources.push_back(md5_pieces(std::move(pieces)));
      }
      CHECK(md5_hex_lanes(std::move(sources), path) == want);
    }
  }
}

TEST_CASE("md5_hex_lanes: one long stream among short ones, and fewer streams than lanes") {
  const std::string big = random_bytes(3 << 20, 7);
  const std::string small = random_bytes(100, 8);
  for (md5_path path : runnable_paths()) {
    CAPTURE(md5_path_name(path));
    std::vector<md5_source> sources;
    sources.push_back(md5_pieces({{big.data(), big.size()}}));
    for (int i = 0; i < 40; ++i)
      sources.push_back(md5_pieces({{small.data(), small.size()}}));
    auto got = md5_hex_lanes(std::move(sources), path);
    REQUIRE(got.size() == 41);
    CHECK(got[0] == md5_hex(big.data(), big.size()));
    for (size_t i = 1; i < got.size(); ++i)
      CHECK(got[i] == md5_hex(small.data(), small.size()));
    CHECK(md5_hex_lanes({}, path).empty());
    auto two = md5_hex_lanes({md5_pieces({{small.data(), 5}}), md5_pieces({})}, path);
    CHECK(two == std::vector<std::string>{md5_hex(small.data(), 5), md5_hex("", 0)});
  }
}

TEST_CASE("md5 paths: lanes per path, and a path this CPU lacks is refused by name") {
  CHECK(md5_lanes_of(md5_path::scalar) == 1);
  CHECK(md5_lanes_of(md5_path::avx2) == 8);
  CHECK(md5_lanes_of(md5_path::avx512_gather) == 16);
  CHECK(md5_lanes_of(md5_path::best) == md5_lanes_of(md5_best_path()));
  CHECK(md5_path_available(md5_best_path()));
  for (md5_path p : k_paths)
    if (!md5_path_available(p))
      CHECK_THROWS_AS(md5_hex_lanes({}, p), std::invalid_argument);
}
