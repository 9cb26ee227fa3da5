// Requests refused for what they are (undecodable, a foreign instance, over
// cache.max_sessions): counted by kind and logged, rate-limited so that a
// broken client cannot flood the log. Used by the engine bridge and the
// session router.
#pragma once

#include "core/hex.hpp"
#include "log/log.hpp"
#include "messages/stats_snapshot.hpp"

#include <cstdint>
#include <map>
#include <string>

namespace kvs {

class rejected_requests {
public:
  /// Logs the first ones of each kind, then one in a thousand.
  void note(const std::string& label, const std::string& peer, const std::string& uid,
            const std::string& op, const std::string& kind, const std::string& detail) {
    auto n = ++by_kind_[kind];
    if (n <= log_first || n % log_every == 0)
      KVS_WARN(label, "bad request from peer {} uid {} op {}: {}: {} (#{} of this kind)", peer,
               uid, op, kind, detail, n);
  }

  uint64_t total() const {
    uint64_t n = 0;
    for (auto& [k, v] : by_kind_)
      n += v;
    return n;
  }

  /// kvsidecar_cache_rejected_requests_total{kind}.
  void add_to(stats_snapshot& s) const {
    for (auto& [kind, n] : by_kind_)
      s.counter("", "kvsidecar_cache_rejected_requests_total", n, "kind", kind);
  }

private:
  static constexpr uint64_t log_first = 10;
  static constexpr uint64_t log_every = 1000;
  std::map<std::string, uint64_t> by_kind_;
};

} // namespace kvs
