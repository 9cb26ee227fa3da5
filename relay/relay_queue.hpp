// relay_queue: the bounded queue of one DP rank's event relay.
//
// "Queued" counts batches accepted for a rank and not yet handed to its PUB
// socket: producers (ingest bridge, store) admit a batch here before sending
// it to the publisher, the PUB bridge releases it after zmq_send. When the
// count reaches max_queue_size, new batches are dropped and counted instead
// of blocking the engine (vLLM's blocking put deadlocks DP ranks).
//
// "Indexing" counts batches the publisher handed to the rank's indexer
// (actors/relay/indexer.hpp) and the indexer has not applied yet, and
// "indexing_bytes" the memory they hold (held_bytes()). The index is kept
// off the live path, on its own thread; these bounds are what keep a slower
// indexer from growing without limit: past max_queue_size batches or
// max_indexing_bytes behind, new batches are dropped and counted here as
// for a full queue. Shared between threads, so atomics and nothing else;
// every count moves through one named call per step (relay_queue below).
#pragma once

#include "core/admit_budget.hpp"
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

/// Every counter of a rank's relay, changed only through the calls below,
/// one per step a batch takes (who calls each is named): the counts balance
/// because no other code touches them.
class relay_queue {
public:
  explicit relay_queue(int64_t max, int64_t max_bytes = INT64_MAX)
      : max_size(max), max_indexing_bytes(max_bytes), queued_(max) {}

  /// Producers (ingest bridge, the store's and L2's announcements, the
  /// publisher's keep-alive): room for one batch; false, and counted, when
  /// the queue or the indexer behind it is full.
  bool admit() {
    if (indexing_.load(std::memory_order_acquire) >= max_size ||
        indexing_bytes_.load(std::memory_order_acquire) >= max_indexing_bytes ||
        !queued_.admit()) {
      dropped_full_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    return true;
  }
  /// The ingest bridge's restart fence, which must get through: admitted
  /// even past max_size, so routers always learn a stream ended. One small
  /// batch per engine restart; counted in forced().
  void admit_always() {
    queued_.force();
    forced_.fetch_add(1, std::memory_order_relaxed);
  }
  /// The PUB bridge: `n` batches left the queue (sent, or dropped by libzmq).
  void sent(int64_t n = 1) { queued_.release(n); }
  /// The publisher handed `n` batches holding `bytes` (held_bytes) to the
  /// rank's indexer.
  void to_indexer(int64_t n, int64_t bytes) {
    indexing_bytes_.fetch_add(bytes, std::memory_order_acq_rel);
    indexing_.fetch_add(n, std::memory_order_acq_rel);
  }
  /// The indexer applied them; returns how many were behind before these.
  int64_t indexed(int64_t n, int64_t bytes) {
    indexing_bytes_.fetch_sub(bytes, std::memory_order_acq_rel);
    return indexing_.fetch_sub(n, std::memory_order_acq_rel);
  }

  int64_t queued() const { return queued_.in_flight(); }
  int64_t indexing() const { return indexing_.load(std::memory_order_acquire); }
  int64_t indexing_bytes() const { return indexing_bytes_.load(std::memory_order_acquire); }
  uint64_t dropped_full() const { return dropped_full_.load(std::memory_order_relaxed); }
  uint64_t forced() const { return forced_.load(std::memory_order_relaxed); }

  const int64_t max_size;
  const int64_t max_indexing_bytes;

private:
  admit_budget queued_;                  ///< accepted, not yet on the wire
  std::atomic<int64_t> indexing_{0};     ///< handed to the indexer, not applied yet
  std::atomic<int64_t> indexing_bytes_{0}; ///< what those hold (held_bytes)
  std::atomic<uint64_t> dropped_full_{0};
  std::atomic<uint64_t> forced_{0};      ///< fences admitted past max_size or not
};

using relay_queue_ptr = std::shared_ptr<relay_queue>;

} // namespace kvs
