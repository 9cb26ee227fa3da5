// relay_queue: the bounded queue of one DP rank's event relay.
//
// "Queued" counts batches accepted for a rank and not yet handed to its PUB
// socket: producers (ingest bridge, store) admit a batch here before sending
// it to the publisher, the PUB bridge releases it after zmq_send. When the
// count reaches max_queue_size, new batches are dropped and counted instead
// of blocking the engine (vLLM's blocking put deadlocks DP ranks).
//
// "Indexing" counts batches the publisher handed to the rank's indexer
// (actors/indexer.hpp) and the indexer has not applied yet. The index is
// kept off the live path, on its own thread; this bound is what keeps a
// slower indexer from growing without limit: past max_queue_size batches
// behind, new batches are dropped and counted here as for a full queue.
// Shared between threads, so atomics and nothing else.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace kvs {

struct relay_queue {
  explicit relay_queue(int64_t max) : max_size(max) {}

  /// Reserves room for one batch; false (and counted) when full.
  bool admit() {
    if (indexing.load(std::memory_order_acquire) >= max_size) {
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

  /// `n` batches left the queue (sent, or dropped downstream).
  void release(int64_t n = 1) {
    queued.fetch_sub(n, std::memory_order_acq_rel);
  }

  const int64_t max_size;
  std::atomic<int64_t> queued{0};
  std::atomic<int64_t> indexing{0}; ///< handed to the indexer, not applied yet
  std::atomic<uint64_t> dropped_full{0};
};

using relay_queue_ptr = std::shared_ptr<relay_queue>;

} // namespace kvs
