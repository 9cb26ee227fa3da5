// Failed calls to the LMCache fleet coordinator, process-wide: counted by
// app/coordinator_member on its own thread, read by each /metrics scrape
// (kvsidecar_coordinator_calls_failed_total{call}). Plain atomics: the
// membership thread is the only writer, and no data path comes near them.
// (POST /events failures are the L2 actor's figures: app/coordinator_events.)
#pragma once

#include <atomic>
#include <cstdint>

namespace kvs {

struct coordinator_call_failures {
  std::atomic<bool> joined{false}; ///< coordinator.url is set: the series are exported
  std::atomic<uint64_t> registering{0}, heartbeat{0}, deregistering{0};
};

/// The process-wide figures.
inline coordinator_call_failures& coordinator_calls() {
  static coordinator_call_failures figures;
  return figures;
}

} // namespace kvs
