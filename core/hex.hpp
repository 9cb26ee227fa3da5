// hex(): the first bytes of a binary string in hex, for logs (peer
// identities, uid frames).
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

} // namespace kvs
