// md5_hex: RFC 1321's test suite, and lengths around the padding edges
// (checked against Python's hashlib.md5).
#include "cache/md5.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>

using namespace kvs;

TEST_CASE("md5_hex matches RFC 1321's test suite") {
  auto md5 = [](const std::string& s) { return md5_hex(s.data(), s.size()); };
  CHECK(md5("") == "d41d8cd98f00b204e9800998ecf8427e");
  CHECK(md5("a") == "0cc175b9c0f1b6a831c399e269772661");
  CHECK(md5("abc") == "900150983cd24fb0d6963f7d28e17f72");
  CHECK(md5("message digest") == "f96b697d7cb7938d525a2f31aaf161d0");
  CHECK(md5("abcdefghijklmnopqrstuvwxyz") == "c3fcd3d76192e4007dfb496cca67e13b");
  CHECK(md5("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
        == "d174ab98d277d9f5a5611c2c9f419d9f");
  CHECK(md5("12345678901234567890123456789012345678901234567890123456789012345678901234567890")
        == "57edf4a22be3c955ac49da2e2107b67a");
  // 55..128 bytes: the length fits the last block, then it does not.
  CHECK(md5(std::string(55, 'x')) == "04364420e25c512fd958a70738aa8f72");
  CHECK(md5(std::string(56, 'x')) == "668a72d5ba17f08e62dabcafad6db14b");
  CHECK(md5(std::string(63, 'x')) == "7dc2ca208106a2f703567bdff99d8981");
  CHECK(md5(std::string(64, 'x')) == "c1bb4f81d892b2d57947682aeb252456");
  CHECK(md5(std::string(65, 'x')) == "1bc932052302d074bdec39795fe00cf6");
  CHECK(md5(std::string(128, 'x')) == "d69cb61a6ee87200676eb0d4b90edbcb");
}

TEST_CASE("md5_stream: any split of the bytes gives md5_hex's digest") {
  std::string data;
  for (int i = 0; i < 1000; ++i)
    data.push_back(static_cast<char>(i * 37 + (i >> 3)));
  const std::string whole = md5_hex(data.data(), data.size());
  for (size_t piece : {1u, 3u, 63u, 64u, 65u, 200u, 999u, 1000u}) {
    md5_stream s;
    for (size_t at = 0; at < data.size(); at += piece)
      s.update(data.data() + at, std::min(piece, data.size() - at));
    CHECK_MESSAGE(s.hex() == whole, piece);
  }
  md5_stream empty;
  empty.update(nullptr, 0);
  CHECK(empty.hex() == "d41d8cd98f00b204e9800998ecf8427e");
}
