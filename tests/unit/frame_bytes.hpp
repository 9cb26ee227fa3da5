// Small helpers the codec tests share: a golden array as a frame, and bytes
// as hex for readable failure messages.
#pragma once

#include <cstddef>
#include <string>

namespace kvs_test {

template <size_t N>
std::string frame(const unsigned char (&a)[N]) {
  return std::string(reinterpret_cast<const char*>(a), N);
}

/// "0a ff 00 ": a table lookup per byte, no snprintf (the codec tests
/// compare thousands of random frames as hex; under ASan snprintf per byte
/// took most of a unit test's 120 s budget).
inline std::string hex(const std::string& s) {
  static const char digits[] = "0123456789abcdef";
  std::string out(s.size() * 3, ' ');
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    out[3 * i] = digits[c >> 4];
    out[3 * i + 1] = digits[c & 15];
  }
  return out;
}

} // namespace kvs_test
