// publisher[dp=r]: see actors/interfaces.hpp.
#pragma once

#include "actors/block_index.hpp"
#include "actors/interfaces.hpp"
#include "actors/relay_queue.hpp"

#include <chrono>
#include <deque>
#include <string>

namespace kvs {

struct publisher_state {
  static inline const char* name = "publisher";

  std::string label;
  int64_t rank = 0;
  event_dialect dialect = event_dialect::vllm;
  pub_bridge_actor pub_bridge;
  replay_actor replay; ///< may be null (replay off)
  relay_queue_ptr queue;
  uint64_t next_seq = 0;
  /// The blocks the rank holds now, from what it published.
  block_index index{0};

  /// Snapshot requests in order; the front one is being served.
  struct snapshot_job {
    uint64_t id = 0;
    replay_bridge_actor bridge;
    uint64_t seq = 0;     ///< the seq it is consistent with
    uint64_t batches = 0; ///< sent so far
    uint64_t blocks = 0;
  };
  std::deque<snapshot_job> snapshots;

  // stats since start
  uint64_t batches = 0;
  uint64_t events = 0;
  uint64_t snapshots_served = 0;
  bool index_full_logged = false;
};

/// The stats line's and /metrics' view of the publisher.
stats_snapshot snapshot(const publisher_state& st);

publisher_actor::behavior_type
publisher(publisher_actor::stateful_pointer<publisher_state> self, int64_t rank,
          event_dialect dialect, pub_bridge_actor pub_bridge, replay_actor replay,
          relay_queue_ptr queue, std::chrono::nanoseconds stats_interval,
          size_t index_max_blocks);

} // namespace kvs
