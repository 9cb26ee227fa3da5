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

/// A replay client's request, as the replay bridge decoded it.
struct replay_request {
  std::string client;  ///< ROUTER identity frame
  uint64_t start_seq = 0;
};

/// What the replay actor answers: every kept batch with seq >= start_seq,
/// oldest first. The bridge streams it to `client` at the client's pace.
struct replay_stream {
  std::string client;
  std::vector<encoded_batch> batches;
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
