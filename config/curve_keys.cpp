#include "config/curve_keys.hpp"

#include "core/text_file.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <dirent.h>
#include <sstream>
#include <sys/stat.h>

namespace kvs {

namespace {

const char* const z85_chars =
  "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b])))
    ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1])))
    --e;
  return s.substr(b, e - b);
}

// The quoted value of `name = "..."` in a zcert file, or nullopt.
std::optional<std::string> zcert_value(const std::string& text, const std::string& name) {
  std::istringstream in{text};
  std::string line;
  while (std::getline(in, line)) {
    auto t = trim(line);
    if (t.rfind(name, 0) != 0)
      continue;
    auto q1 = t.find('"');
    auto q2 = t.rfind('"');
    if (q1 == std::string::npos || q2 <= q1)
      return std::nullopt;
    return t.substr(q1 + 1, q2 - q1 - 1);
  }
  return std::nullopt;
}

} // namespace

std::optional<std::string> z85_decode_key(const std::string& z85) {
  if (z85.size() != 40)
    return std::nullopt;
  std::string out;
  out.reserve(32);
  for (size_t i = 0; i < 40; i += 5) {
    uint64_t v = 0;
    for (size_t j = 0; j < 5; ++j) {
      const char* p = z85[i + j] ? std::strchr(z85_chars, z85[i + j]) : nullptr;
      if (!p)
        return std::nullopt;
      v = v * 85 + static_cast<uint64_t>(p - z85_chars);
    }
    if (v > 0xffffffffULL)
      return std::nullopt;
    for (int s = 24; s >= 0; s -= 8)
      out += static_cast<char>((v >> s) & 0xff);
  }
  return out;
}

expected<std::string> read_curve_key(const std::string& path, bool secret) {
  auto read = read_text_file(path);
  if (!read)
    return read.error_value();
  const std::string& text = *read;
  auto z85 = trim(text);
  if (z85.size() != 40) { // not a raw key: zcert
    auto v = zcert_value(text, secret ? "secret-key" : "public-key");
    if (!v)
      return make_error("bad_key", "\"" + path + "\" holds neither a 40-character Z85 key nor a zcert "
                                       + (secret ? "secret-key" : "public-key") + " line");
    z85 = *v;
  }
  auto key = z85_decode_key(z85);
  if (!key)
    return make_error("bad_key",
                      "\"" + path + "\": not a valid Z85 CURVE key (40 characters of the Z85 alphabet)");
  return std::move(*key);
}

expected<std::vector<std::string>> read_curve_public_keys(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (!d)
    return make_error("io", "cannot open the directory \"" + dir + "\"");
  std::vector<std::string> names;
  while (auto* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.empty() || n[0] == '.')
      continue;
    struct stat st {};
    if (stat((dir + "/" + n).c_str(), &st) == 0 && S_ISREG(st.st_mode))
      names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  std::vector<std::string> keys;
  for (auto& n : names) {
    auto k = read_curve_key(dir + "/" + n, false);
    if (!k)
      return k.error_value();
    keys.push_back(*k);
  }
  return keys;
}

} // namespace kvs
