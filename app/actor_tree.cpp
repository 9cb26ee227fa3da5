#include "app/actor_tree.hpp"

#include "app/cache_tree.hpp"
#include "app/relay_tree.hpp"

namespace kvs {

actor_tree spawn_actor_tree(caf::actor_system& sys, zmq::context_t& ctx,
                            zmq::context_t& replay_ctx, const config& cfg,
                            caf::actor supervisor,
                            std::shared_ptr<cache_event_sink> coordinator) {
  actor_tree t;
  std::vector<publisher_actor> publishers;
  if (cfg.events.enabled) {
    auto relay = spawn_relay_tree(sys, ctx, replay_ctx, cfg, supervisor);
    t.input_bridges = std::move(relay.input_bridges);
    t.output_bridges = std::move(relay.output_bridges);
    t.workers = std::move(relay.workers);
    t.queues = std::move(relay.queues);
    t.summary = std::move(relay.summary);
    publishers = std::move(relay.publishers);
  }
  if (cfg.cache.enabled) {
    publisher_actor events_pub;
    relay_queue_ptr events_queue;
    if (cfg.events.enabled && cfg.cache.events_rank >= 0) {
      events_pub = publishers[static_cast<size_t>(cfg.cache.events_rank)];
      events_queue = t.queues[static_cast<size_t>(cfg.cache.events_rank)];
    }
    auto cache = spawn_cache_tree(sys, ctx, cfg, supervisor, events_pub, events_queue,
                                  std::move(coordinator));
    t.input_bridges.insert(t.input_bridges.end(), cache.input_bridges.begin(),
                           cache.input_bridges.end());
    t.workers.insert(t.workers.end(), cache.workers.begin(), cache.workers.end());
    t.summary.insert(t.summary.end(), cache.summary.begin(), cache.summary.end());
    t.gpu = cache.gpu;
    t.store = cache.store;
    t.l2 = cache.l2;
    t.refuse_copies = cache.refuse_copies;
    t.error = cache.error;
  }
  return t;
}

} // namespace kvs
