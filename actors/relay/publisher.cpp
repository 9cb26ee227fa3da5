#include "actors/relay/publisher.hpp"

#include "actors/actor_logging.hpp"
#include "relay/fence.hpp"
#include "events_wire/kv_event_codec.hpp"


namespace kvs {

namespace {

/// The payload to publish: a pass-through batch's own bytes (shared, not
/// copied, when its dp_rank already is the one to publish; else copied with
/// only dp_rank rewritten), any other batch encoded.
std::shared_ptr<const std::string> encode(kv_event_batch& batch, event_dialect dialect,
                                          payload_pool* pool) {
  if (batch.wire && batch.wire->dialect == dialect) {
    const canonical_wire& w = *batch.wire;
    if (w.layout.dp_rank == batch.dp_rank)
      return w.bytes;
    // dp_rank is the last item: at most 9 bytes.
    const size_t size = w.layout.rank_offset + 9;
    auto payload = pool ? pool->take(size) : std::make_shared<std::string>();
    payload->reserve(size);
    encode_canonical_with_rank(reinterpret_cast<const uint8_t*>(w.bytes->data()), w.layout,
                               batch.dp_rank, *payload);
    return payload;
  }
  decode_wire_events(batch); // bytes of another dialect: never with one config
  auto payload = std::make_shared<std::string>();
  encode_event_batch(batch, dialect, *payload);
  return payload;
}

} // namespace

stats_snapshot snapshot(const publisher_state& st) {
  stats_snapshot s;
  s.actor = st.label;
  s.labels = {{"dp_rank", std::to_string(st.p.rank)}};
  s.counter("batches", "kvsidecar_events_published_total", st.batches)
    .counter("events", "kvsidecar_events_published_events_total", st.events)
    .counter("keepalives", "kvsidecar_events_keepalives_total", st.keepalives)
    .log_only("clears", st.clears)
    .gauge("next_seq", "kvsidecar_events_seq", st.next_seq)
    .gauge("queued", "kvsidecar_events_queued", st.p.queue->queued())
    // Counted where the batch was refused: kvsidecar_events_dropped_total
    // {reason="queue_full"} of the ingest rank.
    .log_only("dropped_queue_full", st.p.queue->dropped_full());
  return s;
}

publisher_actor::behavior_type
publisher(publisher_actor::stateful_pointer<publisher_state> self, publisher_params params) {
  auto& st = self->state;
  st.p = std::move(params);
  st.next_seq = st.p.first_seq;
  st.label = log::label(publisher_state::name, "dp=" + std::to_string(st.p.rank), self->id());
  log_lifecycle(self, st.label,
                fmt::format("started, dialect {}", to_string(st.p.dialect)));
  arm_stats(self, st.p.stats_interval);
  // The live path: number, encode (or pass through), hand to the PUB bridge
  // and the replay ring. The block index is the indexer's job on its own
  // thread: it gets the batches themselves (pass-through ones undecoded), so
  // nothing here waits for index updates or snapshot parts.
  auto emit = [self](kv_event_batches& in) {
    auto& st = self->state;
    const uint64_t first_seq = st.next_seq;
    encoded_batches out;
    out.items.reserve(in.items.size());
    st.quiet = false;
    bool cleared = false;
    for (auto& batch : in.items) {
      if (!st.clear_listeners.empty() && !cleared)
        cleared = clears_all_blocks(batch);
      // A router may want every rank's endpoint to say 0
      // (events.published_dp_rank = "zero"); pass-through bytes then get
      // only their rank rewritten.
      if (st.p.published_rank)
        batch.dp_rank = st.p.published_rank;
      else if (!batch.dp_rank)
        batch.dp_rank = st.p.rank;
      out.items.push_back(
        encoded_batch{st.next_seq++, encode(batch, st.p.dialect, st.p.pool.get())});
      ++st.batches;
      st.events += batch.event_count();
    }
    if (st.p.replay)
      self->send(st.p.replay, record_atom_v, out);
    if (st.p.join_bridge)
      self->send(st.p.join_bridge, publish_atom_v, out);
    self->send(st.p.pub_bridge, publish_atom_v, std::move(out));
    if (st.p.indexer) {
      int64_t bytes = 0;
      for (const auto& batch : in.items)
        bytes += held_bytes(batch);
      st.p.queue->to_indexer(static_cast<int64_t>(in.items.size()), bytes);
      self->send(st.p.indexer, publish_atom_v, first_seq, bytes, std::move(in));
    }
    // After the clear is numbered: what the listener publishes in answer
    // comes through this mailbox, so it gets a later seq.
    if (cleared) {
      ++st.clears;
      for (auto& a : st.clear_listeners)
        self->send(a, cleared_atom_v);
    }
  };
  // Seq 0 of every rank: a router that kept blocks from a previous sidecar
  // (or engine) drops them; the engine's current blocks follow (catch-up).
  if (st.p.queue->admit()) {
    kv_event_batches first;
    first.items.push_back(fence_batch(st.p.rank));
    emit(first);
  }
  if (st.p.keepalive.count() > 0)
    self->delayed_send(self, st.p.keepalive, tick_atom_v);
  return {
    [emit](publish_atom, kv_event_batches& in) { emit(in); },
    [self](cleared_atom, clear_listener_actor& listener) {
      self->state.clear_listeners.push_back(std::move(listener));
    },
    [self, emit](tick_atom) {
      // Checked every keepalive interval: a rank that was quiet for a whole
      // interval says so with an empty batch (at most one interval late).
      auto& st = self->state;
      if (st.quiet && st.p.queue->admit()) {
        kv_event_batches one;
        one.items.push_back(empty_batch(st.p.rank));
        emit(one);
        ++st.keepalives;
      }
      st.quiet = true;
      self->delayed_send(self, st.p.keepalive, tick_atom_v);
    },
    [self](stats_atom) { log_stats(self, snapshot(self->state), self->state.p.stats_interval); },
    [self](metrics_atom, const caf::actor& to) { send_snapshot(self, to, snapshot(self->state)); },
  };
}

} // namespace kvs
