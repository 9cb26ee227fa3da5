// session_router: see actors/interfaces.hpp.
#pragma once

#include "actors/interfaces.hpp"
#include "actors/cache/rejected_requests.hpp"

#include <chrono>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvs {

struct session_router_params {
  int64_t chunk_size = 0;                 ///< cache.chunk_size (for the sessions)
  bool l2_lmcache_names = false;          ///< l2.format = "lmcache" (session_params)
  std::chrono::nanoseconds session_ttl{}; ///< cache.session_ttl
  size_t max_sessions = 0;                ///< cache.max_sessions: live sessions at most
  registry_actor registry;
  store_actor store;
  gpu_transfer_actor gpu;
  std::chrono::nanoseconds stats_interval{};
};

struct session_router_state {
  static inline const char* name = "session_router";

  using clock = std::chrono::steady_clock;

  struct session_entry {
    session_actor actor;
    std::vector<int64_t> instances; ///< instances that stored/retrieved through it
    /// The connections (ROUTER / gRPC identities) that sent it requests: a
    /// request id may span the scheduler's and a worker's connection. When
    /// the last of them ends, so does the session.
    std::vector<std::string> peers;
    clock::time_point last_active;  ///< last request routed to it: idle is measured from here
  };

  session_router_params p;
  std::string label;
  engine_bridge_actor bridge; ///< replies go there; it introduces itself (bridge_atom)
  std::unordered_map<std::string, session_entry> sessions;
  /// connection -> the request ids of the sessions it sent requests to
  /// (session_entry::peers the other way round).
  std::unordered_map<std::string, std::vector<std::string>> by_peer;
  rejected_requests rejected;

  uint64_t started = 0;
  uint64_t ended = 0;

  session_router_state() = default;
  session_router_state(const session_router_state&) = delete;
  session_router_state& operator=(const session_router_state&) = delete;
  ~session_router_state();
};

/// The stats line's and /metrics' view of the router.
stats_snapshot snapshot(const session_router_state& st);

session_router_actor::behavior_type
session_router(session_router_actor::stateful_pointer<session_router_state> self,
               session_router_params params);

} // namespace kvs
