// gpu_transfer: see actors/interfaces.hpp. Runs detached (its own thread):
// host copies are memcpy of whole chunks and must not hold up a scheduler
// thread that other actors need.
#pragma once

#include "actors/interfaces.hpp"
#include "gpu/transfer_backend.hpp"

#include <chrono>
#include <map>
#include <memory>
#include <string>

namespace kvs {

struct gpu_transfer_params {
  std::shared_ptr<transfer_backend> backend;
  std::chrono::nanoseconds stats_interval{};
};

struct gpu_transfer_state {
  static inline const char* name = "gpu_transfer";

  struct instance {
    std::unique_ptr<opened_pools> pools;
    std::string engine;
  };
  struct pending {
    std::unique_ptr<copy_completion> completion;
    std::optional<caf::typed_response_promise<gpu_copy_done>> promise;
  };

  gpu_transfer_params p;
  std::string label;
  std::map<int64_t, instance> instances;
  std::map<uint64_t, pending> inflight;
  uint64_t next_ticket = 1;
  bool polling = false;

  uint64_t copies = 0;
  uint64_t failed = 0;
  uint64_t bytes = 0;
};

gpu_transfer_actor::behavior_type
gpu_transfer(gpu_transfer_actor::stateful_pointer<gpu_transfer_state> self,
             gpu_transfer_params params);

} // namespace kvs
