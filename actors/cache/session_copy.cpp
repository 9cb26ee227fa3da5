// The session's STORE and RETRIEVE: one copy job each, in named steps
//
//   STORE:    reserve slots in the store  -> copy pages into them -> commit
//   RETRIEVE: acquire (pin) the chunks     -> copy them out        -> release
//
// The engine gets its answer as soon as the copy has started (with the event
// to wait on), or once it is over when the backend finished it at once.
#include "actors/cache/session_steps.hpp"

#include "actors/actor_logging.hpp"
#include "actors/caf_error.hpp"

namespace kvs::session_steps {

namespace {

void reply_copy(self_ptr self, const mp_call& call, const std::string& handle, bool ok) {
  reply(self, call, encode_reply_event_ok(handle, ok));
}

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
    reply_failed(self, call, "copy refused: " + e.detail);
  finish_job(self, id, false);
  if (step == copy_step::start)
    reply_failed(self, call, "copy failed to start: " + e.detail);
}

/// The chunks a hybrid layout's store found all-null in an engine group
/// (gpu_copy_started::null_chunks, ascending indices into `fin`) were not
/// copied: their reservations are aborted now, the rest commit as usual.
void abort_null_chunks(self_ptr self, store_finish& fin, const std::vector<uint32_t>& null_chunks) {
  store_finish drop;
  drop.rank = fin.rank;
  drop.commit = false;
  store_finish keep{fin.commit, fin.rank, {}, {}, {}, fin.model, fin.salt, fin.group, fin.grouped,
                    {}, fin.world_size};
  size_t n = 0;
  for (size_t k = 0; k < fin.hashes.size(); ++k) {
    if (n < null_chunks.size() && null_chunks[n] == k) {
      ++n;
      drop.hashes.push_back(fin.hashes[k]);
      continue;
    }
    keep.hashes.push_back(fin.hashes[k]);
    keep.tokens.push_back(std::move(fin.tokens[k]));
    keep.parents.push_back(fin.parents[k]);
    if (k < fin.l2_names.size())
      keep.l2_names.push_back(std::move(fin.l2_names[k]));
  }
  KVS_DEBUG(self->state.label, "{} chunks all-null in an engine group: not stored",
            drop.hashes.size());
  self->send(self->state.p.store, std::move(drop));
  fin = std::move(keep);
}

/// The copy has started: answer the engine, and finish the job once the copy
/// is over. Settled at once (host backend): finish first, so that a lookup
/// after the answer sees the chunks (read-your-writes).
void copy_started(self_ptr self, uint64_t id, gpu_copy_started& started) {
  auto& st = self->state;
  auto& job = st.jobs.at(id);
  if (!started.null_chunks.empty() && job.reserved)
    abort_null_chunks(self, *job.reserved, started.null_chunks);
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
  job.l2_names = key_l2_names(st.p, key, end);
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
  store_finish fin = finish_for(r.key, job.rank);
  auto cs = static_cast<size_t>(st.p.chunk_size);
  for (auto& c : res.chunks) {
    cp.chunk_positions.push_back(c.position);
    cp.slots.push_back(c.slot);
    add_chunk(fin, r.key, job.hashes, job.l2_names, job.begin + c.position, cs);
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

} // namespace

void on_store(self_ptr self, mp_call& call) {
  auto& st = self->state;
  const auto& r = std::get<store_req>(call.request->body);
  if (!r.key.worker_id) {
    KVS_WARN(st.label, "store without worker_id: refused");
    reply_failed(self, call, "store without worker_id");
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
    const char* why = !r.key.worker_id ? "no worker_id" : "no full chunk in range";
    KVS_WARN(st.label, "retrieve refused: {}", why);
    reply_failed(self, call, std::string("retrieve refused: ") + why);
    return;
  }
  auto id = add_job(self, call, r.key, false, begin, end);
  auto& job = st.jobs.at(id);
  first_step<store_acquire_reply>(self, id,
                                  store_acquire{st.p.request_id, job.rank, begin, job_chunks(job)},
                                  acquired);
}

} // namespace kvs::session_steps
