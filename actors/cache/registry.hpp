// registry: see actors/interfaces.hpp.
#pragma once

#include "actors/interfaces.hpp"
#include "gpu/kv_layout.hpp"

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kvs {

/// Filled from the config (app/cache_tree.cpp): no defaults of its own.
struct registry_params {
  int64_t chunk_size = 0; ///< cache.chunk_size
  std::chrono::nanoseconds heartbeat_timeout{};  ///< 0: never reap
  std::chrono::nanoseconds registration_grace{}; ///< for instances that never pinged
  gpu_transfer_actor gpu;
  store_actor store;
  std::chrono::nanoseconds stats_interval{};
  std::vector<std::string> shm_allow_prefixes; ///< cache.shm_allow_prefixes
  uint32_t engine_driven_slots = 16; ///< cache.engine_driven_slots: staging chunks per instance
  bool engine_driven_inline = false; ///< cache.engine_driven_transfer = "inline": no pool
  /// cache.engine_driven_in_place (host backend only): an engine-driven
  /// instance gets an L1 arena and writes / reads L1 slots without a copy.
  bool engine_driven_in_place = false;
};

struct registry_state {
  static inline const char* name = "registry";

  using clock = std::chrono::steady_clock;

  struct instance {
    std::string model;
    int64_t world_size = 0;
    std::string engine;
    std::shared_ptr<const kv_layout> layout;
    size_t tensors = 0;
    clock::time_point last_seen;
    bool pinged = false; ///< has sent a PING (selects heartbeat_timeout over the grace)
    /// Engine-driven registrations (no layout: the engine copies its pages):
    /// the staging pool named in the registration reply.
    bool engine_driven = false;
    std::string shm_name;
    uint64_t pool_size = 0;
  };

  registry_params p;
  std::string label;
  engine_bridge_actor bridge; ///< the session router passes it on (bridge_atom)
  std::map<int64_t, instance> instances;
  uint64_t registered = 0;
  uint64_t reaped = 0;
  uint64_t released = 0; ///< dropped because their connection ended
  uint64_t failed = 0;
};

/// The stats line's and /metrics' view of the registry.
stats_snapshot snapshot(const registry_state& st);

registry_actor::behavior_type registry(registry_actor::stateful_pointer<registry_state> self,
                                       registry_params params);

} // namespace kvs
