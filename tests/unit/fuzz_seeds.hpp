// The committed fuzz seeds (tests/fuzz/seeds/<fuzzer>/*.bin, written by
// tests/tools/make_fuzz_seeds.py) and what the seed tests need to check
// that each one decodes.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace kvs_seeds {

/// (file name, bytes) of every seed of `fuzzer`, sorted by name.
inline std::vector<std::pair<std::string, std::string>> load(const std::string& fuzzer) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(KVS_SOURCE_DIR) / "tests" / "fuzz" / "seeds" / fuzzer;
  std::vector<std::pair<std::string, std::string>> out;
  REQUIRE_MESSAGE(fs::is_directory(dir), dir.string() << " missing: run tests/tools/make_fuzz_seeds.py");
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".bin")
      continue;
    std::ifstream f(e.path(), std::ios::binary);
    out.emplace_back(e.path().filename().string(),
                     std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A decoder's result is its value or an error: a std::variant<T, error>
// (value first) or kvs::expected<T> (core/error.hpp). These accept either, so
// the seed tests do not depend on which one a decoder returns.
template <class R>
auto decoded(const R& r, int) -> decltype(r.has_value()) {
  return r.has_value();
}
template <class... Ts>
bool decoded(const std::variant<Ts...>& r, long) {
  return r.index() == 0;
}
template <class R>
bool decoded(const R& r) {
  return decoded(r, 0);
}

template <class R>
auto value(const R& r, int) -> decltype(r.value()) {
  return r.value();
}
template <class... Ts>
const auto& value(const std::variant<Ts...>& r, long) {
  return std::get<0>(r);
}
template <class R>
decltype(auto) value(const R& r) {
  return value(r, 0);
}

} // namespace kvs_seeds
