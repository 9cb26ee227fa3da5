// Survives a SIGBUS in memory a client controls.
//
// The host backend copies to and from POSIX shared memory that an engine
// (a client) created and may shrink at any time with ftruncate. Touching a
// mapped page past the object's new end raises SIGBUS, which would take the
// whole sidecar down for one client's mistake or malice. Checking the size
// before a copy cannot close the race, so the copy runs under a guard
// instead: a process-wide SIGBUS handler (installed on first use) jumps back
// to the guard when the faulting address lies inside one of the ranges the
// *faulting thread* declared, and the guard reports the fault. A SIGBUS
// anywhere else is passed on to whatever handler was there before (the
// default action: the process dies with a core, as it would without us).
//
// What the guarded function may do: it is abandoned mid-way by siglongjmp,
// so it must not own anything with a destructor, hold a lock or allocate.
// Plain loops of memcpy over precomputed addresses are the intended use.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvs {

struct guarded_range {
  const void* base = nullptr;
  size_t size = 0;
};

struct guard_result {
  bool faulted = false;
  size_t range = 0;     ///< index of the range the fault hit (when faulted)
  size_t offset = 0;    ///< byte offset of the fault inside that range
};

/// Runs fn(arg) on the calling thread with SIGBUS inside `ranges` turned
/// into a result. Nesting is allowed (the inner guard's ranges apply).
guard_result run_guarded(const guarded_range* ranges, size_t n, void (*fn)(void*), void* arg);

} // namespace kvs
