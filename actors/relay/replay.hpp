// replay[dp=r]: see actors/interfaces.hpp.
#pragma once

#include "actors/interfaces.hpp"
#include "relay/replay_ring.hpp"

#include <chrono>
#include <string>

namespace kvs {

struct replay_params {
  int64_t rank = 0;
  size_t buffer_steps = 0; ///< events.buffer_steps: batches kept at most
  size_t buffer_bytes = 0; ///< events.buffer_bytes: their payload bytes at most (0 = no bound)
  std::chrono::nanoseconds stats_interval{};
};

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
replay(replay_actor::stateful_pointer<replay_state> self, replay_params params);

} // namespace kvs
