// Keeps a client's ftruncate of its L1 arena from killing the sidecar.
//
// An engine-driven client opens its arena's object (slot_pool.hpp) read-write
// and may shrink it; a sidecar thread then touching an L1 slot in that
// arena (an L2 write-back, another client's retrieve, a checksum) would die
// of SIGBUS. Guarding every reader is a guard at every L1 access; instead a
// process-wide SIGBUS handler, when the fault lies in an extent of a
// registered pool that is mapped from an arena object now shorter than it
// must be, grows the object back (ftruncate is async-signal-safe) and
// returns: the access is re-run and reads zeros. Only the client that
// truncated loses data, and only its own arena's chunks. A fault anywhere
// else (or one growing cannot fix) is passed to the handler that was there
// before (gpu/fault_guard.hpp's, or the default: a core dump).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace kvs {

/// One pool's extents, as the handler reads them: fds[i] is the object
/// mapped at extent i (-1: anonymous memory), sizes[i] the size that object
/// must have. Written by the pool's owner with release stores.
struct arena_heal_table {
  uintptr_t base = 0;
  size_t len = 0;
  size_t extent = 0;
  size_t n = 0;
  const std::atomic<int>* fds = nullptr;
  const std::atomic<uint64_t>* sizes = nullptr;
};

/// Installs the handler (once) and registers `t` (false: 16 tables already).
bool arena_heal_add(const arena_heal_table* t);
void arena_heal_remove(const arena_heal_table* t);
/// How many faults the handler healed (for tests and the store's stats).
uint64_t arena_heal_count();

} // namespace kvs
