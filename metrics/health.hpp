// The process's health, as the HTTP probes report it (/healthz, /readyz).
//
// Plain atomics written on rare transitions (start-up done, a long-lived
// actor died, SIGTERM) and read by the probe handlers: no lock anywhere near
// a hot path.
#pragma once

#include <atomic>

namespace kvs {

struct health_state {
  std::atomic<bool> alive{true}, ready{false}, draining{false};
};

/// The process-wide health state.
inline health_state& health() {
  static health_state state;
  return state;
}

} // namespace kvs
