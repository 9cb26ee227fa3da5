#include "actors/publisher.hpp"

#include "actors/actor_logging.hpp"
#include "actors/fence.hpp"
#include "actors/publisher_snapshot.hpp"
#include "messages/kv_event_codec.hpp"

namespace kvs {

namespace {

/// The payload to publish: a pass-through batch's own bytes (shared, not
/// copied, when its dp_rank already is the one to publish; else copied with
/// only dp_rank rewritten), any other batch encoded.
std::shared_ptr<const std::string> encode(kv_event_batch& batch, event_dialect dialect) {
  if (batch.wire && batch.wire->dialect == dialect) {
    const canonical_wire& w = *batch.wire;
    if (w.layout.dp_rank == batch.dp_rank)
      return w.bytes;
    auto payload = std::make_shared<std::string>();
    payload->reserve(w.layout.rank_offset + 9);
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
  s.labels = {{"dp_rank", std::to_string(st.rank)}};
  s.counter("batches", "kvsidecar_events_published_total", st.batches)
    .counter("events", "kvsidecar_events_published_events_total", st.events)
    .gauge("next_seq", "kvsidecar_events_seq", st.next_seq)
    .gauge("queued", "kvsidecar_events_queued", st.queue->queued.load())
    // Counted where the batch was refused: kvsidecar_events_dropped_total
    // {reason="queue_full"} of the ingest rank.
    .log_only("dropped_queue_full", st.queue->dropped_full.load())
    .gauge("index_blocks", "kvsidecar_events_index_blocks", st.index.size())
    .gauge("index_bytes", "kvsidecar_events_index_bytes", st.index.memory_bytes())
    .counter("index_refused", "kvsidecar_events_index_refused_total", st.index.refused())
    .counter("snapshots", "kvsidecar_events_snapshots_total", st.snapshots_served);
  return s;
}

publisher_actor::behavior_type
publisher(publisher_actor::stateful_pointer<publisher_state> self, int64_t rank,
          event_dialect dialect, pub_bridge_actor pub_bridge, replay_actor replay,
          relay_queue_ptr queue, std::chrono::nanoseconds stats_interval,
          size_t index_max_blocks) {
  auto& st = self->state;
  st.label = log::label(publisher_state::name, "dp=" + std::to_string(rank), self->id());
  st.rank = rank;
  st.dialect = dialect;
  st.pub_bridge = std::move(pub_bridge);
  st.replay = std::move(replay);
  st.queue = std::move(queue);
  st.index = block_index{index_max_blocks};
  log_lifecycle(self, st.label,
                fmt::format("started, dialect {}",
                            dialect == event_dialect::vllm ? "vllm" : "tokenspeed"));
  arm_stats(self, stats_interval);
  auto emit = [self](kv_event_batches& in) {
    auto& st = self->state;
    encoded_batches out;
    out.items.reserve(in.items.size());
    for (auto& batch : in.items) {
      if (!batch.dp_rank)
        batch.dp_rank = st.rank;
      out.items.push_back(encoded_batch{st.next_seq++, encode(batch, st.dialect)});
      ++st.batches;
      st.events += batch.event_count();
      // The block index needs the events even when the payload passed
      // through undecoded (the bytes were already taken above).
      decode_wire_events(batch);
      for (auto& ev : batch.events)
        st.index.apply(ev);
    }
    if (st.index.refused() > 0 && !st.index_full_logged) {
      st.index_full_logged = true;
      KVS_WARN(st.label, "block index full ({} blocks, events.index_max_blocks): further "
                         "blocks are not indexed, so snapshots miss them (counted as "
                         "index_refused)", st.index.max_blocks());
    }
    if (st.replay)
      self->send(st.replay, record_atom_v, out);
    self->send(st.pub_bridge, publish_atom_v, std::move(out));
  };
  // Seq 0 of every rank: a router that kept blocks from a previous sidecar
  // (or engine) drops them; the engine's current blocks follow (catch-up).
  if (st.queue->admit()) {
    kv_event_batches first;
    first.items.push_back(fence_batch(rank));
    emit(first);
  }
  return {
    [emit](publish_atom, kv_event_batches& in) { emit(in); },
    [self](snapshot_request& req) { snapshot_requested(self, req); },
    [self](snapshot_credit& c) { snapshot_credited(self, c); },
    [self, stats_interval](stats_atom) {
      log_stats(self, snapshot(self->state), stats_interval);
    },
    [self](metrics_atom, const caf::actor& to) { send_snapshot(self, to, snapshot(self->state)); },
  };
}

} // namespace kvs
