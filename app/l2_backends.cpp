#include "app/l2_backends.hpp"

#include "l2/l2_naming.hpp"
#include "l2/lru_folder.hpp"
#include "l2/redis_backend.hpp"

#include <algorithm>

namespace kvs {

namespace {

using naming_ptr = std::shared_ptr<const l2_naming>;
using opened = expected<std::shared_ptr<l2_backend>>;

opened open_disk(const l2_config& c, const naming_ptr& naming) {
  lru_folder_options o;
  o.path = c.disk.path;
  o.size = c.disk.size;
  auto dir = lru_folder::open(o, naming);
  if (!dir)
    return make_error(dir.error_value().kind,
                      "l2.disk.path = \"" + c.disk.path + "\": " + dir.error_value().detail);
  return std::shared_ptr<l2_backend>(std::move(*dir));
}

opened open_redis(const l2_config& c, const naming_ptr& naming) {
  redis_options o;
  o.endpoints = c.redis.endpoints;
  o.cluster = c.redis.cluster;
  o.password = c.redis.password;
  o.ttl = std::chrono::duration_cast<std::chrono::milliseconds>(c.redis.ttl);
  o.connections = static_cast<int>(c.redis.connections);
  o.timeout = std::max(std::chrono::milliseconds{1},
                       std::chrono::duration_cast<std::chrono::milliseconds>(c.redis.timeout));
  o.retry_after = o.timeout;
  return std::shared_ptr<l2_backend>(
    std::make_shared<redis_backend>(std::move(o), c.redis.key_prefix, naming));
}

struct registration {
  bool (*enabled)(const l2_config&);
  opened (*open)(const l2_config&, const naming_ptr&);
};

/// In lookup order: the node-local folder first (a fetch reads what is on
/// this node before it asks the network).
constexpr registration k_backends[] = {
  {[](const l2_config& c) { return c.disk.enabled; }, open_disk},
  {[](const l2_config& c) { return c.redis.enabled; }, open_redis},
};

} // namespace

expected<std::vector<std::shared_ptr<l2_backend>>> open_l2_backends(const l2_config& cfg) {
  naming_ptr naming = cfg.format == l2_format::lmcache ? naming_ptr(make_lmcache_naming())
                                                       : naming_ptr(make_kvsidecar_naming());
  std::vector<std::shared_ptr<l2_backend>> out;
  for (auto& r : k_backends) {
    if (!r.enabled(cfg))
      continue;
    auto b = r.open(cfg, naming);
    if (!b)
      return b.error_value();
    out.push_back(std::move(*b));
  }
  return out;
}

} // namespace kvs
