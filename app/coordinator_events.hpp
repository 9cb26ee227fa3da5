// Cache-event reporting to an LMCache fleet coordinator ([coordinator]
// event_reporting, LMCache 0.5.6's --coordinator-event-reporting:
// lmcache.v1.mp_coordinator.cache_events, CacheEventSubscriber +
// HttpCacheEventSink). The L2 actor offers each object it writes or drops
// (core/cache_event_sink.hpp); every flush_interval this thread groups the
// queued events into CacheEventBatch lists as LMCache's subscriber does
// (consecutive events of one type, tier and backend share a batch; seq
// 1, 2, 3, ... per incarnation; incarnation = the start time in seconds)
// and sends them in one POST /events {"batches": [...]}.
//
// Never in the data path's way: offer() takes a mutex for a push and drops
// (counted) past queue_max events. As LMCache's sink, a failed POST (the
// coordinator down, slow past 2 s, or answering non-2xx) drops what it
// carried (counted as lost) and leaves a seq gap, which the coordinator
// logs; nothing is retried. Events wait in the queue until the coordinator
// has given us an instance id (coordinator_member::set_reporter).
#pragma once

#include "app/peer_failure_log.hpp"
#include "core/cache_event_sink.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kvs {

/// One tier's capacity declaration (a CacheEventBatch of type "config"):
/// the denominator of the coordinator's usage view.
struct declared_capacity {
  std::string backend; ///< "fs", "resp"; L1: "dram"
  bool shared = false;
  uint64_t bytes = 0;  ///< 0: no limit declared (Redis: its maxmemory is not ours)
  bool l1 = false;     ///< tier "l1" (cache.l1_size), else "l2"
};

class coordinator_events final : public cache_event_sink {
public:
  coordinator_events(std::string url, std::string instance_id,
                     std::chrono::milliseconds flush_interval, size_t queue_max,
                     std::vector<declared_capacity> capacity, std::string me);
  /// Sends what is queued (one POST, within its deadline), then stops.
  ~coordinator_events() override;

  void offer(cache_event e) override;
  figures read() const override;
  /// The id the coordinator registered us under (coordinator_member); each
  /// registration (a restarted coordinator forgot everything) declares the
  /// capacity again with the next POST.
  void set_instance_id(const std::string& id);
  /// Before deregistering (coordinator_member's shutdown): sends what is
  /// queued, then posts nothing more -- events after a DELETE /instances
  /// would put placements of a departed instance back in the directory.
  void leave();

  /// One POST /events body for `events` (exposed for the unit test):
  /// batches numbered from seq_after + 1; *batches_out: how many.
  static std::string encode(const std::vector<cache_event>& events, const std::string& id,
                            int64_t incarnation, uint64_t seq_after, double ts,
                            uint64_t* batches_out);
  /// The "config" batches (one per backend) of declaration `revision`, as
  /// JSON array members, numbered from seq_after + 1.
  static std::string encode_capacity(const std::vector<declared_capacity>& capacity,
                                     const std::string& id, int64_t incarnation,
                                     uint64_t seq_after, uint64_t revision, double ts);

private:
  void run();
  void flush();

  std::string url_, me_;
  std::chrono::milliseconds interval_;
  size_t queue_max_;
  int64_t incarnation_;
  uint64_t seq_ = 0;
  peer_failure_log failures_;
  std::vector<declared_capacity> capacity_;
  uint64_t revision_ = 0;

  std::mutex post_mu_; ///< one flush at a time (the thread's, leave()'s): seq_, failures_
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<cache_event> queue_;
  std::string id_;
  bool declare_ = true; ///< the next POST starts with the capacity declaration
  bool stop_ = false;
  bool left_ = false; ///< leave() ran: the id is never set again
  std::atomic<uint64_t> queued_{0}, dropped_{0}, posted_{0}, batches_{0}, failed_{0}, lost_{0};
  std::thread thread_;
};

} // namespace kvs
