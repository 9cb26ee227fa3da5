#include "actors/relay/indexer_snapshot.hpp"

#include "actors/actor_logging.hpp"

#include <algorithm>

namespace kvs {

namespace {

using self_ptr = indexer_actor::stateful_pointer<indexer_state>;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
    .count();
}

void start_next(self_ptr self);

/// Walks the next part of the front snapshot and sends it to its bridge.
void send_part(self_ptr self) {
  auto& st = self->state;
  auto& job = st.snapshots.front();
  snapshot_part part{job.id, job.seq, {}, false};
  for (size_t k = 0; k < snapshot_batches_per_part && !part.last; ++k) {
    kv_event_batch b;
    b.ts = now_seconds();
    b.dp_rank = st.p.published_rank.value_or(st.p.rank);
    b.stored_layout = st.stored_layout;
    part.last = st.index.snapshot_next(snapshot_blocks_per_batch, b.events);
    // The first batch always goes (it tells the router S even when the
    // rank holds no block); later empty ones are not worth a message.
    if (b.events.empty() && job.batches > 0)
      continue;
    ++job.batches;
    for (auto& ev : b.events)
      job.blocks += std::get<block_stored>(ev).block_hashes.size();
    part.batches.push_back(std::move(b));
  }
  const bool last = part.last;
  self->send(job.bridge, std::move(part));
  if (!last)
    return;
  KVS_INFO(st.label, "snapshot {} at seq {}: {} blocks in {} batches", job.id, job.seq,
           job.blocks, job.batches);
  ++st.snapshots_served;
  st.snapshots.pop_front();
  start_next(self);
}

void start_next(self_ptr self) {
  auto& st = self->state;
  while (!st.snapshots.empty()) {
    auto& job = st.snapshots.front();
    if (!st.last_seq) {
      // Nothing published yet: the index is empty and a replay from 0 gets
      // everything. Only the end marker goes.
      self->send(job.bridge, snapshot_part{job.id, 0, {}, true});
      ++st.snapshots_served;
      st.snapshots.pop_front();
      continue;
    }
    job.seq = *st.last_seq;
    const auto id = job.id;
    st.index.begin_snapshot();
    // Two parts in flight: the bridge streams one while the next is walked.
    send_part(self);
    if (!st.snapshots.empty() && st.snapshots.front().id == id)
      send_part(self);
    return;
  }
}

} // namespace

void snapshot_requested(self_ptr self, const snapshot_request& req) {
  auto& st = self->state;
  auto bridge = caf::actor_cast<replay_bridge_actor>(self->current_sender());
  st.snapshots.push_back(indexer_state::snapshot_job{req.id, bridge});
  KVS_DEBUG(st.label, "snapshot {} requested ({} waiting)", req.id, st.snapshots.size() - 1);
  if (st.snapshots.size() == 1)
    start_next(self);
}

void snapshot_credited(self_ptr self, const snapshot_credit& c) {
  auto& st = self->state;
  if (st.snapshots.empty())
    return;
  if (st.snapshots.front().id != c.id) {
    if (c.cancel)
      st.snapshots.erase(std::remove_if(st.snapshots.begin(), st.snapshots.end(),
                                        [&](auto& j) { return j.id == c.id; }),
                         st.snapshots.end());
    return;
  }
  if (!c.cancel) {
    send_part(self);
    return;
  }
  KVS_DEBUG(st.label, "snapshot {} cancelled: its client left", c.id);
  st.index.cancel_snapshot();
  st.snapshots.pop_front();
  start_next(self);
}

} // namespace kvs
