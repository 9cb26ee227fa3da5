// The HTTP side of the sidecar: /metrics, /healthz, /readyz (metrics/), and
// which actors a scrape asks.
#pragma once

#include "app/actor_tree.hpp"
#include "admin/admin_client.hpp"
#include "config/config.hpp"
#include "metrics/collector.hpp"
#include "admin/admin_plane.hpp"
#include "http/http_server.hpp"

#include <caf/actor_system.hpp>

#include <memory>
#include <string>

namespace kvs {

struct observability {
  std::shared_ptr<stats_collector> collector;
  std::shared_ptr<admin_client> admin; ///< LMCache's HTTP control plane (its admin actor)
  std::unique_ptr<http_server> server;
  /// Set when [http] is enabled and the server could not start.
  std::string error;
};

/// Starts the HTTP server when `http.enabled` (before the actor tree, so
/// /readyz answers 503 during start-up).
observability start_observability(caf::actor_system& sys, const config& cfg,
                                  const std::string& me);

/// Scrapes ask every actor of `t` from now on; the control plane asks its store.
void watch_actors(observability& o, const actor_tree& t);

} // namespace kvs
