// The replay log behind subscribe_kv_events (LMCache 0.5.6's kv_event_stream,
// lmcache/v1/multiprocess/modules/kv_events.py): the L1 chunks the store
// committed and evicted, as sequenced records per model, kept for
// subscribers that reconnect with a cursor.
//
// Rules, as LMCache reads its log (KVEventModule.read_kv_events):
// - records have seq 1, 2, 3, …; a cursor is the last seq a reader has seen
//   (0 at first contact);
// - a read returns up to max_events records of its model after the cursor,
//   and next_cursor = the seq of the last record it walked past (records of
//   other models are skipped but still advance it);
// - lost = the cursor is older than the oldest record kept (the log was
//   trimmed past it) or newer than the last one written (a cursor from
//   another incarnation); a `lost` record in the log (never written here:
//   kvsidecar drops no record between store and log) would also set it;
// - the incarnation (the wall clock in ns at start) tells a reader that the
//   server restarted and everything it announced is gone.
//
// Single-threaded: the engine bridge owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace kvs {

struct kv_event_record {
  uint64_t seq = 0;
  bool stored = true;  ///< "stored" or "removed"
  std::string model_name;
  std::vector<uint64_t> block_hashes;
  std::optional<uint64_t> parent_block_hash;
  std::vector<int64_t> token_ids;
};

/// The store's records for the engine bridge's log (a CAF message).
struct kv_event_records {
  std::vector<kv_event_record> records;
};

struct kv_event_batch_out {
  bool enabled = false;
  int64_t incarnation = 0;
  uint64_t next_cursor = 0;
  bool lost = false;
  std::vector<const kv_event_record*> events;  ///< valid until the next append
};

class kv_event_log {
public:
  /// capacity 0: disabled (every read says enabled = false).
  kv_event_log(size_t capacity, int64_t incarnation);

  bool enabled() const { return capacity_ > 0; }
  int64_t incarnation() const { return incarnation_; }
  /// Assigns the record its seq; trims the oldest past capacity.
  void append(kv_event_record r);
  kv_event_batch_out read(const std::string& model, uint64_t cursor, size_t max_events) const;
  uint64_t last_seq() const { return next_seq_ - 1; }
  size_t size() const { return log_.size(); }

private:
  size_t capacity_;
  int64_t incarnation_;
  uint64_t next_seq_ = 1;
  std::deque<kv_event_record> log_;
};

} // namespace kvs
