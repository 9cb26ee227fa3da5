#include "actors/replay.hpp"

#include "actors/actor_logging.hpp"

namespace kvs {

replay_actor::behavior_type
replay(replay_actor::stateful_pointer<replay_state> self, int64_t rank,
       size_t buffer_steps, size_t buffer_bytes, std::chrono::nanoseconds stats_interval) {
  auto& st = self->state;
  st.label = log::label(replay_state::name, "dp=" + std::to_string(rank), self->id());
  st.ring = replay_ring{buffer_steps, buffer_bytes};
  log_lifecycle(self, st.label,
                fmt::format("started, keeps the last {} batches, at most {} MiB", buffer_steps,
                            buffer_bytes >> 20));
  arm_stats(self, stats_interval);
  return {
    [self](record_atom, encoded_batches& bs) {
      for (auto& b : bs.items)
        self->state.ring.push(std::move(b));
    },
    [self](replay_atom, replay_request& req) {
      auto& st = self->state;
      ++st.requests;
      replay_stream out{std::move(req.client), st.ring.from(req.start_seq)};
      st.batches_served += out.batches.size();
      KVS_DEBUG(st.label, "replay from seq {}: {} batches", req.start_seq, out.batches.size());
      // The bridge that asked gets the stream; it paces the client.
      self->send(caf::actor_cast<replay_bridge_actor>(self->current_sender()), std::move(out));
    },
    [self, stats_interval](stats_atom) {
      auto& st = self->state;
      if (st.ring.empty())
        KVS_INFO(st.label, "stats: kept=0 requests={} batches_served={}", st.requests,
                 st.batches_served);
      else
        KVS_INFO(st.label, "stats: kept={} bytes={} seq={}..{} requests={} batches_served={}",
                 st.ring.size(), st.ring.bytes(), st.ring.oldest_seq(), st.ring.newest_seq(),
                 st.requests, st.batches_served);
      self->delayed_send(self, stats_interval, stats_atom_v);
    },
  };
}

} // namespace kvs
