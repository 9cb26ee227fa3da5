// Our own KV events (store, L2) to a publisher, through the rank's bounded
// relay queue like the engine's batches: dropped and counted when full.
#pragma once

#include "actors/interfaces.hpp"
#include "relay/relay_queue.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvs {

/// BlockStored events per batch when chunks are announced again after an
/// AllBlocksCleared (the store's L1, the L2 tiers'): batches of a few
/// hundred KB at 256-token chunks, so a large cache goes out as many small
/// batches (each one seq, each one slot of the relay queue) rather than one
/// frame of megabytes.
inline constexpr size_t reannounce_batch_events = 64;

/// Seconds since the epoch, as a batch's `ts`.
double wall_seconds();

/// The BlockStored event of one chunk we hold (`medium`: "CPU", "DISK",
/// "SHARED"); the block is a chunk of `block_size` tokens.
kv_event chunk_stored(uint64_t hash, std::optional<uint64_t> parent, std::vector<int64_t> tokens,
                      int64_t block_size, const char* medium);

/// " (N batches dropped: relay queue full)" when `dropped` grew past
/// `before` while chunks were announced again, else "".
std::string dropped_suffix(uint64_t before, uint64_t dropped);

/// Sends `events` as one batch (nothing when empty or no publisher); false
/// (and ++*dropped) when the queue is full.
template <class Self>
bool announce_events(Self* self, const publisher_actor& to, const relay_queue_ptr& queue,
                     std::vector<kv_event> events, uint64_t* dropped) {
  if (events.empty() || !to)
    return true;
  if (!queue->admit()) {
    ++*dropped;
    return false;
  }
  kv_event_batch b;
  b.ts = wall_seconds();
  b.events = std::move(events);
  kv_event_batches one;
  one.items.push_back(std::move(b));
  self->send(to, publish_atom_v, std::move(one));
  return true;
}

/// Chunks announced again after an AllBlocksCleared (the store's, the L2
/// actor's): collected and sent in batches of reannounce_batch_events.
template <class Self>
class reannounce_batches {
public:
  reannounce_batches(Self* self, const publisher_actor& to, const relay_queue_ptr& queue,
                     uint64_t* dropped)
    : self_(self), to_(to), queue_(queue), dropped_(dropped) {}
  void add(kv_event e) {
    events_.push_back(std::move(e));
    if (events_.size() == reannounce_batch_events)
      flush();
  }
  void flush() {
    announce_events(self_, to_, queue_, std::move(events_), dropped_);
    events_.clear();
  }

private:
  Self* self_;
  const publisher_actor& to_;
  const relay_queue_ptr& queue_;
  uint64_t* dropped_;
  std::vector<kv_event> events_;
};

} // namespace kvs
