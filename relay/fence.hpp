// The restart fence: a batch holding only AllBlocksCleared.
//
// Routers build their block index only from the event stream; when the
// stream they were following ends (the engine restarted, its seq jumped past
// what can be recovered, or the sidecar itself started and a router may
// still hold blocks from before), this batch tells every one of them to drop
// the rank's blocks before the new stream's events arrive.
#pragma once

#include "events_wire/kv_events.hpp"

#include <chrono>

namespace kvs {

/// A batch of the sidecar's own for `rank`, stamped now, with no events
/// (events.keepalive_interval's keep-alive).
inline kv_event_batch empty_batch(int64_t rank) {
  kv_event_batch b;
  b.ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  b.dp_rank = rank;
  return b;
}

inline kv_event_batch fence_batch(int64_t rank) {
  kv_event_batch b = empty_batch(rank);
  b.events.emplace_back(all_blocks_cleared{});
  return b;
}

} // namespace kvs
