// [l2], [l2.disk], [l2.redis]: the tiers behind L1.
#include "config/config_reader.hpp"

namespace kvs::config_detail {

void read_l2_disk(reader& r, loader& l, config& c);
void read_l2_redis(reader& r, loader& l, config& c);

void read_l2_section(reader& r, loader& l, config& c) {
  auto& l2 = c.l2;
  l2.queue_bytes = r.size("l2.queue_bytes", 1 << 20);
  l2.format = r.one_of<l2_format>("l2.format", {{"kvsidecar", l2_format::kvsidecar},
                                                {"lmcache", l2_format::lmcache}});
  l2.quota_isolated = r.one_of<bool>("l2.quota_mode", {{"off", false}, {"isolated", true}});
  l2.quota_watermark = r.real("l2.quota_watermark", 0.0, 1.0);
  l2.quota_eviction_ratio = r.real("l2.quota_eviction_ratio", 0.0, 1.0);
  l2.quota_interval = r.dur("l2.quota_interval", false);
  read_l2_disk(r, l, c);
  read_l2_redis(r, l, c);
}

/// [l2.disk]: the node-local folder (l2/lru_folder.hpp).
void read_l2_disk(reader& r, loader& l, config& c) {
  auto& l2 = c.l2;
  l2.disk.enabled = r.boolean("l2.disk.enabled");
  l2.disk.path = r.str("l2.disk.path");
  l2.disk.size = r.size("l2.disk.size", 1 << 20);
  if (!l.error && l2.disk.enabled && l2.disk.path.empty())
    l.fail_at("l2.disk.path", "expected a directory when l2.disk.enabled is true");
}

/// [l2.redis]: Redis, standalone or Cluster (l2/redis_backend.hpp).
void read_l2_redis(reader& r, loader& l, config& c) {
  auto& rd = c.l2.redis;
  rd.enabled = r.boolean("l2.redis.enabled");
  rd.endpoints = r.strings("l2.redis.endpoints");
  rd.cluster = r.boolean("l2.redis.cluster");
  rd.password = r.str("l2.redis.password");
  rd.key_prefix = r.str("l2.redis.key_prefix");
  rd.ttl = r.dur("l2.redis.ttl", true);
  rd.connections = r.integer("l2.redis.connections", 1, 64);
  rd.timeout = r.dur("l2.redis.timeout", false);
  if (!l.error && rd.enabled && rd.endpoints.empty())
    l.fail_at("l2.redis.endpoints", "expected at least one \"host:port\" when l2.redis.enabled is true");
  for (auto& ep : rd.endpoints) {
    auto colon = ep.rfind(':');
    long port = -1;
    if (colon != std::string::npos && colon > 0 && colon + 1 < ep.size()) {
      char* end = nullptr;
      port = std::strtol(ep.c_str() + colon + 1, &end, 10);
      if (*end != '\0')
        port = -1;
    }
    if (!l.error && (port < 1 || port > 65535))
      l.fail_at("l2.redis.endpoints", "expected \"host:port\" with a port in 1..65535, got \"" + ep + "\"");
  }
}

} // namespace kvs::config_detail
