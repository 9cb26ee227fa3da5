// relay_queue: the bounded queue of one DP rank's event relay.
//
// "Queued" counts batches accepted for a rank and not yet handed to its PUB
// socket: producers (ingest bridge, store) admit a batch here before sending
// it to the publisher, the PUB bridge releases it after zmq_send. When the
// count reaches max_queue_size, new batches are dropped and counted instead
// of blocking the engine (vLLM's blocking put deadlocks DP ranks).
//
// "Indexing" counts batches the publisher handed to the rank's indexer
// (actors/indexer.hpp) and the indexer has not applied yet, and
// "indexing_bytes" the memory they hold (held_bytes()). The index is kept
// off the live path, on its own thread; these bounds are what keep a slower
// indexer from growing without limit: past max_queue_size batches or
// max_indexing_bytes behind, new batches are dropped and counted here as
// for a full queue. Shared between threads, so atomics and nothing else.
#pragma once

#include "events_wire/kv_events.hpp"

#include <atomic>
#include <cstdint>
#include <memory>

namespace kvs {

/// What a batch handed to the indexer holds in memory until it is applied:
/// a pass-through batch's frame and record, or a decoded batch's events.
inline int64_t held_bytes(const kv_event_batch& b) {
  size_t n = sizeof(kv_event_batch);
  if (b.wire) {
    n += b.wire->bytes->size();
    if (const auto& r = b.wire->events)
      n += r->events.size() * sizeof(canonical_event) + r->hashes.size() * sizeof(uint64_t)
           + r->tokens.size() * sizeof(int32_t);
  }
  n += b.events.size() * sizeof(kv_event);
  for (const auto& ev : b.events)
    if (const auto* s = std::get_if<block_stored>(&ev))
      n += (s->block_hashes.size() + s->token_ids.size()) * sizeof(uint64_t);
  return static_cast<int64_t>(n);
}

struct relay_queue {
  explicit relay_queue(int64_t max, int64_t max_bytes = INT64_MAX)
      : max_size(max), max_indexing_bytes(max_bytes) {}

  /// Reserves room for one batch; false (and counted) when full.
  bool admit() {
    if (indexing.load(std::memory_order_acquire) >= max_size ||
        indexing_bytes.load(std::memory_order_acquire) >= max_indexing_bytes) {
      dropped_full.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (queued.fetch_add(1, std::memory_order_acq_rel) >= max_size) {
      queued.fetch_sub(1, std::memory_order_acq_rel);
      dropped_full.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    return true;
  }

  /// Room for a batch that must get through (the restart fence): admitted
  /// even past max_size, so routers always learn a stream ended. One small
  /// batch per engine restart; counted in `forced`.
  void admit_always() {
    queued.fetch_add(1, std::memory_order_acq_rel);
    forced.fetch_add(1, std::memory_order_relaxed);
  }
  /// `n` batches left the queue (sent, or dropped downstream).
  void release(int64_t n = 1) {
    queued.fetch_sub(n, std::memory_order_acq_rel);
  }

  const int64_t max_size;
  const int64_t max_indexing_bytes;
  std::atomic<int64_t> queued{0};
  std::atomic<int64_t> indexing{0}; ///< handed to the indexer, not applied yet
  std::atomic<int64_t> indexing_bytes{0}; ///< what those hold (held_bytes)
  std::atomic<uint64_t> dropped_full{0};
  std::atomic<uint64_t> forced{0}; ///< fences admitted past max_size or not (admit_always)
};

using relay_queue_ptr = std::shared_ptr<relay_queue>;

} // namespace kvs
