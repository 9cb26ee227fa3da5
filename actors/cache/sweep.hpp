// How often the cache actors look for what has expired (sessions, instances,
// locks, subscriptions).
#pragma once

#include <algorithm>
#include <chrono>

namespace kvs {

/// Never sweep more often than this: a tiny TTL (tests) must not spin.
inline constexpr std::chrono::milliseconds min_sweep_interval{10};
/// Sweeps of long TTLs still run this often by default, so a TTL is never
/// overrun by more than this.
inline constexpr std::chrono::seconds max_sweep_interval{5};

/// A quarter of `ttl` (what expires is ended at most ttl/4 late), within
/// [min_sweep_interval, max_interval].
inline std::chrono::nanoseconds sweep_interval(std::chrono::nanoseconds ttl,
                                               std::chrono::nanoseconds max_interval
                                               = max_sweep_interval) {
  return std::clamp<std::chrono::nanoseconds>(ttl / 4, min_sweep_interval, max_interval);
}

} // namespace kvs
