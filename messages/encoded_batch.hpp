// A batch after the publisher encoded it: its sequence number and the
// msgpack payload, shared (not copied) between the PUB bridge and the
// replay ring.
#pragma once

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

} // namespace kvs
