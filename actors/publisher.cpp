#include "actors/publisher.hpp"

#include "actors/actor_logging.hpp"
#include "actors/publisher_snapshot.hpp"
#include "messages/kv_event_codec.hpp"

namespace kvs {

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
  return {
    [self](publish_atom, kv_event_batches& in) {
      auto& st = self->state;
      encoded_batches out;
      out.items.reserve(in.items.size());
      for (auto& batch : in.items) {
        if (!batch.dp_rank)
          batch.dp_rank = st.rank;
        auto payload = std::make_shared<std::string>();
        encode_event_batch(batch, st.dialect, *payload);
        out.items.push_back(encoded_batch{st.next_seq++, std::move(payload)});
        ++st.batches;
        st.events += batch.events.size();
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
    },
    [self](snapshot_request& req) { snapshot_requested(self, req); },
    [self](snapshot_credit& c) { snapshot_credited(self, c); },
    [self, stats_interval](stats_atom) {
      auto& st = self->state;
      KVS_INFO(st.label, "stats: batches={} events={} next_seq={} queued={} dropped_queue_full={} "
                         "index_blocks={} index_bytes={} index_refused={} snapshots={}",
               st.batches, st.events, st.next_seq, st.queue->queued.load(),
               st.queue->dropped_full.load(), st.index.size(), st.index.memory_bytes(),
               st.index.refused(), st.snapshots_served);
      self->delayed_send(self, stats_interval, stats_atom_v);
    },
  };
}

} // namespace kvs
