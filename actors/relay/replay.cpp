#include "actors/relay/replay.hpp"

#include "actors/actor_logging.hpp"

namespace kvs {

stats_snapshot snapshot(const replay_state& st) {
  stats_snapshot s;
  s.actor = st.label;
  s.labels = {{"dp_rank", std::to_string(st.rank)}};
  s.gauge("kept", "kvsidecar_events_replay_kept_batches", st.ring.size())
    .gauge("bytes", "kvsidecar_events_replay_kept_bytes", st.ring.bytes());
  if (!st.ring.empty())
    s.log_text("seq", std::to_string(st.ring.oldest_seq()) + ".."
                         + std::to_string(st.ring.newest_seq()));
  // The replay bridge counts requests and streamed batches for /metrics.
  s.log_only("requests", st.requests).log_only("batches_served", st.batches_served);
  return s;
}

replay_actor::behavior_type
replay(replay_actor::stateful_pointer<replay_state> self, replay_params params) {
  auto& st = self->state;
  const auto stats_interval = params.stats_interval;
  st.label = log::label(replay_state::name, "dp=" + std::to_string(params.rank), self->id());
  st.rank = params.rank;
  st.ring = replay_ring{params.buffer_steps, params.buffer_bytes};
  log_lifecycle(self, st.label,
                fmt::format("started, keeps the last {} batches, at most {} MiB",
                            params.buffer_steps, params.buffer_bytes >> 20));
  arm_stats(self, stats_interval);
  return {
    [self](record_atom, encoded_batches& bs) {
      for (auto& b : bs.items)
        self->state.ring.push(std::move(b));
    },
    [self](replay_atom, replay_request& req) {
      auto& st = self->state;
      replay_stream out;
      out.client = std::move(req.client);
      out.id = req.id;
      auto& ring = st.ring;
      if (req.end_seq == replay_request::first_part) {
        ++st.requests;
        out.end_seq = ring.empty() ? 0 : ring.newest_seq();
      } else {
        out.end_seq = req.end_seq;
        // The client read slower than the buffer turned over: what it
        // needs next is gone. The replay ends here rather than skipping.
        out.fell_behind = ring.empty() || req.start_seq < ring.oldest_seq();
      }
      if (!out.fell_behind)
        out.batches = ring.from(req.start_seq, out.end_seq, req.max_batches);
      out.last = out.fell_behind || out.batches.empty() || out.batches.back().seq >= out.end_seq;
      st.batches_served += out.batches.size();
      KVS_DEBUG(st.label, "replay {} from seq {}: {} batches{}", req.id, req.start_seq,
                out.batches.size(), out.fell_behind ? " (fell behind the buffer: ends)" : "");
      // The bridge that asked gets the stream; it paces the client.
      self->send(caf::actor_cast<replay_bridge_actor>(self->current_sender()), std::move(out));
    },
    [self, stats_interval](stats_atom) {
      log_stats(self, snapshot(self->state), stats_interval);
    },
    [self](metrics_atom, const caf::actor& to) { send_snapshot(self, to, snapshot(self->state)); },
  };
}

} // namespace kvs
