// The control plane's keys: cache.quota_mode, [cache.quotas] (per-tenant
// byte limits, keyed by cache_salt), http.admin_token and http.api_key_files.
#include "config/config_reader.hpp"

#include "core/cache_salt.hpp"

namespace kvs::config_detail {

void read_control_section(reader& r, loader& l, config& c) {
  c.cache.quota_isolated = r.one_of<bool>("cache.quota_mode", {{"off", false}, {"isolated", true}});
  if (auto* q = r.table("cache.quotas")) {
    for (auto&& [k, v] : *q) {
      std::string name{k.str()};
      std::string key = "cache.quotas." + name;
      if (auto why = check_cache_salt(name)) {
        l.fail_at(key, std::string{"not a valid cache_salt: "} + why);
        return;
      }
      auto* s = v.as_string();
      auto bytes = s ? parse_size(s->get()) : std::nullopt;
      if (!bytes) {
        l.fail_at(key, "expected a size like \"2GiB\" (the salt's L1 byte limit)");
        return;
      }
      c.cache.quotas.emplace_back(std::string{cache_salt_from_name(name)}, *bytes);
    }
  }
  c.http.admin_token = r.str("http.admin_token");
  if (!c.http.admin_token.empty() && c.http.admin_token.size() < 16)
    l.fail_at("http.admin_token", "expected at least 16 characters (or \"\" for none)");
  // The files are read at start (app/api_keys.hpp), with the environment's.
  c.http.api_key_files = r.strings("http.api_key_files", [](const std::string& s) -> status {
    if (s.empty())
      return make_error("config", "expected a file path, got \"\"");
    return {};
  });
}

} // namespace kvs::config_detail
