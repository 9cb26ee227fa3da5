// [security]: CURVE for the ZeroMQ sockets (the server key, the allowed clients).
#include "config/config_reader.hpp"
#include "config/curve_keys.hpp"

namespace kvs::config_detail {

void read_security_section(reader& r, loader& l, config& c) {
  auto& sec = c.security;
  sec.curve_secret_key_file = r.str("security.curve_secret_key_file");
  sec.curve_allowed_clients_dir = r.str("security.curve_allowed_clients_dir");
  if (!l.error && sec.curve_secret_key_file.empty() != sec.curve_allowed_clients_dir.empty()) {
    // Named at the key that was set, where the operator looks.
    bool secret_set = !sec.curve_secret_key_file.empty();
    l.fail_at(secret_set ? "security.curve_secret_key_file" : "security.curve_allowed_clients_dir",
              std::string{"CURVE also needs "}
                + (secret_set ? "security.curve_allowed_clients_dir" : "security.curve_secret_key_file")
                + " (set both, or neither)");
  }
  if (!l.error && sec.curve_enabled()) {
    auto key = read_curve_key(sec.curve_secret_key_file, true);
    if (!key)
      l.fail_at("security.curve_secret_key_file", key.error_value().detail);
    else
      sec.curve_secret_key = *key;
    if (!l.error) {
      auto keys = read_curve_public_keys(sec.curve_allowed_clients_dir);
      if (!keys)
        l.fail_at("security.curve_allowed_clients_dir", keys.error_value().detail);
      else
        sec.curve_allowed_keys = std::move(*keys);
    }
  }
}

} // namespace kvs::config_detail
