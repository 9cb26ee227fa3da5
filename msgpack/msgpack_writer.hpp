// One msgpack writer for every wire codec, writing the bytes msgspec writes:
// ints in their smallest encoding (msgspec and msgpack-c agree), every float
// as float64, str8 for 32..255-byte strings, and whatever header width the
// caller asks for where msgspec's choice depends on the struct, not the count
// (map_header).
//
// It appends to a caller-owned std::string through a cursor, growing at most
// geometrically, so the fixed-size writes of the hot path are plain stores
// (std::string::append per item was a quarter of the event encode time).
// Call finish() once at the end to trim the slack.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kvs::msgpack_io {

class writer {
public:
  explicit writer(std::string& out) : out_(out), pos_(out.size()) {}
  ~writer() { finish(); }
  writer(const writer&) = delete;
  writer& operator=(const writer&) = delete;

  /// Makes room for `n` more bytes (a rough size, so the buffer grows once).
  void reserve(size_t n) {
    if (out_.size() - pos_ < n)
      grow(n);
  }
  /// Trims the slack; idempotent (the destructor calls it too).
  void finish() { out_.resize(pos_); }

  void raw(const void* p, size_t n) {
    if (n == 0)
      return; // an empty view may carry a null pointer, which memcpy must not get
    reserve(n);
    std::memcpy(&out_[pos_], p, n);
    pos_ += n;
  }
  void byte(uint8_t b) {
    reserve(1);
    out_[pos_++] = static_cast<char>(b);
  }

  void nil() { byte(0xc0); }
  void boolean(bool v) { byte(v ? 0xc3 : 0xc2); }

  void uint(uint64_t v) {
    reserve(9);
    char* p = &out_[pos_];
    if (v < 0x80) {
      p[0] = static_cast<char>(v);
      pos_ += 1;
    } else if (v <= 0xff) {
      p[0] = static_cast<char>(0xcc);
      p[1] = static_cast<char>(v);
      pos_ += 2;
    } else if (v <= 0xffff) {
      p[0] = static_cast<char>(0xcd);
      be(p + 1, v, 2);
      pos_ += 3;
    } else if (v <= 0xffffffffu) {
      p[0] = static_cast<char>(0xce);
      be(p + 1, v, 4);
      pos_ += 5;
    } else {
      p[0] = static_cast<char>(0xcf);
      be(p + 1, v, 8);
      pos_ += 9;
    }
  }

  void sint(int64_t v) {
    if (v >= 0) {
      uint(static_cast<uint64_t>(v));
      return;
    }
    reserve(9);
    char* p = &out_[pos_];
    const uint64_t bits = static_cast<uint64_t>(v);
    if (v >= -32) {
      p[0] = static_cast<char>(v);
      pos_ += 1;
    } else if (v >= -128) {
      p[0] = static_cast<char>(0xd0);
      p[1] = static_cast<char>(v);
      pos_ += 2;
    } else if (v >= -32768) {
      p[0] = static_cast<char>(0xd1);
      be(p + 1, bits, 2);
      pos_ += 3;
    } else if (v >= -2147483648LL) {
      p[0] = static_cast<char>(0xd2);
      be(p + 1, bits, 4);
      pos_ += 5;
    } else {
      p[0] = static_cast<char>(0xd3);
      be(p + 1, bits, 8);
      pos_ += 9;
    }
  }

  /// msgspec writes every Python float as float64 (msgpack-c would write an
  /// integral double as an int).
  void float64(double d) {
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    reserve(9);
    out_[pos_] = static_cast<char>(0xcb);
    be(&out_[pos_ + 1], bits, 8);
    pos_ += 9;
  }

  void array(uint32_t n) { header(n, 0x90, 0xdc, 0xdd); }
  void map(uint32_t n) { header(n, 0x80, 0xde, 0xdf); }
  /// msgspec sizes a tagged struct's map header for the most entries the
  /// struct can have (its fields + the tag), not for the entries written:
  /// fixmap while that is <= 15, map16 above.
  void map_for(uint32_t n, uint32_t max_entries) {
    if (max_entries <= 15) {
      byte(static_cast<uint8_t>(0x80 | n));
    } else {
      reserve(3);
      out_[pos_] = static_cast<char>(0xde);
      be(&out_[pos_ + 1], n, 2);
      pos_ += 3;
    }
  }

  void str(std::string_view s) {
    const size_t n = s.size();
    if (n < 32)
      byte(static_cast<uint8_t>(0xa0 | n));
    else
      sized(n, 0xd9, 0xda, 0xdb);
    raw(s.data(), n);
  }
  /// A literal key or tag: fixstr, checked at compile time.
  template <size_t N>
  void key(const char (&s)[N]) {
    static_assert(N - 1 < 32, "fixstr only");
    reserve(N);
    out_[pos_] = static_cast<char>(0xa0 | (N - 1));
    std::memcpy(&out_[pos_ + 1], s, N - 1);
    pos_ += N;
  }
  void bin(std::string_view s) {
    sized(s.size(), 0xc4, 0xc5, 0xc6);
    raw(s.data(), s.size());
  }
  /// ext8/16/32 (never fixext: every reader takes these for any length).
  void ext(int8_t type, std::string_view s) {
    sized(s.size(), 0xc7, 0xc8, 0xc9);
    byte(static_cast<uint8_t>(type));
    raw(s.data(), s.size());
  }

private:
  static void be(char* p, uint64_t v, int n) {
    for (int k = 0; k < n; ++k)
      p[k] = static_cast<char>(v >> (8 * (n - 1 - k)));
  }
  void header(uint64_t n, uint8_t fix, uint8_t c16, uint8_t c32) {
    if (n < 16)
      byte(static_cast<uint8_t>(fix | n));
    else
      wide(n, c16, c32);
  }
  void sized(uint64_t n, uint8_t c8, uint8_t c16, uint8_t c32) {
    if (n <= 0xff) {
      reserve(2);
      out_[pos_] = static_cast<char>(c8);
      out_[pos_ + 1] = static_cast<char>(n);
      pos_ += 2;
    } else {
      wide(n, c16, c32);
    }
  }
  void wide(uint64_t n, uint8_t c16, uint8_t c32) {
    reserve(5);
    if (n <= 0xffff) {
      out_[pos_] = static_cast<char>(c16);
      be(&out_[pos_ + 1], n, 2);
      pos_ += 3;
    } else {
      out_[pos_] = static_cast<char>(c32);
      be(&out_[pos_ + 1], n, 4);
      pos_ += 5;
    }
  }
  void grow(size_t n) {
    const size_t want = pos_ + n;
    // Doubling, but not past memory the string already has when that is
    // enough: a caller that reserved the exact size (a dp_rank rewrite)
    // must not get a reallocation and a copy of everything written so far.
    const size_t doubled = std::max(want, 2 * out_.size());
    out_.resize(want <= out_.capacity() ? std::min(doubled, out_.capacity()) : doubled);
  }

  std::string& out_;
  size_t pos_;
};

} // namespace kvs::msgpack_io
