// Spawns the KV event relay: per DP rank an ingest bridge, a publisher, its
// PUB bridge, an indexer, and (with events.replay_endpoint) a replay buffer
// and its bridge. The cache's counterpart is app/cache_tree.hpp.
#pragma once

#include "actors/interfaces.hpp"
#include "config/config.hpp"
#include "relay/relay_queue.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <zmq.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace kvs {

struct relay_tree {
  std::vector<bridge_actor> input_bridges;  ///< the ingest bridges
  std::vector<bridge_actor> output_bridges; ///< PUB and replay bridges
  std::vector<stats_client_actor> workers;  ///< publishers, indexers, replay buffers
  std::vector<publisher_actor> publishers; ///< one per DP rank (the cache announces on one)
  std::vector<relay_queue_ptr> queues;     ///< one per DP rank
  std::vector<std::string> summary;
};

/// How long closing a PUB socket flushes queued batches to slow
/// subscribers: a quarter of sidecar.shutdown_timeout, at most 1 s (past a
/// second a subscriber is stalled, not slow, and replays what it missed).
std::chrono::nanoseconds pub_linger(const config& cfg);

/// `replay_ctx` serves the replay ROUTERs (its own I/O thread).
relay_tree spawn_relay_tree(caf::actor_system& sys, zmq::context_t& ctx,
                            zmq::context_t& replay_ctx, const config& cfg,
                            caf::actor supervisor);

} // namespace kvs
