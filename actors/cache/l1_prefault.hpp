// l1_prefault — faults the L1 pool's pages in after start (cache.l1_prefault
// = "background"), so the first stores into L1 do not pay a page fault per
// 4 KiB (LMCache pre-faults its L1 at start; kvsidecar maps it lazily, which
// made a first store into never-touched L1 3-5x slower: BENCHMARKS.md,
// "Side by side with LMCache").
//
// It runs detached, at nice 19 (actors/thread_priority.hpp), one step of
// l1_prefault_step bytes per message, so an exit (the store's, to which it
// is linked) is seen between steps. slot_pool::prefault changes no byte, so
// the store may fill slots meanwhile. It ends by itself when the whole
// mapping is resident, logging how long that took; a kernel without
// MADV_POPULATE_WRITE (before 5.14) or a refusal (ENOMEM) ends it early with
// one WARN: the cache then works as with "off".
#pragma once

#include "actors/interfaces.hpp"
#include "cache/slot_pool.hpp"
#include "core/thread_nice.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace kvs {

/// Bytes faulted in per message: ~10-30 ms of kernel work, so an exit waits
/// at most that long.
inline constexpr size_t l1_prefault_step = size_t{64} << 20;
/// Background work yields to everything else the sidecar runs.
inline constexpr int l1_prefault_nice = background_thread_nice;

struct l1_prefault_state {
  static inline const char* name = "l1_prefault";
  std::shared_ptr<slot_pool> pool;
  size_t next = 0; ///< offset of the next step
  std::string label;
  std::chrono::steady_clock::time_point started;
};

/// Links itself to `store` (its exit ends the prefault) and starts.
caf::behavior l1_prefault(caf::stateful_actor<l1_prefault_state>* self,
                          std::shared_ptr<slot_pool> pool, store_actor store);

} // namespace kvs
