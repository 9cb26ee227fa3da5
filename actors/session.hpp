// session[rid=…]: see actors/interfaces.hpp.
#pragma once

#include "actors/interfaces.hpp"

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace kvs {

struct session_params {
  std::string request_id;
  int64_t chunk_size = 256;
  engine_bridge_actor bridge;
  store_actor store;
  gpu_transfer_actor gpu;
};

struct session_state {
  static inline const char* name = "session";

  using clock = std::chrono::steady_clock;

  /// A WAIT_PREFETCH_STATUS parked until the lookup finishes or it times out.
  struct waiter {
    mp_call call;
    clock::time_point deadline;
  };

  session_params p;
  std::string label;

  // Prefetch job of the last LOOKUP: running, done (matched chunks), or none.
  bool lookup_running = false;
  std::optional<uint64_t> matched; ///< until a status query consumes it
  std::optional<uint64_t> hits;    ///< kept for query_prefetch_lookup_hits
  uint64_t lookup_generation = 0;  ///< a newer LOOKUP supersedes older answers
  std::vector<waiter> waiters;

  size_t inflight = 0;  ///< copies not yet finished: the session outlives them
  bool ending = false;
  std::optional<mp_call> end_call; ///< END_SESSION to answer once released
};

session_actor::behavior_type session(session_actor::stateful_pointer<session_state> self,
                                     session_params params);

} // namespace kvs
