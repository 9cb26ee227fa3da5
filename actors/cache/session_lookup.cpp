// The session's LOOKUP and its prefetch queries: a LOOKUP hashes the key and
// locks its hit prefix through the store; the result is kept for
// query_prefetch_status / wait_prefetch_status (the first answer consumes
// it, as LMCache's does) and query_prefetch_lookup_hits; free_lookup_locks
// gives ranges of it back. The router acked the LOOKUP itself (its op row's
// ack), so nothing here answers it.
#include "actors/cache/session_steps.hpp"

#include "actors/actor_logging.hpp"

#include <algorithm>
#include <chrono>

namespace kvs::session_steps {

namespace {

void answer_waiters(self_ptr self) {
  auto& st = self->state;
  if (!st.matched || st.waiters.empty())
    return;
  // The first answer consumes the job, as LMCache's does; later waiters of
  // the same job see "unknown" (0).
  bool first = true;
  for (auto& w : st.waiters) {
    reply(self, w.call, encode_reply_int(first ? static_cast<int64_t>(*st.matched) : 0));
    first = false;
  }
  st.waiters.clear();
  st.matched.reset();
}

/// The hit count a finished LOOKUP left (0 when none), consumed by this answer.
std::string take_matched(session_state& st) {
  auto n = st.matched ? static_cast<int64_t>(*st.matched) : 0;
  st.matched.reset();
  return encode_reply_int(n);
}

} // namespace

void on_lookup(self_ptr self, mp_call& call) {
  const auto& r = std::get<lookup_req>(call.request->body);
  auto& st = self->state;
  auto cs = static_cast<size_t>(st.p.chunk_size);
  // The hit is counted from chunk 0 and the ledger's chunk indices are
  // absolute. LMCache 0.5.7 sends key.start > 0 when the engine's own prefix
  // cache holds the chunks below it: those are not looked for
  // (store_lookup::begin). 0.5.6 looks up from chunk 0 whatever start says.
  auto [begin, end] = chunk_range(r.key, cs);
  auto hashes = key_hashes(r.key, cs, end);
  auto names = key_l2_names(st.p, r.key, end);
  st.lookup_running = true;
  st.matched.reset();
  auto gen = ++st.lookup_generation;
  // The engine bridge already acked the LOOKUP; the result comes through
  // the prefetch queries.
  auto world = static_cast<int32_t>(std::max<int64_t>(r.key.world_size, 1));
  self->request(st.p.store, caf::infinite,
                store_lookup{st.p.request_id, std::move(hashes), world, 1, r.key.model_name,
                             r.key.cache_salt,
                             r.key.release == client_release::v0_5_7 ? begin : 0,
                             std::move(names), lookup_tokens(st.p, r.key, end)})
    .then(
      [self, gen](uint64_t n) {
        auto& st = self->state;
        if (gen != st.lookup_generation)
          return; // superseded by a newer LOOKUP
        st.lookup_running = false;
        st.matched = n;
        st.hits = n;
        answer_waiters(self);
      },
      [self, gen](caf::error& err) {
        auto& st = self->state;
        KVS_WARN(st.label, "lookup failed: {}", caf::to_string(err));
        if (gen != st.lookup_generation)
          return;
        st.lookup_running = false;
        st.matched = 0;
        st.hits = 0;
        answer_waiters(self);
      });
}

void on_query_prefetch_status(self_ptr self, mp_call& call) {
  auto& st = self->state;
  if (st.lookup_running)
    reply(self, call, std::nullopt);
  else
    reply(self, call, take_matched(st));
}

void on_wait_prefetch_status(self_ptr self, mp_call& call) {
  auto& st = self->state;
  if (!st.lookup_running) {
    reply(self, call, take_matched(st));
    return;
  }
  auto timeout = std::get<wait_prefetch_status_req>(call.request->body).timeout_s;
  const double cap_s = std::chrono::duration<double>(session_state::max_prefetch_wait).count();
  auto wait = std::chrono::duration_cast<std::chrono::nanoseconds>(
    std::chrono::duration<double>(std::min(timeout, cap_s)));
  st.waiters.push_back({call, session_state::clock::now() + wait});
  self->delayed_send(self, wait, deadline_atom_v);
}

void on_prefetch_deadline(self_ptr self) {
  // A WAIT_PREFETCH_STATUS that ran out of time: None, as LMCache answers.
  auto& st = self->state;
  auto now = session_state::clock::now();
  auto& ws = st.waiters;
  for (auto i = ws.begin(); i != ws.end();) {
    if (now >= i->deadline) {
      reply(self, i->call, std::nullopt);
      i = ws.erase(i);
    } else {
      ++i;
    }
  }
}

void on_query_prefetch_lookup_hits(self_ptr self, mp_call& call) {
  auto& st = self->state;
  reply(self, call, st.hits ? std::optional<std::string>{encode_reply_int(static_cast<int64_t>(*st.hits))}
                            : std::nullopt);
}

void on_free_lookup_locks(self_ptr self, mp_call& call) {
  auto& st = self->state;
  const auto& f = std::get<free_lookup_locks_req>(call.request->body);
  auto cs = static_cast<size_t>(st.p.chunk_size);
  std::optional<int32_t> rank;
  if (f.key.worker_id)
    rank = static_cast<int32_t>(*f.key.worker_id);
  auto release = [&](int64_t start, int64_t end) {
    auto begin = static_cast<size_t>(std::max<int64_t>(start, 0)) / cs;
    auto stop = (static_cast<size_t>(std::max<int64_t>(end, 0)) + cs - 1) / cs;
    if (begin < stop)
      self->send(st.p.store, store_release_range{st.p.request_id, begin, stop, rank});
  };
  release(f.key.start, f.key.end);
  // 0.5.7: the [start, end) token ranges of lookups the scheduler gave up.
  for (const auto& [start, end] : f.extra_ranges)
    release(start, end);
  reply(self, call, std::nullopt);
}

} // namespace kvs::session_steps
