// Hex digits: hex(), the first bytes of a binary string in hex (logs: peer
// identities, uid frames; object names), and hex_digit(), one digit's value
// (JSON's \u escapes, %-escapes, LMCache's hashes in object names and keys).
#pragma once

#include <cstddef>
#include <string>

namespace kvs {

/// The first `max` bytes of `s` in hex (peer identities, uid frames).
inline std::string hex(const std::string& s, size_t max = 16) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

/// The value of one hex digit; -1 when `c` is none.
inline int hex_digit(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

} // namespace kvs
