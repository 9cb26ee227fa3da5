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
  if (k.event_reporting)
    l.fail_at("coordinator.event_reporting",
              "reporting cache events (CacheEventBatch) to the coordinator is not built yet: "
              "set false (membership alone works)");
}

} // namespace kvs::config_detail
