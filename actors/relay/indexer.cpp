#include "actors/relay/indexer.hpp"

#include "actors/actor_logging.hpp"
#include "actors/relay/indexer_snapshot.hpp"
#include "core/thread_name.hpp"
#include "events_wire/kv_event_codec.hpp"

#include <malloc.h>

namespace kvs {

stats_snapshot snapshot(const indexer_state& st) {
  stats_snapshot s;
  s.actor = st.label;
  s.labels = {{"dp_rank", std::to_string(st.p.rank)}};
  s.gauge("index_blocks", "kvsidecar_events_index_blocks", st.index.size())
    .gauge("index_bytes", "kvsidecar_events_index_bytes", st.index.memory_bytes())
    .counter("index_refused", "kvsidecar_events_index_refused_total", st.index.refused())
    .counter("snapshots", "kvsidecar_events_snapshots_total", st.snapshots_served)
    .log_only("batches", st.batches)
    .log_text("seq", st.last_seq ? std::to_string(*st.last_seq) : std::string{"-"})
    .log_only("behind", static_cast<uint64_t>(
                          std::max<int64_t>(st.p.queue->indexing(), 0)));
  return s;
}

indexer_actor::behavior_type
indexer(indexer_actor::stateful_pointer<indexer_state> self, indexer_params params) {
  auto& st = self->state;
  st.p = std::move(params);
  const auto detail = "dp=" + std::to_string(st.p.rank);
  st.label = log::label(indexer_state::name, detail, self->id());
  // Spawned detached: this runs on the indexer's own thread.
  name_this_thread(actor_thread_name(indexer_state::name, detail));
  st.index = block_index{st.p.max_blocks};
  log_lifecycle(self, st.label,
                fmt::format("started, at most {} blocks (events.index_max_blocks)",
                            st.p.max_blocks));
  arm_stats(self, st.p.stats_interval);
  return {
    [self](publish_atom, uint64_t first_seq, int64_t held, kv_event_batches& in) {
      auto& st = self->state;
      for (auto& batch : in.items) {
        st.index.apply(batch);
        if (auto layout = stored_layout_of(batch))
          st.stored_layout = *layout;
      }
      st.batches += in.items.size();
      if (!in.items.empty())
        st.last_seq = first_seq + in.items.size() - 1;
      const auto behind = st.p.queue->indexed(static_cast<int64_t>(in.items.size()), held)
                          - static_cast<int64_t>(in.items.size());
      st.backlog_peak = std::max(st.backlog_peak, behind + static_cast<int64_t>(in.items.size()));
      if (behind == 0 && st.backlog_peak >= trim_after_backlog) {
        // A burst (an engine storing a whole cache at once) queued here and
        // is applied now: give the freed batches' memory back to the system
        // instead of keeping it as free heap (tens of MB per 1 M blocks).
        const auto now = std::chrono::steady_clock::now();
        if (now - st.last_trim >= min_trim_interval) {
          st.last_trim = now;
          st.backlog_peak = 0;
          malloc_trim(0);
        }
      }
      if (st.index.refused() > 0 && !st.index_full_logged) {
        st.index_full_logged = true;
        KVS_WARN(st.label, "block index full ({} blocks, events.index_max_blocks): further "
                           "blocks are not indexed, so snapshots miss them (counted as "
                           "index_refused)", st.index.max_blocks());
      }
    },
    [self](snapshot_request& req) { snapshot_requested(self, req); },
    [self](snapshot_credit& c) { snapshot_credited(self, c); },
    [self](stats_atom) { log_stats(self, snapshot(self->state), self->state.p.stats_interval); },
    [self](metrics_atom, const caf::actor& to) { send_snapshot(self, to, snapshot(self->state)); },
  };
}

} // namespace kvs
