// One streaming, zero-copy msgpack reader for every wire codec (KV event
// batches, LMCache MP frames, torch/IPC wrappers).
//
// It walks the bytes in place: an item's str/bin/ext payload is a pointer
// into the input, arrays and maps only report their element count (the
// caller reads or skips the elements next), so there is no object tree, no
// recursion and nothing allocated. Every read is bounds-checked; a failure
// returns false and error() names the problem and its byte offset. Nothing
// here throws.
//
// The hot path (what event frames are made of: small ints, short strings,
// small containers, nil, uint16/32 token ids) is inlined; the rest is one
// out-of-line switch.
#pragma once

#include "msgpack/utf8.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace kvs::msgpack_io {

enum class value_type : uint8_t { nil, boolean, uint, sint, float32, float64, str, bin, array, map, ext };

inline const char* kind_name(value_type k) {
  switch (k) {
    case value_type::nil: return "nil";
    case value_type::boolean: return "bool";
    case value_type::uint: return "int";
    case value_type::sint: return "int";
    case value_type::float32: return "float";
    case value_type::float64: return "float";
    case value_type::str: return "str";
    case value_type::bin: return "bin";
    case value_type::array: return "array";
    case value_type::map: return "map";
    case value_type::ext: return "ext";
  }
  return "?";
}

/// One msgpack item as the cursor sees it. Integers are normalised: any
/// non-negative value is `uint` (msgpack's signed formats may hold them),
/// only negative ones are `sint`.
struct item {
  value_type kind = value_type::nil;
  uint64_t u = 0;               ///< uint value, bool value
  int64_t i = 0;                ///< sint value (always < 0)
  double f = 0.0;               ///< float value
  const uint8_t* ptr = nullptr; ///< str/bin/ext payload
  uint32_t len = 0;             ///< str/bin/ext byte length; array/map element count
  int8_t ext_type = 0;          ///< ext type code
};

inline uint16_t load16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
inline uint32_t load32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}
inline uint64_t load64(const uint8_t* p) { return (uint64_t{load32(p)} << 32) | load32(p + 4); }

/// A uint of at most 32 bits (positive fixint, uint8, uint16, uint32): what
/// token ids are.
struct small_uint {
  uint32_t value;
  uint32_t size;  ///< bytes it takes: 1, 2, 3 or 5; 0 when p holds another kind
  bool minimal;   ///< no shorter form could hold it (the encoder's choice)
};
/// Reads one at p without branching on its width: token ids are spread over
/// the vocabulary, so whether the next is uint16 or uint32 is a coin toss a
/// branch mispredicts half the time. Needs 5 readable bytes at p.
inline small_uint read_small_uint(const uint8_t* p) {
  const uint32_t b = p[0];
  if (b <= 0x7f)
    return {b, 1, true};
  const uint32_t form = b - 0xcc; // uint8, uint16, uint32: 0, 1, 2 (else wraps high)
  if (form > 2)
    return {0, 0, false};
  static constexpr uint32_t floors[3] = {0x80, 0x100, 0x10000};
  const uint32_t width = 1u << form; // 1, 2, 4 bytes
  const uint32_t value = load32(p + 1) >> (32 - 8 * width);
  return {value, 1 + width, value >= floors[form]};
}


class reader {
public:
  reader(const uint8_t* data, size_t size) : begin_(data), p_(data), end_(data + size) {}

  size_t offset() const { return static_cast<size_t>(p_ - begin_); }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  void seek(size_t off) { p_ = begin_ + off; }
  const uint8_t* at(size_t off) const { return begin_ + off; }
  /// Why the last next()/skip() failed, naming the byte offset.
  const std::string& error() const { return error_; }

