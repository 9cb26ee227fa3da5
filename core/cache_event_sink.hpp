// Where the store (L1 chunks: actors/cache/store_coordinator.hpp) and the
// L2 actor (L2 objects) hand the placements they make and drop, and the
// reads, when [coordinator] event_reporting is on (app/coordinator_events):
// one cache_event per object, in LMCache's key form (core/object_key.hpp),
// so that LMCache's coordinator can put kvsidecar's objects in its key
// directory. offer() never blocks and never fails the caller: a sink that
// cannot keep up drops the event and counts it.
#pragma once

#include "core/object_key.hpp"

#include <cstdint>
#include <string>

namespace kvs {

/// LMCache's CacheEventType: "store", "delete", or "access" (a chunk read
/// from L1, or an object read back from L2, which LMCache's fs and resp
/// adapters report on each load: the coordinator's fleet eviction moves the
/// key to its LRU's young end).
enum class cache_event_kind : uint8_t { store, remove, access };

struct cache_event {
  cache_event_kind kind = cache_event_kind::store;
  bool l1 = false;      ///< tier "l1" (the store's chunks); else "l2"
  std::string backend;  ///< LMCache's L2 adapter name ("fs", "resp"); L1: "dram", "" for access
  bool shared = false;  ///< several instances mount the backend (Redis)
  object_key_fields key;
  uint64_t size_bytes = 0; ///< "store" only
};

class cache_event_sink {
public:
  virtual ~cache_event_sink() = default;
  /// Queues `e`; when the queue is full, drops it (counted). Never blocks.
  virtual void offer(cache_event e) = 0;
  /// The sink's figures (kvsidecar_coordinator_events_*), for the L2
  /// actor's stats line and /metrics.
  struct figures {
    uint64_t queued = 0, dropped = 0, posted = 0, batches = 0, failed_posts = 0, lost = 0;
  };
  virtual figures read() const = 0;
};

} // namespace kvs
