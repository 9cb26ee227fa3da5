#include "app/observability.hpp"

#include "app/api_keys.hpp"

#include "metrics/health.hpp"
#include "log/log.hpp"

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>

#include <cstdlib>

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
  o.admin = std::make_shared<admin_client>(sys, cfg);
  auto policy = admin_policy_of(cfg);
  auto keys = load_api_keys(cfg.http.api_key_files, [](const char* n) { return std::getenv(n); });
  if (!keys) {
    // LMCache's server refuses to start on a bad key file too.
    o.error = "http.api_key_files: " + keys.error_value().detail;
    return o;
  }
  policy.api_keys = std::move(keys.value());
  const size_t n_keys = policy.api_keys.size();
  bool open = !policy.loopback && policy.token.empty() && n_keys == 0;
  o.server = http_server::start(cfg.http.listen, o.collector, health(), why,
                                std::make_shared<admin_plane>(o.admin, std::move(policy)));
  if (!o.server) {
    o.error = "http.listen = \"" + cfg.http.listen + "\": " + why;
  } else {
    KVS_INFO(me, "serving /metrics, /healthz, /readyz and LMCache's HTTP control plane on {} "
                 "(http.listen)", cfg.http.listen);
    if (n_keys > 0)
      KVS_INFO(me, "{} HTTP API key(s) accepted (http.api_key_files, LMCACHE_API_KEY...): every "
                   "path but /, /healthcheck, /healthz and /readyz needs one", n_keys);
    if (open)
      KVS_WARN(me, "http.listen {} is not loopback and no http.admin_token (or "
                   "KVSIDECAR_ADMIN_TOKEN) is set: control-plane calls that change state "
                   "(clear, quotas) are refused with 401", cfg.http.listen);
  }
  return o;
}

void watch_actors(observability& o, const actor_tree& t) {
  // Liveness (/healthz) is the supervisor's: an actor that exits while
  // running stops the process (app/supervisor.hpp) after /healthz turns 503.
  if (o.admin)
    o.admin->watch(t.store, t.l2, t.gpu);
  if (!o.collector)
    return;
  // Bridges and workers alike: every interface extends stats_client_actor.
  std::vector<stats_client_actor> all{t.input_bridges.begin(), t.input_bridges.end()};
  all.insert(all.end(), t.output_bridges.begin(), t.output_bridges.end());
  all.insert(all.end(), t.workers.begin(), t.workers.end());
  if (o.admin)
    all.push_back(o.admin->actor());
  o.collector->watch(std::move(all));
}

} // namespace kvs
