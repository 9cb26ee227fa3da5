// Spawns the KV cache server: engine bridge, session router, registry,
// store, GPU transfer (the router spawns a session per request id).
#pragma once

#include "actors/interfaces.hpp"
#include "relay/relay_queue.hpp"
#include "config/config.hpp"
#include "core/cache_event_sink.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <zmq.hpp>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace kvs {

struct cache_tree {
  std::vector<bridge_actor> input_bridges; ///< the engine bridge
  std::vector<stats_client_actor> workers; ///< session router, registry, store, gpu transfer
  gpu_transfer_actor gpu;                ///< drained at shutdown before the workers exit
  store_actor store;                     ///< the HTTP control plane's (admin/admin_actor.hpp)
  l2_actor l2;                           ///< null without an L2 tier: the HTTP clear of "l2" asks it
  std::shared_ptr<std::atomic<bool>> refuse_copies; ///< set at shutdown: no new copy starts
  std::vector<std::string> summary;
  std::string error; ///< non-empty: could not start (e.g. backend "cuda" without a GPU)
};

/// `events` / `events_queue` may be null: the cache then announces nothing.
/// `coordinator`: where L2 reports its objects ([coordinator]
/// event_reporting); null: nowhere.
cache_tree spawn_cache_tree(caf::actor_system& sys, zmq::context_t& ctx,
                                       const config& cfg, caf::actor supervisor,
                                       publisher_actor events, relay_queue_ptr events_queue,
                                       std::shared_ptr<cache_event_sink> coordinator);

} // namespace kvs
