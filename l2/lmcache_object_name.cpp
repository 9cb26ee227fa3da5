#include "l2/lmcache_object_name.hpp"

#include "core/hex.hpp"

#include <cstdio>
#include <vector>

namespace kvs {

namespace {

constexpr std::string_view k_slash = "-SEP-"; // fs_l2_adapter._PATH_SLASH_REPLACEMENT
constexpr std::string_view k_ext = ".data";   // fs_l2_adapter._FILE_EXT

void append_hex(std::string& out, std::string_view bytes) {
  static const char* d = "0123456789abcdef";
  for (unsigned char c : bytes) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
}

/// The common part: model@rank@group@hash, rank written by `rank_fmt`.
std::string key_body(std::string_view model, const char* rank_fmt, const lmcache_object_key& k) {
  char mid[40];
  int n = std::snprintf(mid, sizeof mid, rank_fmt, k.kv_rank, k.group);
  std::string out;
  out.reserve(model.size() + static_cast<size_t>(n) + 2 * k.chunk_hash.size() + k.salt.size() + 8);
  out.append(model).append(mid, static_cast<size_t>(n));
  append_hex(out, k.chunk_hash);
  if (!k.salt.empty())
    out.append("@").append(k.salt);
  return out;
}

} // namespace

std::optional<uint32_t> parse_hex32(std::string_view s) {
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))
    s.remove_prefix(2);
  if (s.empty() || s.size() > 8)
    return std::nullopt;
  uint32_t v = 0;
  for (char c : s) {
    int d = hex_digit(c);
    if (d < 0)
      return std::nullopt;
    v = (v << 4) | static_cast<uint32_t>(d);
  }
  return v;
}

std::optional<std::string> parse_hex_bytes(std::string_view s) {
  if (s.empty() || s.size() % 2 != 0)
    return std::nullopt;
  std::string out;
  for (size_t i = 0; i < s.size(); i += 2) {
    int hi = hex_digit(s[i]), lo = hex_digit(s[i + 1]);
    if (hi < 0 || lo < 0)
      return std::nullopt;
    out.push_back(static_cast<char>(hi << 4 | lo));
  }
  return out;
}

bool lmcache_nameable(std::string_view model, std::string_view salt) {
  return !model.empty() && model.find_first_of(std::string_view("@\0", 2)) == std::string_view::npos
         && salt.find_first_of(std::string_view("@/\\\0", 4)) == std::string_view::npos
         && salt.size() <= 128;
}

uint32_t lmcache_kv_rank(int32_t world_size, int32_t rank) {
  auto ws = static_cast<uint32_t>(world_size) & 0xff;
  auto r = static_cast<uint32_t>(rank) & 0xff;
  return (ws << 24) | (r << 16) | (ws << 8) | r;
}

std::string lmcache_redis_key(std::string_view prefix, const lmcache_object_key& k) {
  return std::string(prefix) + key_body(k.model, "@%08x@%x@", k);
}

std::string lmcache_file_name(const lmcache_object_key& k) {
  std::string model;
  model.reserve(k.model.size());
  for (char c : k.model) {
    if (c == '/')
      model.append(k_slash);
    else
      model.push_back(c);
  }
  return key_body(model, "@0x%08x@%x@", k).append(k_ext);
}

std::optional<lmcache_file_fields> parse_lmcache_file_name(std::string_view name) {
  if (name.size() <= k_ext.size() || name.substr(name.size() - k_ext.size()) != k_ext)
    return std::nullopt;
  name.remove_suffix(k_ext.size());
  std::vector<std::string_view> parts;
  for (size_t at = 0;;) {
    auto sep = name.find('@', at);
    parts.push_back(name.substr(at, sep == std::string_view::npos ? sep : sep - at));
    if (sep == std::string_view::npos)
      break;
    at = sep + 1;
  }
  if (parts.size() != 4 && parts.size() != 5)
    return std::nullopt;
  auto rank = parse_hex32(parts[1]);
  auto group = parse_hex32(parts[2]);
  auto hash = parse_hex_bytes(parts[3]);
  if (!rank || !group || !hash || parts[0].empty())
    return std::nullopt;
  lmcache_file_fields f;
  f.kv_rank = *rank;
  f.group = *group;
  f.chunk_hash = std::move(*hash);
  for (size_t at = 0; at < parts[0].size();) {
    if (parts[0].substr(at, k_slash.size()) == k_slash) {
      f.model.push_back('/');
      at += k_slash.size();
    } else {
      f.model.push_back(parts[0][at++]);
    }
  }
  if (parts.size() == 5) {
    if (parts[4].empty())
      return std::nullopt;
    f.salt = std::string(parts[4]);
  }
  return f;
}

} // namespace kvs
