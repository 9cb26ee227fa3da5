#include "actors/session.hpp"

#include "actors/actor_logging.hpp"
#include "actors/caf_error.hpp"
#include "cache/chunk_hash.hpp"
#include "messages/lmcache_protocol.hpp"

namespace kvs {

namespace {

using self_ptr = session_actor::stateful_pointer<session_state>;

/// Hashes of chunks [0, n_chunks) of the key's tokens (prefix-chained).
std::vector<uint64_t> key_hashes(const cache_key& key, size_t chunk_size, size_t n_chunks) {
  size_t n_tokens = std::min(key.token_ids.size(), n_chunks * chunk_size);
  std::vector<int64_t> tokens(key.token_ids.begin(),
                              key.token_ids.begin() + static_cast<ptrdiff_t>(n_tokens));
  return chunk_hashes(tokens.data(), tokens.size(), chunk_size,
                      identity_seed(key.model_name, key.world_size, key.cache_salt));
}

/// Chunk range [begin, end) a key's [start, end) token range covers.
std::pair<size_t, size_t> chunk_range(const cache_key& key, size_t cs) {
  auto start = static_cast<size_t>(std::max<int64_t>(key.start, 0));
  auto end = static_cast<size_t>(std::max<int64_t>(key.end, 0));
  end = std::min(end, key.token_ids.size());
  return {start / cs, end / cs};
}

void reply(self_ptr self, const mp_call& call, std::optional<std::string> body) {
  self->send(self->state.p.bridge, make_reply(call, std::move(body)));
}

void reply_copy(self_ptr self, const mp_call& call, const std::string& handle, bool ok) {
  reply(self, call, encode_mp_event_ok(handle, ok));
}

/// Quits once nothing is in flight; everything held is released first.
void maybe_finish(self_ptr self) {
  auto& st = self->state;
  if (!st.ending || !st.jobs.empty())
    return;
  for (auto& w : st.waiters)
    reply(self, w.call, std::nullopt);
  st.waiters.clear();
  auto call = std::move(st.end_call);
  self->request(st.p.store, caf::infinite, store_end_session{st.p.request_id})
    .then(
      [self, call](uint64_t released) {
        if (released > 0)
          KVS_DEBUG(self->state.label, "released {} read locks", released);
        if (call)
          reply(self, *call, std::nullopt);
        self->quit();
      },
      [self, call](caf::error&) {
        if (call)
          reply(self, *call, std::nullopt);
        self->quit();
      });
}

void answer_waiters(self_ptr self) {
  auto& st = self->state;
  if (!st.matched || st.waiters.empty())
    return;
  // The first answer consumes the job, as LMCache's does; later waiters of
  // the same job see "unknown" (0).
  bool first = true;
  for (auto& w : st.waiters) {
    reply(self, w.call, encode_mp_int(first ? static_cast<int64_t>(*st.matched) : 0));
    first = false;
  }
  st.waiters.clear();
  st.matched.reset();
}

void on_lookup(self_ptr self, const lookup_req& r) {
  auto& st = self->state;
  auto cs = static_cast<size_t>(st.p.chunk_size);
  // Lookups count the hit prefix from chunk 0 (LMCache's adapters look up
  // from token 0), so the ledger's chunk indices are absolute.
  auto hashes = key_hashes(r.key, cs, chunk_range(r.key, cs).second);
  st.lookup_running = true;
  st.matched.reset();
  auto gen = ++st.lookup_generation;
  // The engine bridge already acked the LOOKUP; the result comes through
  // the prefetch queries.
  auto world = static_cast<int32_t>(std::max<int64_t>(r.key.world_size, 1));
  self->request(st.p.store, caf::infinite,
                store_lookup{st.p.request_id, std::move(hashes), world, 1, r.key.model_name,
                             r.key.cache_salt})
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

// -- STORE and RETRIEVE: one copy job, in named steps ------------------------
//
//   STORE:    reserve slots in the store  -> copy pages into them -> commit
//   RETRIEVE: acquire (pin) the chunks     -> copy them out        -> release
//
// The engine gets its answer as soon as the copy has started (with the event
// to wait on), or once it is over when the backend finished it at once.

/// Which step failed: decides the log line and whether the engine was
/// already answered.
enum class copy_step { first, start, await };

/// The job's last step: commits or aborts a STORE's reservations, releases a
/// RETRIEVE's pins; the session may end now.
void finish_job(self_ptr self, uint64_t id, bool ok) {
  auto& st = self->state;
  auto node = st.jobs.extract(id);
  auto& job = node.mapped();
  if (job.reserved) {
    job.reserved->commit = ok;
    self->send(st.p.store, std::move(*job.reserved));
  }
  if (job.read_ticket != 0)
    self->send(st.p.store, store_release{job.read_ticket});
  maybe_finish(self);
}

/// A step was refused or failed: logged with the text the refusing actor
/// gave, the engine answered (b"", False) unless it already was, the job
/// finished (aborting / releasing what it holds).
void fail_job(self_ptr self, uint64_t id, copy_step step, const caf::error& err) {
  auto& st = self->state;
  auto& job = st.jobs.at(id);
  auto e = from_caf_error(err);
  // The actor's own refusals say "refused"; a lost actor or a copy that
  // went wrong "failed".
  bool refused = e.kind != "actor";
  switch (step) {
    case copy_step::first:
      if (!refused)
        KVS_WARN(st.label, "{} failed: {}", job.what(), e.detail);
      else if (job.to_l1)
        KVS_WARN(st.label, "store of {} chunks refused: {}", job.hashes.size() - job.begin,
                 e.detail);
      else
        KVS_WARN(st.label, "retrieve refused: {}", e.detail);
      break;
    case copy_step::start:
      KVS_WARN(st.label, "{} copy {}: {}", job.what(), refused ? "refused" : "failed", e.detail);
      break;
    case copy_step::await:
      KVS_WARN(st.label, "{} copy failed: {}", job.what(), e.detail);
      finish_job(self, id, false); // answered when the copy started
      return;
  }
  // A refused copy settles before the answer, like a finished one; a
  // refused first step holds nothing, and is answered at once.
  auto call = std::move(job.call);
  if (step == copy_step::first)
    reply_copy(self, call, {}, false);
  finish_job(self, id, false);
  if (step == copy_step::start)
    reply_copy(self, call, {}, false);
}

/// The copy has started: answer the engine, and finish the job once the copy
/// is over. Settled at once (host backend): finish first, so that a lookup
/// after the answer sees the chunks (read-your-writes).
void copy_started(self_ptr self, uint64_t id, gpu_copy_started& started) {
  auto& st = self->state;
  auto& job = st.jobs.at(id);
  if (started.complete) {
    auto call = std::move(job.call);
    finish_job(self, id, true);
    reply_copy(self, call, started.event_handle, true);
    return;
  }
  reply_copy(self, job.call, started.event_handle, true);
  // Committed / released only once the copy has completed, never before.
  self->request(st.p.gpu, caf::infinite, gpu_await{started.ticket})
    .then([self, id](gpu_copy_done&) { finish_job(self, id, true); },
          [self, id](caf::error& err) { fail_job(self, id, copy_step::await, err); });
}

/// Step 2 of both: the pages and the slots are known; start the copy.
void start_copy(self_ptr self, uint64_t id, gpu_copy cp) {
  self->request(self->state.p.gpu, caf::infinite, std::move(cp))
    .then([self, id](gpu_copy_started& started) { copy_started(self, id, started); },
          [self, id](caf::error& err) { fail_job(self, id, copy_step::start, err); });
}

/// A new copy job; `call` (the request `key` belongs to) moves into it.
uint64_t add_job(self_ptr self, mp_call& call, const cache_key& key, bool to_l1, size_t begin,
                 size_t end) {
  auto& st = self->state;
  auto id = st.next_job++;
  auto& job = st.jobs[id];
  job.to_l1 = to_l1;
  job.rank = static_cast<int32_t>(*key.worker_id);
  job.begin = begin;
  job.hashes = key_hashes(key, static_cast<size_t>(st.p.chunk_size), end);
  job.call = std::move(call); // the request itself is shared, `key` stays valid
  return id;
}

/// The copy a job's reply describes: the request's pages, no slots yet.
gpu_copy copy_of(const session_state& st, const copy_job& job, int64_t instance_id,
                 const std::vector<std::vector<int64_t>>& block_ids,
                 const std::string& event_handle, size_t slot_bytes) {
  gpu_copy cp;
  cp.instance_id = instance_id;
  cp.to_l1 = job.to_l1;
  cp.block_ids = block_ids;
  cp.chunk_tokens = static_cast<uint64_t>(st.p.chunk_size);
  cp.slot_bytes = slot_bytes;
  cp.engine_event_handle = event_handle;
  return cp;
}

/// STORE step 1 done: copy into the reserved slots (what L1 already holds
/// is not copied twice), and remember what to commit.
void reserved(self_ptr self, uint64_t id, store_reserve_reply& res) {
  auto& st = self->state;
  auto& job = st.jobs.at(id);
  const auto& r = std::get<store_req>(job.call.request->body);
  auto cp = copy_of(st, job, r.instance_id, r.block_ids, r.event_ipc_handle, res.slot_bytes);
  store_finish fin;
  fin.rank = job.rank;
  fin.model = r.key.model_name; // names the L2 objects
  fin.salt = r.key.cache_salt;
  auto cs = static_cast<size_t>(st.p.chunk_size);
  for (auto& c : res.chunks) {
    cp.chunk_positions.push_back(c.position);
    cp.slots.push_back(c.slot);
    size_t abs = job.begin + c.position;
    fin.hashes.push_back(job.hashes[abs]);
    fin.tokens.emplace_back(r.key.token_ids.begin() + static_cast<ptrdiff_t>(abs * cs),
                            r.key.token_ids.begin() + static_cast<ptrdiff_t>((abs + 1) * cs));
    fin.parents.push_back(abs == 0 ? std::nullopt : std::optional<uint64_t>{job.hashes[abs - 1]});
  }
  job.reserved = std::move(fin);
  start_copy(self, id, std::move(cp));
}

/// RETRIEVE step 1 done: copy the pinned chunks out.
void acquired(self_ptr self, uint64_t id, store_acquire_reply& acq) {
  auto& st = self->state;
  auto& job = st.jobs.at(id);
  const auto& r = std::get<retrieve_req>(job.call.request->body);
  job.read_ticket = acq.ticket;
  auto cp = copy_of(st, job, r.instance_id, r.block_ids, r.event_ipc_handle, acq.slot_bytes);
  cp.skip_first_n = static_cast<uint64_t>(std::max<int64_t>(r.skip_first_n, 0));
  for (size_t i = 0; i < acq.slots.size(); ++i)
    cp.chunk_positions.push_back(i);
  cp.slots = std::move(acq.slots);
  start_copy(self, id, std::move(cp));
}

/// The hashes of the job's chunks: its key's range [begin, end).
std::vector<uint64_t> job_chunks(const copy_job& job) {
  return {job.hashes.begin() + static_cast<ptrdiff_t>(job.begin), job.hashes.end()};
}

/// Step 1 of both: ask the store (reserve or acquire); `next` takes the
/// reply, a refusal fails the job.
template <class Reply, class Request>
void first_step(self_ptr self, uint64_t id, Request q,
                void (*next)(self_ptr, uint64_t, Reply&)) {
  self->request(self->state.p.store, caf::infinite, std::move(q))
    .then([self, id, next](Reply& r) { next(self, id, r); },
          [self, id](caf::error& err) { fail_job(self, id, copy_step::first, err); });
}

void on_store(self_ptr self, mp_call& call) {
  auto& st = self->state;
  const auto& r = std::get<store_req>(call.request->body);
  if (!r.key.worker_id) {
    KVS_WARN(st.label, "store without worker_id: refused");
    reply_copy(self, call, {}, false);
    return;
  }
  auto [begin, end] = chunk_range(r.key, static_cast<size_t>(st.p.chunk_size));
  auto id = add_job(self, call, r.key, true, begin, end);
  auto& job = st.jobs.at(id);
  first_step<store_reserve_reply>(self, id,
                                  store_reserve{r.instance_id, job.rank, job_chunks(job)},
                                  reserved);
}

void on_retrieve(self_ptr self, mp_call& call) {
  auto& st = self->state;
  const auto& r = std::get<retrieve_req>(call.request->body);
  auto [begin, end] = chunk_range(r.key, static_cast<size_t>(st.p.chunk_size));
  if (!r.key.worker_id || end <= begin) {
    KVS_WARN(st.label, "retrieve refused: {}", !r.key.worker_id ? "no worker_id" : "no full chunk in range");
    reply_copy(self, call, {}, false);
    return;
  }
  auto id = add_job(self, call, r.key, false, begin, end);
  auto& job = st.jobs.at(id);
  first_step<store_acquire_reply>(self, id,
                                  store_acquire{st.p.request_id, job.rank, begin, job_chunks(job)},
                                  acquired);
}

void on_call(self_ptr self, mp_call& call) {
  auto& st = self->state;
  const auto& req = *call.request;
  switch (req.op) {
    case mp_op::lookup:
      on_lookup(self, std::get<lookup_req>(req.body));
      return;
    case mp_op::query_prefetch_status:
      if (st.lookup_running) {
        reply(self, call, std::nullopt);
      } else {
        reply(self, call, encode_mp_int(st.matched ? static_cast<int64_t>(*st.matched) : 0));
        st.matched.reset();
      }
      return;
    case mp_op::wait_prefetch_status: {
      if (!st.lookup_running) {
        reply(self, call, encode_mp_int(st.matched ? static_cast<int64_t>(*st.matched) : 0));
        st.matched.reset();
        return;
      }
      auto timeout = std::get<wait_prefetch_status_req>(req.body).timeout_s;
      const double cap_s = std::chrono::duration<double>(session_state::max_prefetch_wait).count();
      auto wait = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double>(std::min(timeout, cap_s)));
      st.waiters.push_back({call, session_state::clock::now() + wait});
      self->delayed_send(self, wait, deadline_atom_v);
      return;
    }
    case mp_op::query_prefetch_lookup_hits:
      reply(self, call, st.hits ? std::optional<std::string>{encode_mp_int(static_cast<int64_t>(*st.hits))}
                                : std::nullopt);
      return;
    case mp_op::free_lookup_locks: {
      auto& key = std::get<free_lookup_locks_req>(req.body).key;
      auto cs = static_cast<size_t>(st.p.chunk_size);
      auto begin = static_cast<size_t>(std::max<int64_t>(key.start, 0)) / cs;
      auto end = (static_cast<size_t>(std::max<int64_t>(key.end, 0)) + cs - 1) / cs;
      std::optional<int32_t> rank;
      if (key.worker_id)
        rank = static_cast<int32_t>(*key.worker_id);
      self->send(st.p.store, store_release_range{st.p.request_id, begin, end, rank});
      reply(self, call, std::nullopt);
      return;
    }
    case mp_op::store:
      on_store(self, call);
      return;
    case mp_op::retrieve:
      on_retrieve(self, call);
      return;
    case mp_op::end_session:
      st.ending = true;
      st.end_call = call;
      maybe_finish(self);
      return;
    default:
      reply(self, call, std::nullopt);
      return;
  }
}

} // namespace

session_actor::behavior_type session(session_actor::stateful_pointer<session_state> self,
                                     session_params params) {
  auto& st = self->state;
  st.p = std::move(params);
  st.label = log::label(session_state::name, "rid=" + st.p.request_id, self->id());
  KVS_DEBUG(st.label, "started");
  self->attach_functor([label = st.label](const caf::error& reason) {
    KVS_DEBUG(label, "exited: {}", reason ? caf::to_string(reason) : "normal");
  });
  return {
    [self](mp_call& call) { on_call(self, call); },
    [self](end_atom) {
      self->state.ending = true;
      maybe_finish(self);
    },
    [self](deadline_atom) {
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
    },
  };
}

} // namespace kvs
