// replay[dp=r]: see actors/interfaces.hpp.
#pragma once

#include "actors/interfaces.hpp"
#include "actors/replay_ring.hpp"

#include <chrono>
#include <string>

namespace kvs {

struct replay_state {
  static inline const char* name = "replay";

  std::string label;
  int64_t rank = 0;
  replay_ring ring{0};
  uint64_t requests = 0;
  uint64_t batches_served = 0;
};

/// The stats line's and /metrics' view of the replay buffer.
stats_snapshot snapshot(const replay_state& st);

replay_actor::behavior_type
replay(replay_actor::stateful_pointer<replay_state> self, int64_t rank,
       size_t buffer_steps, size_t buffer_bytes, std::chrono::nanoseconds stats_interval);

} // namespace kvs
