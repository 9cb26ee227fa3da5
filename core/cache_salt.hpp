// LMCache's rules for a cache_salt (its ObjectKey invariants), for every
// input that names one outside the MP wire decoder: the HTTP API's
// /quota/{cache_salt} path and the [cache.quotas] config table.
//
// A salt may not contain '@', '/', '\' or NUL, and is at most 128 characters
// (UTF-8 code points) long. The empty salt is the un-salted traffic; the
// HTTP API spells it "_default" (LMCache's sentinel).
#pragma once

#include <cstddef>
#include <string_view>

namespace kvs {

inline constexpr size_t cache_salt_max_chars = 128;
/// The URL/config spelling of the empty salt (LMCache's _DEFAULT_SALT_SENTINEL).
inline constexpr std::string_view cache_salt_default_name = "_default";

/// nullptr when `salt` follows LMCache's rules, else what is wrong.
inline const char* check_cache_salt(std::string_view salt) {
  size_t chars = 0;
  for (char c : salt) {
    if (c == '@' || c == '/' || c == '\\' || c == '\0')
      return "cache_salt must not contain '@', '/', '\\' or NUL";
    // Count code points: every byte but a UTF-8 continuation byte starts one.
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80)
      ++chars;
  }
  if (chars > cache_salt_max_chars)
    return "cache_salt longer than 128 characters";
  return nullptr;
}

/// "_default" -> "" (the un-salted traffic); any other name as it is.
inline std::string_view cache_salt_from_name(std::string_view name) {
  return name == cache_salt_default_name ? std::string_view{} : name;
}
/// "" -> "_default"; any other salt as it is.
inline std::string_view cache_salt_name(std::string_view salt) {
  return salt.empty() ? cache_salt_default_name : salt;
}

} // namespace kvs
