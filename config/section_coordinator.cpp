// [coordinator]: LMCache's --coordinator-url, --coordinator-advertise-ip,
// --coordinator-heartbeat-interval and --coordinator-event-reporting.
#include "config/config_reader.hpp"

namespace kvs::config_detail {

void read_coordinator_section(reader& r, loader& l, config& c) {
  auto& k = c.coordinator;
  k.url = r.str("coordinator.url");
  if (!k.url.empty()) {
    if (k.url.rfind("https://", 0) == 0)
      l.fail_at("coordinator.url", "https:// is not supported; use http://host:port");
    else if (k.url.rfind("http://", 0) != 0 || k.url.size() <= 7)
      l.fail_at("coordinator.url", "expected \"http://host:port\", got \"" + k.url + "\"");
  }
  if (!k.url.empty() && !c.http.enabled)
    l.fail_at("coordinator.url", "the coordinator reaches kvsidecar on its HTTP port: "
                                 "set http.enabled = true");
  k.advertise_address = r.str("coordinator.advertise_address");
  k.instance_id = r.str("coordinator.instance_id");
  k.heartbeat_interval = r.dur("coordinator.heartbeat_interval", false);
  k.event_reporting = r.boolean("coordinator.event_reporting");
  k.event_flush_interval = r.dur("coordinator.event_flush_interval", false);
  k.event_queue_max = static_cast<uint64_t>(
    r.integer("coordinator.event_queue_max", 1, int64_t{1} << 24));
  if (k.event_reporting) {
    // The coordinator's directory keys on LMCache's ObjectKey (its 32-byte
    // BLAKE3 chunk hash): only L2 objects in LMCache's format carry it.
    if (k.url.empty())
      l.fail_at("coordinator.event_reporting", "needs coordinator.url");
    else if (!c.l2.enabled() || c.l2.format != l2_format::lmcache)
      l.fail_at("coordinator.event_reporting",
                "kvsidecar reports its L2 objects under LMCache's keys: enable an L2 tier "
                "(l2.disk or l2.redis) with l2.format = \"lmcache\"");
  }
}

} // namespace kvs::config_detail
