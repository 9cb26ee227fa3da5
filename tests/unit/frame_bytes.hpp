// Small helpers the codec tests share: a golden array as a frame, and bytes
// as hex for readable failure messages.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

namespace kvs_test {

template <size_t N>
std::string frame(const unsigned char (&a)[N]) {
  return std::string(reinterpret_cast<const char*>(a), N);
}

inline std::string hex(const std::string& s) {
  std::string out;
  char buf[4];
  for (unsigned char c : s) {
    std::snprintf(buf, sizeof buf, "%02x ", c);
    out += buf;
  }
  return out;
}

} // namespace kvs_test
