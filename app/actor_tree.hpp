// Spawns the actor tree a config describes, and remembers it for shutdown.
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

struct actor_tree {
  /// Bridges that take input from outside: stopped first on shutdown.
  std::vector<bridge_actor> input_bridges;
  /// Bridges that send to the outside: stopped after the drain.
  std::vector<bridge_actor> output_bridges;
  /// Event-based actors: told to exit last.
  std::vector<stats_client_actor> workers;
  /// The cache's copy engine (null without the cache): drained after the
  /// input stops and before the workers exit, so no copy is cut short.
  gpu_transfer_actor gpu;
  /// The cache's store (null without the cache): the HTTP control plane asks it.
  store_actor store;
  /// The L2 actor (null without an L2 tier): the HTTP control plane clears it.
  l2_actor l2;
  /// Set when shutdown begins: the transfer actor starts no copy after it.
  std::shared_ptr<std::atomic<bool>> refuse_copies;
  /// One per DP rank: empty once everything accepted has been sent.
  std::vector<relay_queue_ptr> queues;
  /// One line per actor, for the start-up log.
  std::vector<std::string> summary;
  /// Set when the tree cannot be built (e.g. no GPU with backend "cuda").
  std::string error;

  size_t bridge_count() const {
    return input_bridges.size() + output_bridges.size();
  }
};

/// `replay_ctx` serves the replay ROUTERs: its own I/O thread, so that
/// streaming a whole buffer to a router never delays live publishing.
actor_tree spawn_actor_tree(caf::actor_system& sys, zmq::context_t& ctx,
                            zmq::context_t& replay_ctx, const config& cfg,
                            caf::actor supervisor,
                            std::shared_ptr<cache_event_sink> coordinator = nullptr);

} // namespace kvs
