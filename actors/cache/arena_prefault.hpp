// arena_prefault — faults the extents an engine-driven arena claimed ahead
// of need into L1's mapping, so the engine's gather into its next slots
// takes minor page faults instead of allocating and zeroing 4 KiB at a time
// (issue #46; slot_pool::claim_ahead / prefault_extent say what it saves).
// Spawned with cache.l1_arena_ahead only: it moves the zeroing off the
// engine's gather, which pays where the sidecar has a core the engine does
// not use and costs where the gather already uses every core (README).
//
// The store claims an arena's next extent after it has answered the
// prepare_store that filled the last one (and when the arena opens), then
// sends it here as (prefault_atom, offset, length). It runs detached at
// nice 19 (background work yields to the engine's gather and to
// everything else), one extent per message, two MiB per kernel call, so an
// exit (the store's, to which it is linked) is seen between extents. It
// changes no byte: the store may hand the extent's slots out meanwhile.
#pragma once

#include "cache/slot_pool.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace kvs {

struct arena_prefault_state {
  static inline const char* name = "arena_prefault";
  std::shared_ptr<slot_pool> pool;
  std::string label;
  uint64_t extents = 0; ///< faulted in so far
  uint64_t failed = 0;  ///< stopped part-way (a client shrank its object)
};

caf::behavior arena_prefault(caf::stateful_actor<arena_prefault_state>* self,
                             std::shared_ptr<slot_pool> pool);

} // namespace kvs
