#include "app/relay_tree.hpp"

#include "actors/relay/indexer.hpp"
#include "actors/relay/ingest_bridge.hpp"
#include "actors/relay/join_bridge.hpp"
#include "actors/relay/pub_bridge.hpp"
#include "actors/relay/publisher.hpp"
#include "actors/relay/replay.hpp"
#include "actors/relay/replay_bridge.hpp"

#include <caf/actor_cast.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

namespace kvs {

std::chrono::nanoseconds pub_linger(const config& cfg) {
  constexpr std::chrono::seconds max_pub_linger{1};
  return std::min<std::chrono::nanoseconds>(cfg.sidecar.shutdown_timeout / 4, max_pub_linger);
}

relay_tree spawn_relay_tree(caf::actor_system& sys, zmq::context_t& ctx,
                            zmq::context_t& replay_ctx, const config& cfg,
                            caf::actor supervisor) {
  relay_tree t;
  auto& publishers = t.publishers;
  auto& ev = cfg.events;
  auto interval = cfg.sidecar.stats_interval;
  auto dialect = ev.format;
  // One start for every rank: microseconds since the epoch stay above any
  // earlier run's seq (a rank publishing a batch per microsecond for years
  // would be needed to catch up), so a restart never makes the seq go back.
  const uint64_t first_seq =
    ev.seq_start_clock
      ? static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count())
      : 0;
  std::vector<payload_pool_ptr> pools; // one per rank: its ingest bridge's and publisher's
  for (int64_t r = 0; r < ev.dp_size; ++r) {
    auto queue = std::make_shared<relay_queue>(ev.max_queue_size,
                                               static_cast<int64_t>(ev.max_queue_bytes));
    t.queues.push_back(queue);
    // Large payloads' memory, kept for reuse up to what the rank's replay
    // buffer holds at most anyway.
    auto pool = payload_pool::make(static_cast<size_t>(ev.buffer_bytes));
    pools.push_back(pool);

    replay_actor rep;
    if (!ev.replay_endpoint.empty()) {
      replay_params rpp;
      rpp.rank = r;
      rpp.buffer_steps = static_cast<size_t>(ev.buffer_steps);
      rpp.buffer_bytes = static_cast<size_t>(ev.buffer_bytes);
      rpp.stats_interval = interval;
      rep = sys.spawn(replay, rpp);
      t.workers.push_back(rep);
    }

    // On its own thread: index updates and snapshot walks never hold up a
    // CAF worker the publisher needs.
    indexer_params xp;
    xp.rank = r;
    xp.max_blocks = static_cast<size_t>(ev.index_max_blocks);
    if (ev.published_dp_rank_zero)
      xp.published_rank = 0;
    xp.queue = queue;
    xp.stats_interval = interval;
    auto idx = sys.spawn<caf::detached>(indexer, xp);
    t.workers.push_back(idx);

    pub_bridge_params pp;
    pp.rank = r;
    pp.endpoint = offset_endpoint(ev.endpoint, r).value();
    pp.config_key = "events.endpoint";
    pp.topic = ev.topic;
    pp.hwm = ev.hwm;
    pp.queue = queue;
    pp.linger = pub_linger(cfg);
    pp.curve_secret_key = cfg.security.curve_secret_key;
    pp.max_connections = ev.max_connections;
    auto pub = spawn_bridge<pub_bridge>(sys, ctx, supervisor, interval, pp);
    t.output_bridges.push_back(pub);

    publisher_params ppp;
    if (!ev.join_endpoint.empty()) {
      join_bridge_params jp;
      jp.rank = r;
      jp.endpoint = offset_endpoint(ev.join_endpoint, r).value();
      jp.config_key = "events.join_endpoint";
      jp.topic = ev.topic;
      jp.dialect = dialect;
      jp.hwm = ev.hwm;
      jp.indexer = idx;
      jp.linger = pp.linger;
      jp.curve_secret_key = cfg.security.curve_secret_key;
      jp.max_connections = ev.max_connections;
      auto join = spawn_bridge<join_bridge>(sys, ctx, supervisor, interval, jp);
      t.output_bridges.push_back(join);
      ppp.join_bridge = join;
      t.summary.push_back(fmt::format("dp={}: publisher -> join_bridge {} (state, then live)", r,
                                      jp.endpoint));
    }
    ppp.rank = r;
    ppp.dialect = dialect;
    ppp.pub_bridge = pub;
    ppp.replay = rep;
    ppp.indexer = idx;
    ppp.queue = queue;
    ppp.pool = pool;
    ppp.stats_interval = interval;
    ppp.first_seq = first_seq;
    ppp.keepalive = ev.keepalive_interval;
    if (ev.published_dp_rank_zero)
      ppp.published_rank = 0;
    auto p = sys.spawn(publisher, ppp);
    publishers.push_back(p);
    if (rep) {
      replay_bridge_params rp;
      rp.rank = r;
      rp.endpoint = offset_endpoint(ev.replay_endpoint, r).value();
      rp.config_key = "events.replay_endpoint";
      rp.topic = ev.topic;
      rp.dialect = dialect;
      rp.replay = rep;
      rp.indexer = idx;
      rp.rate = ev.replay_rate;
      rp.curve_secret_key = cfg.security.curve_secret_key;
      rp.max_connections = ev.max_connections;
      rp.hwm = ev.replay_hwm;
      rp.max_streams = ev.replay_max_streams;
      rp.max_waiting = ev.replay_max_waiting;
      rp.nice = static_cast<int>(ev.replay_nice);
      t.output_bridges.push_back(
        spawn_bridge<replay_bridge>(sys, replay_ctx, supervisor, interval, rp));
      t.summary.push_back(fmt::format("dp={}: replay (last {} batches) <- replay_bridge {}", r,
                                      ev.buffer_steps, rp.endpoint));
    }
    t.workers.push_back(p);
    t.summary.push_back(fmt::format("dp={}: publisher ({}) -> pub_bridge {}", r, to_string(ev.format),
                                    pp.endpoint));
  }
  for (int64_t r = 0; r < ev.dp_size; ++r) {
    ingest_bridge_params ip;
    ip.rank = r;
    ip.endpoint = offset_endpoint(ev.ingest_endpoint, r).value();
    ip.replay_endpoint = ev.ingest_replay_endpoint.empty()
                           ? std::string{}
                           : offset_endpoint(ev.ingest_replay_endpoint, r).value();
    ip.gap_timeout = ev.ingest_gap_timeout;
    ip.restart_min_interval = ev.restart_min_interval;
    ip.max_connections = ev.max_connections;
    ip.hwm = ev.ingest_hwm;
    ip.max_message_size = static_cast<int64_t>(ev.ingest_max_message_size);
    // A seq jump past what our own replay keeps is treated as a new stream.
    ip.jump_limit = static_cast<uint64_t>(std::max<int64_t>(ev.buffer_steps, 1));
    ip.dialect = dialect;
    ip.publishers = publishers;
    ip.queues = t.queues;
    ip.pool = pools[static_cast<size_t>(r)];
    t.input_bridges.push_back(
      spawn_bridge<ingest_bridge>(sys, ctx, supervisor, interval, ip));
    t.summary.push_back(fmt::format("dp={}: ingest_bridge {} -> publisher", r, ip.endpoint));
  }
  return t;
}

} // namespace kvs
