#include "app/api_keys.hpp"

#include "core/text_file.hpp"

namespace kvs {

namespace {

std::string strip(const std::string& s) {
  const char* space = " \t\r\n\f\v";
  auto b = s.find_first_not_of(space);
  if (b == std::string::npos)
    return {};
  return s.substr(b, s.find_last_not_of(space) - b + 1);
}

/// The first of `names` set to a non-empty value (LMCache: the new name
/// when set, else the legacy one).
const char* first_set(const env_lookup& env, const char* a, const char* b) {
  if (const char* v = env(a); v && *v)
    return v;
  if (const char* v = env(b); v && *v)
    return v;
  return nullptr;
}

} // namespace

expected<std::vector<std::string>> load_api_keys(const std::vector<std::string>& files,
                                                 const env_lookup& env) {
  std::vector<std::string> paths = files;
  if (const char* f = first_set(env, "LMCACHE_API_KEY_FILE", "LMCACHE_HTTP_API_KEY_FILE"))
    paths.emplace_back(f);
  std::vector<std::string> keys;
  for (auto& path : paths) {
    auto text = read_text_file(path);
    if (!text)
      return make_error("config", "API key file \"" + path + "\" cannot be read");
    auto key = strip(text.value());
    if (key.empty())
      return make_error("config", "API key file is empty: " + path);
    if (key.find_first_of("\r\n") != std::string::npos)
      return make_error("config", "API key file must contain exactly one line: " + path);
    keys.push_back(std::move(key));
  }
  if (const char* v = first_set(env, "LMCACHE_API_KEY", "LMCACHE_HTTP_API_KEY"))
    keys.emplace_back(v);
  return keys;
}

} // namespace kvs