  /// Reads one item. str/bin/ext payloads are consumed; array/map elements
  /// are not (the caller reads or skips `len` (x2 for maps) items next).
  __attribute__((always_inline)) bool next(item& it) {
    // Inline fast path for what event frames are made of: small ints, token
    // ids (uint16/32), block hashes (uint64), short strings, small arrays
    // and maps, nil.
    if (p_ != end_) {
      uint8_t b = *p_;
      if (b <= 0x7f) {
        ++p_;
        it.kind = value_type::uint;
        it.u = b;
        return true;
      }
      if (b >= 0x80 && b <= 0x9f) {
        ++p_;
        it.kind = b <= 0x8f ? value_type::map : value_type::array;
        it.len = b & 0x0fu;
        return true;
      }
      size_t left = remaining();
      if (b >= 0xa0 && b <= 0xbf && left > (b & 0x1fu)) {
        it.kind = value_type::str;
        it.ptr = p_ + 1;
        it.len = b & 0x1fu;
        p_ += 1 + it.len;
        return true;
      }
      if (b == 0xc0) {
        ++p_;
        it.kind = value_type::nil;
        return true;
      }
      if (b == 0xcd && left >= 3) {
        it.kind = value_type::uint;
        it.u = load16(p_ + 1);
        p_ += 3;
        return true;
      }
      if (b == 0xce && left >= 5) {
        it.kind = value_type::uint;
        it.u = load32(p_ + 1);
        p_ += 5;
        return true;
      }
      if (b == 0xcf && left >= 9) { // block hashes: two per BlockStored
        it.kind = value_type::uint;
        it.u = load64(p_ + 1);
        p_ += 9;
        return true;
      }
    }
    return next_slow(it);
  }

  /// Token ids: reads a positive fixint, uint16 or uint32 if one is next;
  /// otherwise consumes nothing and returns false (use next()).
  __attribute__((always_inline)) bool next_small_uint(uint64_t& v) {
    size_t left = remaining();
    if (left == 0)
      return false;
    uint8_t b = *p_;
    if (b <= 0x7f) {
      v = b;
      p_ += 1;
      return true;
    }
    if (b == 0xce && left >= 5) {
      v = load32(p_ + 1);
      p_ += 5;
      return true;
    }
    if (b == 0xcd && left >= 3) {
      v = load16(p_ + 1);
      p_ += 3;
      return true;
    }
    return false;
  }

  /// Reads up to n leading small uints (read_small_uint) into dst and
  /// returns how many: it stops at anything else and 5 bytes before the
  /// end, leaving those to next().
  uint32_t small_uints(int64_t* dst, uint32_t n) {
    uint32_t k = 0;
    const uint8_t* p = p_;
    while (k < n && end_ - p >= 5) {
      const small_uint u = read_small_uint(p);
      if (u.size == 0)
        break;
      dst[k++] = u.value;
      p += u.size;
    }
    p_ = p;
    return k;
  }

  /// Everything else, and every error.
  __attribute__((noinline)) bool next_slow(item& it) {
    const uint8_t* start = p_;
    if (read(it))
      return true;
    // Report the item that failed, not how far into it we got.
    p_ = start;
    error_ += " at byte " + std::to_string(offset());
    return false;
  }

  /// Whether `count` more values can possibly follow: each takes at least
  /// one byte. Sets the error when not.
  bool fits(uint64_t count) {
    if (count <= remaining())
      return true;
    error_ = "truncated: " + std::to_string(count) + " more values claimed at byte " +
             std::to_string(offset()) + ", " + std::to_string(remaining()) + " bytes left";
    return false;
  }

