// [cache]: the LMCache server (endpoints, L1, sessions and locks, gRPC and its TLS).
#include "config/config_reader.hpp"
#include "core/text_file.hpp"

#include <tuple>

namespace kvs::config_detail {

namespace {

// A cache.shm_allow_prefixes entry: a name start that shm names can have.
status check_shm_prefix(const std::string& p) {
  auto bare = std::string_view{p};
  if (!bare.empty() && bare.front() == '/')
    bare.remove_prefix(1);
  for (unsigned char c : bare)
    if (c < 0x20 || c == 0x7f || c == '/')
      return make_error("bad_value", "a prefix holds no '/' after the leading one and no control character");
  if (bare.size() > 255)
    return make_error("bad_value", "longer than a shared-memory name can be (255)");
  return {};
}

} // namespace

void read_cache_section(reader& r, loader& l, config& c) {
  auto& k = c.cache;
  k.enabled = r.boolean("cache.enabled");
  k.endpoint = r.endpoint("cache.endpoint", false);
  k.chunk_size = r.integer("cache.chunk_size", 1, 1 << 20);
  k.l1_size = r.size("cache.l1_size", 1 << 20);
  k.l1_prefault = r.one_of<l1_prefault_mode>(
    "cache.l1_prefault", {{"off", l1_prefault_mode::off},
                          {"start", l1_prefault_mode::start},
                          {"background", l1_prefault_mode::background},
                          {"ahead", l1_prefault_mode::ahead}});
  k.l1_prefault_ahead = r.size("cache.l1_prefault_ahead", 1 << 20);
  k.evict_high = r.real("cache.evict_high", 0.01, 1.0);
  k.evict_low = r.real("cache.evict_low", 0.0, 1.0);
  if (!l.error && k.evict_low >= k.evict_high)
    l.fail_at("cache.evict_low", "expected evict_low below evict_high");
  k.session_ttl = r.dur("cache.session_ttl", false);
  k.max_sessions = r.integer("cache.max_sessions", 1, 100000000);
  k.max_connections = r.integer("cache.max_connections", 1, 1000000);
  k.lock_ttl = r.dur("cache.lock_ttl", false);
  k.heartbeat_timeout = r.dur("cache.heartbeat_timeout", true);
  k.registration_grace = r.dur("cache.registration_grace", true);
  if (!l.error && k.registration_grace < k.heartbeat_timeout)
    l.fail_at("cache.registration_grace",
              "expected at least cache.heartbeat_timeout (" + to_string(k.heartbeat_timeout)
                + "), got " + to_string(k.registration_grace));
  k.kv_event_log_size = r.integer("cache.kv_event_log_size", 0, 100000000);
  k.events_rank = r.integer("cache.events_rank", -1, 1023);
  k.hwm = r.integer("cache.hwm", 1, 1000000000);
  k.engine_driven_slots = r.integer("cache.engine_driven_slots", 1, 65536);
  k.engine_driven_inline = r.one_of<bool>("cache.engine_driven_transfer",
                                          {{"shm", false}, {"inline", true}});
  k.engine_driven_in_place = r.boolean("cache.engine_driven_in_place");
  k.l1_arena_extent = r.size("cache.l1_arena_extent", 1 << 20);
  k.l1_arena_ahead = r.boolean("cache.l1_arena_ahead");
  if (!l.error && k.events_rank >= c.events.dp_size)
    l.fail_at("cache.events_rank", "expected -1 or a dp rank below events.dp_size ("
                                     + std::to_string(c.events.dp_size) + "), got "
                                     + std::to_string(k.events_rank));

  k.shm_allow_prefixes = r.strings("cache.shm_allow_prefixes", check_shm_prefix);
  k.grpc_endpoint = r.str("cache.grpc_endpoint");
  if (auto ok = check_grpc_endpoint(k.grpc_endpoint); !ok && !l.error)
    l.fail_at("cache.grpc_endpoint", ok.error_value().detail);
  k.grpc_tls_cert_file = r.str("cache.grpc_tls_cert_file");
  k.grpc_tls_key_file = r.str("cache.grpc_tls_key_file");
  k.grpc_tls_client_ca_file = r.str("cache.grpc_tls_client_ca_file");
  if (!l.error && k.grpc_tls_cert_file.empty() != k.grpc_tls_key_file.empty())
    l.fail_at(k.grpc_tls_cert_file.empty() ? "cache.grpc_tls_key_file" : "cache.grpc_tls_cert_file",
              "TLS needs both cache.grpc_tls_cert_file and cache.grpc_tls_key_file (set both, or "
              "neither)");
  if (!l.error && !k.grpc_tls_client_ca_file.empty() && k.grpc_tls_cert_file.empty())
    l.fail_at("cache.grpc_tls_client_ca_file",
              "client certificates need TLS: set cache.grpc_tls_cert_file and cache.grpc_tls_key_file");
  if (!l.error && !k.grpc_tls_cert_file.empty() && k.grpc_endpoint.rfind("grpc://", 0) != 0)
    l.fail_at("cache.grpc_tls_cert_file", "TLS is for a grpc://host:port cache.grpc_endpoint");
  for (auto [key, file, pem] : {std::tuple{"cache.grpc_tls_cert_file", &k.grpc_tls_cert_file, &k.grpc_tls_cert_pem},
                                std::tuple{"cache.grpc_tls_key_file", &k.grpc_tls_key_file, &k.grpc_tls_key_pem},
                                std::tuple{"cache.grpc_tls_client_ca_file", &k.grpc_tls_client_ca_file,
                                           &k.grpc_tls_client_ca_pem}}) {
    if (l.error || file->empty())
      continue;
    auto text = read_text_file(*file);
    if (!text)
      l.fail_at(key, text.error_value().detail);
    else
      *pem = std::move(*text);
  }
}

} // namespace kvs::config_detail
