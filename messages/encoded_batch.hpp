// A batch after the publisher encoded it: its sequence number and the
// msgpack payload, shared (not copied) between the PUB bridge and the
// replay ring.
#pragma once

#include "events_wire/kv_events.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvs {

struct encoded_batch {
  uint64_t seq = 0;
  std::shared_ptr<const std::string> payload;
};

/// Encoded batches travelling together (publisher -> PUB bridge, replay).
struct encoded_batches {
  std::vector<encoded_batch> items;
};

/// A replay client's request, as the replay bridge decoded it, or the
/// bridge asking for the next part of a replay it streams. The bridge asks
/// part by part (max_batches) so that a client that stops reading pins at
/// most one part of payloads, not the whole buffer as it was when it asked.
struct replay_request {
  /// end_seq of a first part: the replay ends at the newest batch kept now.
  static constexpr uint64_t first_part = ~uint64_t{0};
  std::string client;  ///< ROUTER identity frame
  uint64_t start_seq = 0;
  uint64_t id = 0;                ///< the bridge's name for the stream
  uint64_t end_seq = first_part;  ///< a later part: the replay's last seq
  size_t max_batches = 0;         ///< batches in this part at most (0: all)
};

/// What the replay actor answers: kept batches with seq >= start_seq (and
/// <= end_seq), oldest first. The bridge streams them to `client` at the
/// client's pace. A first part older than the oldest kept batch starts at
/// the oldest (a router asking from 0); a later part whose start was
/// dropped from the buffer meanwhile (its client read too slowly) ends the
/// replay there (`fell_behind`): the client sees the end marker early, then
/// a gap, and asks again.
struct replay_stream {
  std::string client;
  std::vector<encoded_batch> batches;
  uint64_t id = 0;
  uint64_t end_seq = 0;     ///< the replay's last seq (the newest when it began)
  bool last = true;         ///< no part follows
  bool fell_behind = false; ///< the next batch left the buffer before it was sent
};

/// A router's snapshot request, as the replay bridge decoded it (bridge ->
/// indexer). `id` is the bridge's name for the stream.
struct snapshot_request {
  uint64_t id = 0;
};

/// The bridge streamed what it had of snapshot `id` and wants the next part
/// (or, with `cancel`, the client left: stop it).
struct snapshot_credit {
  uint64_t id = 0;
  bool cancel = false;
};

/// Part of snapshot `id` (indexer -> bridge): BlockStored batches, not yet
/// encoded (the bridge encodes them in the published dialect, on its own
/// thread, each carrying `seq`, the seq the snapshot is consistent with).
/// `last`: the end marker follows. A snapshot of a rank that never
/// published is one empty last part.
struct snapshot_part {
  uint64_t id = 0;
  uint64_t seq = 0;
  std::vector<kv_event_batch> batches;
  bool last = false;
};

} // namespace kvs
