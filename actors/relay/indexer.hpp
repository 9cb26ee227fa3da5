// indexer[dp=r]: see actors/interfaces.hpp.
//
// Why an actor of its own: the publisher is the live path (a batch in, seq,
// bytes out). Keeping the block index there made every live batch wait for
// the index update of the batches before it (a full decode of pass-through
// batches) and for any snapshot part being walked and encoded, and on two
// cores a 1 M-block snapshot then cost live batches tens of ms at p99. Here
// the index follows the published stream on its own thread (spawned
// detached), in seq order, so a snapshot is still exactly the state at the
// last seq applied; the publisher only hands each wake-up's batches over
// (moved, pass-through bytes shared). How far behind it may fall is bounded
// by relay_queue::indexing; once it has caught up after a burst it returns
// the freed batches' heap to the system (malloc_trim), so a burst does not
// leave the process tens of MB larger than its index.
#pragma once

#include "relay/block_index.hpp"
#include "actors/interfaces.hpp"
#include "relay/relay_queue.hpp"

#include <chrono>
#include <deque>
#include <optional>
#include <string>

namespace kvs {

/// Batches behind the publisher after which the indexer, once caught up,
/// returns free heap memory to the system (malloc_trim).
constexpr int64_t trim_after_backlog = 256;
/// At most one trim per this interval: malloc_trim walks the whole heap, and
/// under sustained load the freed memory is reused anyway.
constexpr std::chrono::seconds min_trim_interval{1};

struct indexer_params {
  int64_t rank = 0;
  size_t max_blocks = 0; ///< events.index_max_blocks
  std::optional<int64_t> published_rank; ///< the dp_rank snapshots say when set (publisher_params)
  relay_queue_ptr queue; ///< its `indexing` count is released here
  std::chrono::nanoseconds stats_interval{};
};

struct indexer_state {
  static inline const char* name = "index";

  std::string label;
  indexer_params p;
  /// The blocks the rank holds now, from what it published.
  block_index index{0};
  /// The last seq applied (none: nothing published yet).
  std::optional<uint64_t> last_seq;
  /// The BlockStored layout the rank's engine wrote last (vLLM 0.32's
  /// fixmap or 0.33's map16): snapshot batches are written in it, so a
  /// late router gets the bytes its engine would have sent.
  vllm_stored_layout stored_layout = vllm_stored_layout::v0_33;

  /// Snapshot requests in order; the front one is being served.
  struct snapshot_job {
    uint64_t id = 0;
    replay_bridge_actor bridge;
    uint64_t seq = 0;     ///< the seq it is consistent with
    uint64_t batches = 0; ///< sent so far
    uint64_t blocks = 0;
  };
  std::deque<snapshot_job> snapshots;

  int64_t backlog_peak = 0; ///< most batches behind since the last trim
  std::chrono::steady_clock::time_point last_trim{};

  // stats since start
  uint64_t batches = 0;
  uint64_t snapshots_served = 0;
  bool index_full_logged = false;
};

/// The stats line's and /metrics' view of the index.
stats_snapshot snapshot(const indexer_state& st);

indexer_actor::behavior_type
indexer(indexer_actor::stateful_pointer<indexer_state> self, indexer_params params);

} // namespace kvs