  /// Skips `count` complete values without recursion. When `bad_utf8` is
  /// given, sets it if any str inside is not valid UTF-8 (and keeps going).
  bool skip(uint64_t count, bool* bad_utf8 = nullptr) {
    item it;
    while (count > 0) {
      if (!fits(count))
        return false;
      if (!next(it))
        return false;
      --count;
      if (it.kind == value_type::array)
        count += it.len;
      else if (it.kind == value_type::map)
        count += 2 * uint64_t{it.len};
      else if (bad_utf8 && it.kind == value_type::str && !valid_utf8(it.ptr, it.len))
        *bad_utf8 = true;
    }
    return true;
  }

private:
  bool read(item& it) {
    if (p_ == end_)
      return truncated();
    uint8_t b = *p_++;
    if (b <= 0x7f) {
      it.kind = value_type::uint;
      it.u = b;
      return true;
    }
    if (b >= 0xe0) {
      it.kind = value_type::sint;
      it.i = static_cast<int8_t>(b);
      return true;
    }
    if (b <= 0x8f)
      return container(it, value_type::map, b & 0x0fu);
    if (b <= 0x9f)
      return container(it, value_type::array, b & 0x0fu);
    if (b <= 0xbf)
      return payload(it, value_type::str, b & 0x1fu);
    switch (b) {
      case 0xc0: it.kind = value_type::nil; return true;
      case 0xc2: it.kind = value_type::boolean; it.u = 0; return true;
      case 0xc3: it.kind = value_type::boolean; it.u = 1; return true;
      case 0xc4: return need(1) && payload(it, value_type::bin, take8());
      case 0xc5: return need(2) && payload(it, value_type::bin, take16());
      case 0xc6: return need(4) && payload(it, value_type::bin, take32());
      case 0xc7: return need(1) && ext(it, take8());
      case 0xc8: return need(2) && ext(it, take16());
      case 0xc9: return need(4) && ext(it, take32());
      case 0xca: {
        if (!need(4))
          return false;
        uint32_t bits = take32();
        float v;
        std::memcpy(&v, &bits, 4);
        it.kind = value_type::float32;
        it.f = v;
        return true;
      }
      case 0xcb: {
        if (!need(8))
          return false;
        uint64_t bits = take64();
        std::memcpy(&it.f, &bits, 8);
        it.kind = value_type::float64;
        return true;
      }
      case 0xcc: return need(1) && unsigned_int(it, take8());
      case 0xcd: return need(2) && unsigned_int(it, take16());
      case 0xce: return need(4) && unsigned_int(it, take32());
      case 0xcf: return need(8) && unsigned_int(it, take64());
      case 0xd0: return need(1) && signed_int(it, static_cast<int8_t>(take8()));
      case 0xd1: return need(2) && signed_int(it, static_cast<int16_t>(take16()));
      case 0xd2: return need(4) && signed_int(it, static_cast<int32_t>(take32()));
      case 0xd3: return need(8) && signed_int(it, static_cast<int64_t>(take64()));
      case 0xd4: return ext(it, 1);
      case 0xd5: return ext(it, 2);
      case 0xd6: return ext(it, 4);
      case 0xd7: return ext(it, 8);
      case 0xd8: return ext(it, 16);
      case 0xd9: return need(1) && payload(it, value_type::str, take8());
      case 0xda: return need(2) && payload(it, value_type::str, take16());
      case 0xdb: return need(4) && payload(it, value_type::str, take32());
      case 0xdc: return need(2) && container(it, value_type::array, take16());
      case 0xdd: return need(4) && container(it, value_type::array, take32());
      case 0xde: return need(2) && container(it, value_type::map, take16());
      case 0xdf: return need(4) && container(it, value_type::map, take32());
      default: break; // 0xc1: never used
    }
    return fail("invalid msgpack byte 0xc1");
  }

  bool fail(const char* why) {
    error_ = why;
    return false;
  }
  bool truncated() { return fail("truncated"); }
  bool need(size_t n) { return remaining() >= n || truncated(); }
  uint8_t take8() { return *p_++; }
  uint16_t take16() {
    uint16_t v = load16(p_);
    p_ += 2;
    return v;
  }
  uint32_t take32() {
    uint32_t v = load32(p_);
    p_ += 4;
    return v;
  }
  uint64_t take64() {
    uint64_t v = load64(p_);
    p_ += 8;
    return v;
  }
  bool unsigned_int(item& it, uint64_t v) {
    it.kind = value_type::uint;
    it.u = v;
    return true;
  }
  bool signed_int(item& it, int64_t v) {
    if (v >= 0)
      return unsigned_int(it, static_cast<uint64_t>(v));
    it.kind = value_type::sint;
    it.i = v;
    return true;
  }
  bool payload(item& it, value_type k, uint32_t n) {
    if (!need(n))
      return false;
    it.kind = k;
    it.ptr = p_;
    it.len = n;
    p_ += n;
    return true;
  }
  bool ext(item& it, uint32_t n) {
    if (!need(1) || !need(size_t{n} + 1))
      return false;
    it.kind = value_type::ext;
    it.ext_type = static_cast<int8_t>(*p_);
    it.ptr = p_ + 1;
    it.len = n;
    p_ += size_t{n} + 1;
    return true;
  }
  bool container(item& it, value_type k, uint32_t n) {
    it.kind = k;
    it.len = n;
    return true;
  }

  const uint8_t* begin_;
  const uint8_t* p_;
  const uint8_t* end_;
  std::string error_;
};

} // namespace kvs::msgpack_io
