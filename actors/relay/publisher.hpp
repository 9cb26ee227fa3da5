// publisher[dp=r]: see actors/interfaces.hpp.
#pragma once

#include "actors/interfaces.hpp"
#include "relay/relay_queue.hpp"
#include "events_wire/kv_event_payload_pool.hpp"

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace kvs {

struct publisher_params {
  int64_t rank = 0;
  event_dialect dialect = event_dialect::vllm; ///< events.format
  pub_bridge_actor pub_bridge;
  pub_bridge_actor join_bridge; ///< may be null (events.join_endpoint off)
  replay_actor replay;   ///< may be null (replay off)
  indexer_actor indexer; ///< may be null (no block index: tests)
  relay_queue_ptr queue;
  /// Pass-through payloads given this rank's dp_rank are written into its
  /// buffers (the ingest bridge's pool; null: each its own).
  payload_pool_ptr pool;
  std::chrono::nanoseconds stats_interval{};
  uint64_t first_seq = 0; ///< events.seq_start: 0, or the start time in microseconds
  /// events.published_dp_rank = "zero": every batch says this (0); unset:
  /// the batch's own rank (this rank where it has none).
  std::optional<int64_t> published_rank;
  /// events.keepalive_interval: an empty batch after this long without one
  /// (0: never).
  std::chrono::nanoseconds keepalive{};
};

struct publisher_state {
  static inline const char* name = "publisher";

  std::string label;
  publisher_params p;
  uint64_t next_seq = 0;

  // stats since start
  uint64_t batches = 0;
  uint64_t events = 0;
  uint64_t keepalives = 0; ///< empty batches published for events.keepalive_interval
  bool quiet = true;       ///< nothing published since the last keep-alive check
  uint64_t clears = 0;     ///< AllBlocksCleared published while someone listens
  /// Told after each AllBlocksCleared (cache.events_rank's store and L2 actor).
  std::vector<clear_listener_actor> clear_listeners;
};

/// The stats line's and /metrics' view of the publisher.
stats_snapshot snapshot(const publisher_state& st);

publisher_actor::behavior_type
publisher(publisher_actor::stateful_pointer<publisher_state> self, publisher_params params);

} // namespace kvs
