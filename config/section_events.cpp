// [events]: the KV event relay (ingest, publish, replay, index, queues).
#include "config/config_reader.hpp"

namespace kvs::config_detail {

void read_events_section(reader& r, loader& l, config& c) {
  auto& e = c.events;
  e.enabled = r.boolean("events.enabled");
  e.format = r.one_of<event_dialect>(
    "events.format", {{"vllm", event_dialect::vllm}, {"tokenspeed", event_dialect::tokenspeed}});
  e.seq_start_clock = r.one_of<bool>("events.seq_start", {{"zero", false}, {"clock", true}});
  e.keepalive_interval = r.dur("events.keepalive_interval", true);
  e.published_dp_rank_zero =
    r.one_of<bool>("events.published_dp_rank", {{"engine", false}, {"zero", true}});
  e.dp_size = r.integer("events.dp_size", 1, 1024);
  e.ingest_endpoint = r.endpoint("events.ingest_endpoint", false);
  e.ingest_replay_endpoint = r.endpoint("events.ingest_replay_endpoint", true);
  e.ingest_gap_timeout = r.dur("events.ingest_gap_timeout", false);
  e.restart_min_interval = r.dur("events.restart_min_interval", true);
  e.endpoint = r.endpoint("events.endpoint", false);
  e.replay_endpoint = r.endpoint("events.replay_endpoint", true);
  e.join_endpoint = r.endpoint("events.join_endpoint", true);
  if (!l.error && !e.join_endpoint.empty() && e.replay_endpoint.empty())
    l.fail_at("events.join_endpoint", "needs events.replay_endpoint: its router fills the "
                                      "gap after the snapshot from the replay ROUTER");
  e.buffer_steps = r.integer("events.buffer_steps", 0, 100000000);
  e.buffer_bytes = r.size("events.buffer_bytes", 0);
  e.replay_rate = r.integer("events.replay_rate", 0, 1000000000);
  e.replay_nice = r.integer("events.replay_nice", 0, 19);
  e.index_max_blocks = r.integer("events.index_max_blocks", 1, 1000000000);
  e.hwm = r.integer("events.hwm", 1, 1000000000);
  e.ingest_hwm = r.integer("events.ingest_hwm", 1, 1000000000);
  e.ingest_max_message_size = r.size("events.ingest_max_message_size", 1024);
  if (!l.error && e.ingest_max_message_size > (uint64_t{1} << 40))
    l.fail_at("events.ingest_max_message_size", "expected at most 1TiB");
  e.replay_hwm = r.integer("events.replay_hwm", 1, 1000000000);
  e.replay_max_streams = r.integer("events.replay_max_streams", 1, 100000);
  e.replay_max_waiting = r.integer("events.replay_max_waiting", 0, 1000000);
  e.max_connections = r.integer("events.max_connections", 1, 1000000);
  e.max_queue_size = r.integer("events.max_queue_size", 1, 1000000000);
  e.max_queue_bytes = r.size("events.max_queue_bytes", 1024 * 1024);
  if (!l.error && e.max_queue_bytes > (uint64_t{1} << 50))
    l.fail_at("events.max_queue_bytes", "expected at most 1PiB");
  e.topic = r.str("events.topic");
  // Every rank's endpoints must be derivable (vLLM's offset rule).
  for (auto key : {"events.ingest_endpoint", "events.ingest_replay_endpoint",
                   "events.endpoint", "events.replay_endpoint", "events.join_endpoint"}) {
    auto ep = r.str(key);
    if (l.error || ep.empty())
      continue;
    if (auto last = offset_endpoint(ep, e.dp_size - 1); !last)
      l.fail_at(key, "cannot derive the endpoint of dp rank " + std::to_string(e.dp_size - 1)
                       + ": " + last.error_value().detail);
  }
}

} // namespace kvs::config_detail
