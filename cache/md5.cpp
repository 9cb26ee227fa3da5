#include "cache/md5.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace kvs {

namespace md5_detail {

const uint32_t sines[64] = {
  0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
  0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
  0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
  0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
  0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
  0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
  0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
  0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391};

} // namespace md5_detail

namespace {

using md5_detail::sines;

/// Each step's left rotation.
constexpr uint32_t shifts[64] = {7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22,
                                 5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20,
                                 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23,
                                 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21};

uint32_t rotl(uint32_t x, uint32_t c) {
  return (x << c) | (x >> (32 - c));
}

void block(uint32_t h[4], const unsigned char* p) {
  uint32_t m[16];
  for (int i = 0; i < 16; ++i)
    m[i] = uint32_t(p[i * 4]) | uint32_t(p[i * 4 + 1]) << 8 | uint32_t(p[i * 4 + 2]) << 16
           | uint32_t(p[i * 4 + 3]) << 24;
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
  for (uint32_t i = 0; i < 64; ++i) {
    uint32_t f, g;
    if (i < 16) {
      f = (b & c) | (~b & d);
      g = i;
    } else if (i < 32) {
      f = (d & b) | (~d & c);
      g = (5 * i + 1) % 16;
    } else if (i < 48) {
      f = b ^ c ^ d;
      g = (3 * i + 5) % 16;
    } else {
      f = c ^ (b | ~d);
      g = (7 * i) % 16;
    }
    f += a + sines[i] + m[g];
    a = d;
    d = c;
    c = b;
    b += rotl(f, shifts[i]);
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
}

} // namespace

void md5_detail::compress(uint32_t h[4], const unsigned char* p, size_t blocks) {
  for (; blocks > 0; --blocks, p += 64)
    block(h, p);
}

size_t md5_detail::pad_tail(unsigned char out[128], const unsigned char* tail, size_t n,
                            uint64_t total) {
  std::memset(out, 0, 128);
  if (n > 0)
    std::memcpy(out, tail, n);
  out[n] = 0x80;
  size_t len = n + 1 + 8 <= 64 ? 64 : 128;
  uint64_t bits = total * 8;
  for (int i = 0; i < 8; ++i)
    out[len - 8 + i] = static_cast<unsigned char>(bits >> (8 * i));
  return len;
}

std::string md5_detail::hex(const uint32_t h[4]) {
  static const char* digits = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    auto byte = static_cast<unsigned char>(h[i / 4] >> (8 * (i % 4)));
    out[i * 2] = digits[byte >> 4];
    out[i * 2 + 1] = digits[byte & 15];
  }
  return out;
}

void md5_stream::update(const void* data, size_t n) {
  if (n == 0)
    return;
  auto* p = static_cast<const unsigned char*>(data);
  total_ += n;
  if (buffered_ > 0) {
    size_t take = std::min(n, sizeof buf_ - buffered_);
    std::memcpy(buf_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    n -= take;
    if (buffered_ < sizeof buf_)
      return;
    block(h_, buf_);
    buffered_ = 0;
  }
  for (; n >= 64; p += 64, n -= 64)
    block(h_, p);
  std::memcpy(buf_, p, n);
  buffered_ = n;
}

std::string md5_stream::hex() {
  unsigned char tail[128];
  size_t len = md5_detail::pad_tail(tail, buf_, buffered_, total_);
  md5_detail::compress(h_, tail, len / 64);
  return md5_detail::hex(h_);
}

std::string md5_hex(const void* data, size_t n) {
  md5_stream s;
  s.update(data, n);
  return s.hex();
}

} // namespace kvs
