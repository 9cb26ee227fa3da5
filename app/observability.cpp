#include "app/observability.hpp"

#include "app/health.hpp"
#include "app/log.hpp"

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>

namespace kvs {

namespace {
/// How long a scrape waits for every actor's snapshot.
constexpr std::chrono::milliseconds scrape_timeout{200};
} // namespace

observability start_observability(caf::actor_system& sys, const config& cfg,
                                  const std::string& me) {
  observability o;
  if (!cfg.http.enabled)
    return o;
  o.collector = std::make_shared<stats_collector>(sys, scrape_timeout);
  std::string why;
  o.server = http_server::start(cfg.http.listen, o.collector, health(), why);
  if (!o.server)
    o.error = "http.listen = \"" + cfg.http.listen + "\": " + why;
  else
    KVS_INFO(me, "serving /metrics, /healthz and /readyz on {} (http.listen)", cfg.http.listen);
  return o;
}

void watch_actors(observability& o, const actor_tree& t, const std::string& me) {
  std::vector<caf::actor> all;
  for (auto* group : {&t.input_bridges, &t.output_bridges, &t.workers})
    all.insert(all.end(), group->begin(), group->end());
  for (auto& a : all) {
    // Every actor's log lines end their label with "#id".
    auto name = "actor #" + std::to_string(a.id());
    a->attach_functor([name, me](const caf::error& reason) {
      // During start-up the handshake reports failures; during shutdown
      // exits are expected.
      if (!health().ready.load() || health().draining.load())
        return;
      health().alive.store(false);
      KVS_ERROR(me, "{} exited while running ({}): /healthz now answers 503", name,
                reason ? caf::to_string(reason) : "normal");
    });
  }
  if (o.collector)
    o.collector->watch(std::move(all));
}

} // namespace kvs
