// stats_collector: what /metrics serves, gathered on each scrape.
//
// A scrape asks every long-lived actor for its stats_snapshot (metrics_atom,
// answered on the actor's own thread between its other messages) and waits
// at most `timeout` for all of them: the hot paths never do anything for
// metrics besides the counters they keep anyway. An actor that does not
// answer in time (busy, or gone) is exported with its last answer and
// counted in kvsidecar_scrape_timeouts_total.
#pragma once

#include "messages/stats_client.hpp"
#include "messages/stats_snapshot.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace kvs {

class stats_collector : public prometheus::Collectable {
public:
  stats_collector(caf::actor_system& sys, std::chrono::milliseconds timeout);

  /// The actors to ask from now on (every long-lived actor's interface
  /// extends stats_client_actor).
  void watch(std::vector<stats_client_actor> actors);

  std::vector<prometheus::MetricFamily> Collect() const override;

private:
  std::vector<stats_snapshot> ask() const;
  stats_snapshot process_snapshot() const;

  caf::actor_system& sys_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mu_; ///< one scrape at a time; guards everything below
  std::vector<stats_client_actor> targets_;
  mutable std::map<caf::actor_id, stats_snapshot> last_;
  mutable std::map<std::string, uint64_t> timeouts_; ///< by actor label
};

} // namespace kvs
