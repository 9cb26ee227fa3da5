// l1_prefault — faults the L1 pool's pages in ahead of the stores that will
// write them (cache.l1_prefault = "background", the default, or "ahead"), so
// a store into L1 never used before does not pay a page fault per 4 KiB
// (LMCache pre-faults its L1 at start; a store of 256 MiB into never-touched
// L1 took 1,373 ms instead of 67 ms in a Firecracker VM: BENCHMARKS.md,
// "lmcache bench server").
//
// "background": the whole mapping, from start. "ahead": only up to
// `ahead` bytes past the pool's high_water (the end of the highest slot ever
// handed out; every byte below it was written by a store already), so RSS
// grows with use plus one window. The store nudges it (prefault_atom with
// the high water) each time its high water has grown by l1_prefault_nudge; an idle
// prefault waits for that nudge, it polls nothing.
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
/// How far the pool's high water moves between two nudges of the store: the
/// resident window lags use by less than this.
inline constexpr size_t l1_prefault_nudge = size_t{16} << 20;
/// Background work yields to everything else the sidecar runs.
inline constexpr int l1_prefault_nice = background_thread_nice;

struct l1_prefault_params {
  std::shared_ptr<slot_pool> pool;
  /// 0: the whole mapping ("background"); otherwise the "ahead" window.
  size_t ahead = 0;
};

struct l1_prefault_state {
  static inline const char* name = "l1_prefault";
  l1_prefault_params p;
  size_t next = 0;   ///< offset of the next step: [0, next) is resident
  bool busy = false; ///< a step message is on its way
  bool window_logged = false;
  std::string label;
  std::chrono::steady_clock::time_point started;
};

/// Starts faulting in at once; link it to the store (whose exit ends it).
caf::behavior l1_prefault(caf::stateful_actor<l1_prefault_state>* self, l1_prefault_params p);

/// The store's side: after slots were handed out, nudges `prefault` (may be
/// null) when the pool's high water has grown by l1_prefault_nudge since `nudged_at`.
void nudge_l1_prefault(const caf::actor& prefault, const slot_pool& pool, size_t& nudged_at);

} // namespace kvs
