// admit_budget: a bound on what is in flight between two threads.
//
// A producer admits n units (batches, bytes) before handing work on; the
// consumer releases them once done. Past the limit, admit refuses at once
// and the producer drops and counts the work instead of waiting: the
// sidecar never blocks an engine, and never grows without bound behind a
// slow consumer. The relay's per-rank queue (relay/relay_queue.hpp: batches
// until the PUB socket sent them) and the L2 write-through (bytes of chunk
// copies until the L2 actor wrote them, actors/cache/store_l2.hpp) are both one.
// Atomics only: shared between threads, no lock.
#pragma once

#include <atomic>
#include <cstdint>

namespace kvs {

class admit_budget {
public:
  explicit admit_budget(int64_t limit) : limit_(limit) {}

  /// Reserves n units; false (nothing reserved) when that would pass the limit.
  bool admit(int64_t n = 1) {
    if (used_.fetch_add(n, std::memory_order_acq_rel) + n > limit_) {
      used_.fetch_sub(n, std::memory_order_acq_rel);
      return false;
    }
    return true;
  }
  /// Reserves n units even past the limit (work that must get through).
  void force(int64_t n = 1) { used_.fetch_add(n, std::memory_order_acq_rel); }
  /// n units the consumer is done with.
  void release(int64_t n = 1) { used_.fetch_sub(n, std::memory_order_acq_rel); }

  int64_t in_flight() const { return used_.load(std::memory_order_acquire); }
  int64_t limit() const { return limit_; }

private:
  const int64_t limit_;
  std::atomic<int64_t> used_{0};
};

} // namespace kvs
