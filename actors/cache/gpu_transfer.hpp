// gpu_transfer: see actors/interfaces.hpp. Runs detached (its own thread):
// host copies are memcpy of whole chunks and must not hold up a scheduler
// thread that other actors need.
#pragma once

#include "actors/interfaces.hpp"
#include "gpu/staging_pool.hpp"
#include "gpu/transfer_backend.hpp"

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <memory>
#include <string>

namespace kvs {

struct gpu_transfer_params {
  std::shared_ptr<transfer_backend> backend;
  /// The memory L1 slots live in (the store's slot pool). Copies write into
  /// and read from it by raw pointer, so the transfer actor keeps it alive
  /// until its last copy is over, whenever the store exits.
  std::shared_ptr<const void> l1;
  /// Set by the sidecar at shutdown (from its thread): copies that have not
  /// started are refused at once, including those already queued in the
  /// mailbox, which a drain message cannot overtake.
  std::shared_ptr<std::atomic<bool>> refuse_copies;
  std::chrono::nanoseconds stats_interval{};
  /// Engine-driven staging pools are the sidecar's own memory, allocated at
  /// a client's request: all of them together stay within this (cache.l1_size).
  uint64_t staging_limit_bytes = 0;
};

struct gpu_transfer_state {
  static inline const char* name = "gpu_transfer";

  struct instance {
    std::unique_ptr<opened_pools> pools;
    engine_type engine;
  };
  using clock = std::chrono::steady_clock;
  /// Copies of one direction (0: STORE into L1, 1: RETRIEVE out of it).
  struct direction_stats {
    uint64_t bytes = 0;
    double seconds = 0; ///< submit to completion, summed
    fixed_histogram<10> gbps{&gbps_bounds};
  };
  static inline const std::array<double, 10> gbps_bounds{0.5, 1, 2, 5, 10, 20, 50,
                                                         100, 200, 500};
  struct pending {
    std::unique_ptr<copy_completion> completion;
    std::optional<caf::typed_response_promise<gpu_copy_done>> promise;
    clock::time_point start;
    size_t direction = 0;
    uint64_t bytes = 0;
  };

  /// An engine-driven instance: its staging pool and what a slot holds.
  struct staged_instance {
    std::unique_ptr<staging_pool> pool; ///< null: inline (the data travels in the messages)
    std::vector<int64_t> chunk_shape;
    std::string dtype;
    uint8_t format = 0;
    uint64_t slot_bytes = 0; ///< one chunk's bytes
    stage_groups groups{};   ///< a multi-group (hybrid) instance's groups
    bool in_place = false;   ///< its pool lies in its L1 arena's object
  };

  gpu_transfer_params p;
  std::string label;
  std::map<int64_t, instance> instances;
  std::map<int64_t, staged_instance> staged;
  uint64_t staged_copies = 0;
  uint64_t staged_bytes = 0;
  std::map<uint64_t, pending> inflight;
  uint64_t next_ticket = 1;
  bool polling = false;
  /// Shutdown: new copies are refused; `drained` is answered once no copy
  /// is pending.
  bool draining = false;
  std::optional<caf::typed_response_promise<uint64_t>> drained;
  uint64_t drain_waited = 0;
  uint64_t refused_at_shutdown = 0;

  uint64_t copies = 0;
  uint64_t failed = 0;
  uint64_t bytes = 0;
  std::array<direction_stats, 2> directions;

  /// A copy finished well: its bytes, time and throughput count.
  void finished(size_t direction, uint64_t n, clock::time_point start) {
    auto& d = directions[direction];
    double secs = std::chrono::duration<double>(clock::now() - start).count();
    d.bytes += n;
    d.seconds += secs;
    if (secs > 0)
      d.gbps.observe(static_cast<double>(n) / secs / 1e9);
  }

  gpu_transfer_state() = default;
  gpu_transfer_state(const gpu_transfer_state&) = delete;
  gpu_transfer_state& operator=(const gpu_transfer_state&) = delete;
  /// However the actor ends (drained or killed), no copy outlives it: wait
  /// for every one still in flight, then close the pools; `p.l1` (declared
  /// first, destroyed last) is released after that.
  ~gpu_transfer_state();
};

/// Copies not yet finished (the device may still be writing).
size_t pending_copies(const gpu_transfer_state& st);

/// The stats line's and /metrics' view of the transfer actor.
stats_snapshot snapshot(const gpu_transfer_state& st);

gpu_transfer_actor::behavior_type
gpu_transfer(gpu_transfer_actor::stateful_pointer<gpu_transfer_state> self,
             gpu_transfer_params params);

} // namespace kvs
