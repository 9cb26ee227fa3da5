#include "actors/session.hpp"
#include "actors/session_hybrid.hpp"
#include "actors/session_steps.hpp"

#include "actors/actor_logging.hpp"
#include "actors/caf_error.hpp"
#include "cache/chunk_hash.hpp"
#include "cache/lmcache_token_hash.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"
#include "lmcache_wire/tensor_envelope.hpp"

#include <cstring>

namespace kvs {

namespace session_steps {

std::vector<uint64_t> key_hashes(const cache_key& key, size_t chunk_size, size_t n_chunks) {
  size_t n_tokens = std::min(key.token_ids.size(), n_chunks * chunk_size);
  std::vector<int64_t> tokens(key.token_ids.begin(),
                              key.token_ids.begin() + static_cast<ptrdiff_t>(n_tokens));
  return chunk_hashes(tokens.data(), tokens.size(), chunk_size,
                      identity_seed(key.model_name, key.world_size, key.cache_salt));
}

std::vector<std::string> key_l2_names(const session_params& p, const cache_key& key,
                                      size_t n_chunks) {
  std::vector<std::string> out;
  if (!p.l2_lmcache_names || p.chunk_size <= 0)
    return out;
  auto cs = static_cast<size_t>(p.chunk_size);
  size_t n_tokens = std::min(key.token_ids.size(), n_chunks * cs);
  append_lmcache_chunk_hashes(key.token_ids.data(), n_tokens, cs, out);
  return out;
}

std::shared_ptr<const std::vector<uint32_t>> lookup_tokens(const session_params& p,
                                                           const cache_key& key,
                                                           size_t n_chunks) {
  if (!p.l2_lmcache_names || p.chunk_size <= 0)
    return nullptr;
  size_t n = std::min(key.token_ids.size(), n_chunks * static_cast<size_t>(p.chunk_size));
  return std::make_shared<const std::vector<uint32_t>>(key.token_ids.begin(),
                                                       key.token_ids.begin()
                                                         + static_cast<ptrdiff_t>(n));
}

std::pair<size_t, size_t> chunk_range(const cache_key& key, size_t cs) {
  auto start = static_cast<size_t>(std::max<int64_t>(key.start, 0));
  auto end = static_cast<size_t>(std::max<int64_t>(key.end, 0));
  end = std::min(end, key.token_ids.size());
  return {start / cs, end / cs};
}

void reply(self_ptr self, const mp_call& call, std::optional<std::string> body) {
  self->send(self->state.p.bridge, make_reply(call, std::move(body)));
}

} // namespace session_steps

namespace {

using namespace session_steps;

void reply_copy(self_ptr self, const mp_call& call, const std::string& handle, bool ok) {
  reply(self, call, encode_mp_event_ok(handle, ok));
}

void release_all_staged(self_ptr self);

/// Quits once nothing is in flight; everything held is released first.
void maybe_finish(self_ptr self) {
  auto& st = self->state;
  if (!st.ending || !st.jobs.empty() || st.preparing > 0)
    return;
  release_all_staged(self);
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

// -- Engine-driven transfer: prepare_* / commit_* ----------------------------
//
//   prepare_store:    staging slots -> reserve in the store -> hand the slots out
//   commit_store:     copy staging -> L1, commit             -> True
//   prepare_retrieve: staging slots -> acquire -> copy L1 -> staging, release -> slots
//   commit_retrieve:  give the slots back                    -> True
//
// The engine copies its own pages into / out of the staging slots in
// between (gpu/staging_pool.hpp). LMCache's failure values answer every
// step that cannot be served: a store that cannot be staged hands out no
// slots (the engine then skips it, as for chunks already stored).

session_state::staged_key staged_key_of(const cache_key& k, int64_t instance, bool to_l1) {
  return {instance, k.start, k.end, to_l1};
}

} // namespace

void session_steps::release_staged(self_ptr self, staged_transfer& t) {
  auto& st = self->state;
  if (!t.offsets.empty())
    self->send(st.p.gpu, gpu_stage_give{t.instance_id, std::move(t.offsets)});
  if (t.reserved) {
    t.reserved->commit = false;
    self->send(st.p.store, std::move(*t.reserved));
    t.reserved.reset();
  }
  finish_groups(self, t.group_reserved, false);
}

void session_steps::finish_groups(self_ptr self, std::vector<store_finish>& fins, bool commit) {
  for (auto& f : fins) {
    f.commit = commit;
    self->send(self->state.p.store, std::move(f));
  }
  fins.clear();
}

namespace {

void drop_staged(self_ptr self, const session_state::staged_key& k) {
  auto& st = self->state;
  auto i = st.staged.find(k);
  if (i == st.staged.end())
    return;
  KVS_DEBUG(st.label, "a second prepare for the same key: the first one's slots are released");
  release_staged(self, i->second);
  st.staged.erase(i);
}

void release_all_staged(self_ptr self) {
  auto& st = self->state;
  if (!st.staged.empty())
    KVS_DEBUG(st.label, "ending with {} engine-driven transfers never committed: released",
              st.staged.size());
  for (auto& [k, t] : st.staged)
    release_staged(self, t);
  st.staged.clear();
}

std::vector<shm_slot_desc> slot_descs(const gpu_stage_taken& t, size_t n) {
  std::vector<shm_slot_desc> out;
  for (size_t i = 0; i < n; ++i)
    out.push_back({t.offsets[i], t.slot_bytes, t.chunk_shape, t.dtype});
  return out;
}


void on_prepare_store(self_ptr self, mp_call& call) {
  auto& st = self->state;
  const auto& r = std::get<prepare_store_req>(call.request->body);
  const auto cs = static_cast<size_t>(st.p.chunk_size);
  auto [begin, end] = chunk_range(r.key, cs);
  if (!r.key.worker_id || end <= begin) {
    if (!r.key.worker_id)
      KVS_WARN(st.label, "prepare_store without worker_id: nothing to store");
    reply(self, call, encode_reply_prepare_store({}, {}));
    return;
  }
  const auto key = staged_key_of(r.key, r.instance_id, true);
  drop_staged(self, key);
  ++st.preparing;
  const auto count = static_cast<uint32_t>(end - begin);
  self->request(st.p.gpu, caf::infinite, gpu_stage_take{r.instance_id, count})
    .then(
      [self, call, key, begin, end](gpu_stage_taken& taken) mutable {
        auto& st = self->state;
        const auto& r = std::get<prepare_store_req>(call.request->body);
        if (taken.groups) {
          prepare_store_groups(self, call, taken, key, begin, end);
          prepared(self);
          return;
        }
        for (const auto& g : r.skipped_chunks)
          if (!g.empty()) {
            // Only multi-group workers skip null-block chunks: this one sent
            // what its registration did not.
            KVS_WARN(st.label, "prepare_store with skipped_chunks from a single-group registration");
            self->send(st.p.bridge, make_failure_reply(call, "prepare_store: skipped_chunks from "
                                                             "a single-group registration"));
            prepared(self);
            return;
          }
        // Inline: no staging slot bounds the store (the data comes in commit_store).
        const size_t room = taken.inline_data ? end - begin : taken.offsets.size();
        if (room < end - begin)
          KVS_WARN(st.label, "instance {}: {} staging slots free for {} chunks to store "
                             "(cache.engine_driven_slots): storing the first {}",
                   r.instance_id, taken.offsets.size(), end - begin, taken.offsets.size());
        if (room == 0) {
          reply(self, call, encode_reply_prepare_store({}, {}));
          prepared(self);
          return;
        }
        auto hashes = key_hashes(r.key, static_cast<size_t>(st.p.chunk_size), end);
        auto names = key_l2_names(st.p, r.key, end);
        store_reserve q{r.instance_id, static_cast<int32_t>(*r.key.worker_id),
                        {hashes.begin() + static_cast<ptrdiff_t>(begin), hashes.end()},
                        taken.format, room};
        self->request(st.p.store, caf::infinite, std::move(q))
          .then(
            [self, call, key, begin, hashes, names, taken](store_reserve_reply& res) mutable {
              auto& st = self->state;
              const auto& r = std::get<prepare_store_req>(call.request->body);
              const auto cs = static_cast<size_t>(st.p.chunk_size);
              const size_t n = taken.inline_data
                                 ? res.chunks.size()
                                 : std::min(res.chunks.size(), taken.offsets.size());
              staged_transfer t;
              t.instance_id = r.instance_id;
              t.slot_bytes = taken.slot_bytes;
              t.chunk_shape = taken.chunk_shape;
              t.dtype = taken.dtype;
              const size_t given = std::min(n, taken.offsets.size());
              t.offsets.assign(taken.offsets.begin(),
                               taken.offsets.begin() + static_cast<ptrdiff_t>(given));
              std::vector<uint64_t> spare(taken.offsets.begin() + static_cast<ptrdiff_t>(given),
                                          taken.offsets.end());
              if (!spare.empty())
                self->send(st.p.gpu, gpu_stage_give{r.instance_id, std::move(spare)});
              store_finish fin = finish_for(r.key, static_cast<int32_t>(*r.key.worker_id));
              std::vector<uint64_t> indices;
              for (size_t i = 0; i < n; ++i) {
                const auto& c = res.chunks[i];
                indices.push_back(c.position);
                t.positions.push_back(c.position);
                t.l1.push_back(c.slot);
                add_chunk(fin, r.key, hashes, names, begin + c.position, cs);
              }
              auto slots = taken.inline_data ? std::vector<shm_slot_desc>{} : slot_descs(taken, n);
              if (n > 0) {
                t.reserved = std::move(fin);
                st.staged[key] = std::move(t);
              }
              reply(self, call, encode_reply_prepare_store(slots, indices));
              prepared(self);
            },
            [self, call, taken](caf::error& err) mutable {
              auto& st = self->state;
              const auto& r = std::get<prepare_store_req>(call.request->body);
              KVS_WARN(st.label, "prepare_store refused: {}", from_caf_error(err).detail);
              self->send(st.p.gpu, gpu_stage_give{r.instance_id, std::move(taken.offsets)});
              reply(self, call, encode_reply_prepare_store({}, {}));
              prepared(self);
            });
      },
      [self, call](caf::error& err) {
        KVS_WARN(self->state.label, "prepare_store refused: {}", from_caf_error(err).detail);
        reply(self, call, encode_reply_prepare_store({}, {}));
        prepared(self);
      });
}

/// commit_store with the chunks in its data (LMCache 0.5.7's inline
/// transfer context: an instance registered without a pool, or a worker
/// that could not map the one named): the reserved chunks' tensors are
/// copied into their L1 slots and committed. Anything that does not match
/// the registration (count, dtype, shape, size) fails the store (False)
/// with a warning naming it; nothing is committed.
void commit_inline(self_ptr self, mp_call& call,
                   std::map<session_state::staged_key, staged_transfer>::iterator i) {
  auto& st = self->state;
  const auto& r = std::get<commit_store_req>(call.request->body);
  auto fail = [&](const std::string& why) {
    KVS_WARN(st.label, "commit_store of instance {} (inline data, {} bytes) refused: {}",
             r.instance_id, r.cpu_data.size(), why);
    if (i != st.staged.end()) {
      release_staged(self, i->second);
      st.staged.erase(i);
    }
    reply(self, call, encode_reply_bool(false));
  };
  if (i == st.staged.end()) {
    fail("no prepared store for tokens " + std::to_string(r.key.start) + ".."
         + std::to_string(r.key.end));
    return;
  }
  auto tensors = decode_tensor_envelope(r.cpu_data);
  if (!tensors) {
    fail(tensors.error_value().detail);
    return;
  }
  auto& t = i->second;
  for (size_t k = 0; k < t.positions.size(); ++k) {
    const auto pos = t.positions[k];
    if (pos >= tensors->size()) {
      fail(std::to_string(tensors->size()) + " tensors, but chunk " + std::to_string(pos)
           + " of the range was reserved");
      return;
    }
    const auto& x = (*tensors)[pos];
    if (x.dtype != t.dtype || x.shape != t.chunk_shape || x.data.size() != t.slot_bytes) {
      fail("tensors[" + std::to_string(pos) + "]: dtype '" + x.dtype.substr(0, 32) + "', "
           + std::to_string(x.shape.size()) + "-d, " + std::to_string(x.data.size())
           + " bytes; the registration's chunk is '" + t.dtype + "', "
           + std::to_string(t.chunk_shape.size()) + "-d, " + std::to_string(t.slot_bytes)
           + " bytes");
      return;
    }
  }
  for (size_t k = 0; k < t.positions.size(); ++k)
    std::memcpy(t.l1[k], (*tensors)[t.positions[k]].data.data(), t.slot_bytes);
  if (!t.offsets.empty()) // a pool was named but the worker sent its data inline
    self->send(st.p.gpu, gpu_stage_give{t.instance_id, std::move(t.offsets)});
  t.reserved->commit = true;
  self->send(st.p.store, std::move(*t.reserved));
  st.staged.erase(i);
  reply(self, call, encode_reply_bool(true));
}

void on_commit_store(self_ptr self, mp_call& call) {
  auto& st = self->state;
  const auto& r = std::get<commit_store_req>(call.request->body);
  const auto key = staged_key_of(r.key, r.instance_id, true);
  auto i = st.staged.find(key);
  if (i != st.staged.end() && i->second.groups) {
    auto t = std::move(i->second);
    st.staged.erase(i);
    commit_store_groups(self, call, std::move(t));
    return;
  }
  if (!r.cpu_data.empty() && i == st.staged.end()) {
    // No prepare_store came first (LMCache's inline strategy needs none): a
    // hybrid instance's grouped data is served all the same.
    ++st.preparing;
    self->request(st.p.gpu, caf::infinite, gpu_stage_take{r.instance_id, 0})
      .then(
        [self, call](gpu_stage_taken& taken) {
          auto& st = self->state;
          const auto& r = std::get<commit_store_req>(call.request->body);
          if (taken.groups) {
            staged_transfer t;
            t.instance_id = r.instance_id;
            t.groups = taken.groups;
            commit_store_groups(self, call, std::move(t));
          } else {
            auto c = call;
            commit_inline(self, c, st.staged.end());
          }
          prepared(self);
        },
        [self, call](caf::error&) {
          auto c = call;
          commit_inline(self, c, self->state.staged.end());
          prepared(self);
        });
    return;
  }
  if (!r.cpu_data.empty()) {
    commit_inline(self, call, i);
    return;
  }
  if (i == st.staged.end()) {
    KVS_WARN(st.label, "commit_store of instance {} without a prepared store for tokens {}..{}",
             r.instance_id, r.key.start, r.key.end);
    reply(self, call, encode_reply_bool(false));
    return;
  }
  auto t = std::make_shared<staged_transfer>(std::move(i->second));
  st.staged.erase(i);
  ++st.preparing;
  gpu_stage_copy cp{t->instance_id, true, t->offsets, t->l1, true};
  t->offsets.clear(); // the copy gives them back
  self->request(st.p.gpu, caf::infinite, std::move(cp))
    .then(
      [self, call, t](gpu_copy_done&) {
        t->reserved->commit = true;
        self->send(self->state.p.store, std::move(*t->reserved));
        reply(self, call, encode_reply_bool(true));
        prepared(self);
      },
      [self, call, t](caf::error& err) {
        KVS_WARN(self->state.label, "commit_store copy failed: {}", from_caf_error(err).detail);
        t->reserved->commit = false;
        self->send(self->state.p.store, std::move(*t->reserved));
        reply(self, call, encode_reply_bool(false));
        prepared(self);
      });
}

void on_prepare_retrieve(self_ptr self, mp_call& call) {
  auto& st = self->state;
  const auto& r = std::get<prepare_retrieve_req>(call.request->body);
  auto [begin, end] = chunk_range(r.key, static_cast<size_t>(st.p.chunk_size));
  if (!r.key.worker_id || end <= begin) {
    KVS_WARN(st.label, "prepare_retrieve refused: {}",
             !r.key.worker_id ? "no worker_id" : "no full chunk in range");
    reply(self, call, encode_reply_prepare_retrieve(false, {}));
    return;
  }
  const auto key = staged_key_of(r.key, r.instance_id, false);
  drop_staged(self, key);
  ++st.preparing;
  auto fail = [self, call](const std::string& why, int64_t instance, std::vector<uint64_t> give) {
    auto& st = self->state;
    KVS_WARN(st.label, "prepare_retrieve refused: {}", why);
    if (!give.empty())
      self->send(st.p.gpu, gpu_stage_give{instance, std::move(give)});
    reply(self, call, encode_reply_prepare_retrieve(false, {}));
    prepared(self);
  };
  const auto count = static_cast<uint32_t>(end - begin);
  self->request(st.p.gpu, caf::infinite, gpu_stage_take{r.instance_id, count})
    .then(
      [self, call, key, begin, end, fail](gpu_stage_taken& taken) {
        auto& st = self->state;
        const auto& r = std::get<prepare_retrieve_req>(call.request->body);
        if (taken.groups) {
          prepare_retrieve_groups(self, call, taken, begin, end); // calls prepared()
          return;
        }
        if (!taken.inline_data && taken.offsets.size() < end - begin) {
          fail(std::to_string(taken.offsets.size()) + " staging slots free for "
                 + std::to_string(end - begin) + " chunks (cache.engine_driven_slots)",
               r.instance_id, std::move(taken.offsets));
          return;
        }
        auto hashes = key_hashes(r.key, static_cast<size_t>(st.p.chunk_size), end);
        store_acquire q{st.p.request_id, static_cast<int32_t>(*r.key.worker_id), begin,
                        {hashes.begin() + static_cast<ptrdiff_t>(begin), hashes.end()},
                        taken.format};
        self->request(st.p.store, caf::infinite, std::move(q))
          .then(
            [self, call, key, taken, fail](store_acquire_reply& acq) {
              auto& st = self->state;
              const auto& r = std::get<prepare_retrieve_req>(call.request->body);
              if (acq.slot_bytes < taken.slot_bytes) {
                self->send(st.p.store, store_release{acq.ticket});
                fail("the chunks hold " + std::to_string(acq.slot_bytes) + " bytes, the "
                       "instance's chunks " + std::to_string(taken.slot_bytes),
                     r.instance_id, taken.offsets);
                return;
              }
              if (taken.inline_data) {
                // The chunks go in the reply's data: copied out of L1 while
                // the ticket pins them, then released.
                std::vector<std::string_view> datas;
                for (auto* p : acq.slots)
                  datas.emplace_back(reinterpret_cast<const char*>(p), taken.slot_bytes);
                std::string data;
                encode_tensor_envelope(data, taken.dtype, taken.chunk_shape, datas);
                self->send(st.p.store, store_release{acq.ticket});
                reply(self, call, encode_reply_prepare_retrieve_inline(data));
                prepared(self);
                return;
              }
              gpu_stage_copy cp{r.instance_id, false, taken.offsets, acq.slots, false};
              const uint64_t ticket = acq.ticket;
              self->request(st.p.gpu, caf::infinite, std::move(cp))
                .then(
                  [self, call, key, taken, ticket](gpu_copy_done&) {
                    auto& st = self->state;
                    // Copied out: the L1 chunks need no pin while the engine reads.
                    self->send(st.p.store, store_release{ticket});
                    staged_transfer t;
                    t.instance_id = std::get<0>(key);
                    t.offsets = taken.offsets;
                    st.staged[key] = std::move(t);
                    reply(self, call,
                          encode_reply_prepare_retrieve(true, slot_descs(taken, taken.offsets.size())));
                    prepared(self);
                  },
                  [self, key, taken, ticket, fail](caf::error& err) {
                    self->send(self->state.p.store, store_release{ticket});
                    // Not released by the transfer actor (release = false).
                    fail("copy into the staging slots failed: " + from_caf_error(err).detail,
                         std::get<0>(key), taken.offsets);
                  });
            },
            [key, taken, fail](caf::error& err) {
              fail(from_caf_error(err).detail, std::get<0>(key), taken.offsets);
            });
      },
      [fail](caf::error& err) { fail(from_caf_error(err).detail, -1, {}); });
}

void on_commit_retrieve(self_ptr self, mp_call& call) {
  auto& st = self->state;
  const auto& r = std::get<commit_retrieve_req>(call.request->body);
  auto i = st.staged.find(staged_key_of(r.key, r.instance_id, false));
  if (i != st.staged.end()) {
    release_staged(self, i->second);
    st.staged.erase(i);
  }
  // LMCache answers True whatever it found (its pickle strategy has nothing to release).
  reply(self, call, encode_reply_bool(true));
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
      const auto& f = std::get<free_lookup_locks_req>(req.body);
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
      return;
    }
    case mp_op::store:
      on_store(self, call);
      return;
    case mp_op::retrieve:
      on_retrieve(self, call);
      return;
    case mp_op::prepare_store:
      on_prepare_store(self, call);
      return;
    case mp_op::commit_store:
      on_commit_store(self, call);
      return;
    case mp_op::prepare_retrieve:
      on_prepare_retrieve(self, call);
      return;
    case mp_op::commit_retrieve:
      on_commit_retrieve(self, call);
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

namespace session_steps {

/// What a store commits (or aborts): who it is for, and per chunk its hash,
/// tokens and parent (the BlockStored events and the L2 objects).
store_finish finish_for(const cache_key& key, int32_t rank) {
  store_finish fin;
  fin.rank = rank;
  fin.model = key.model_name; // names the L2 objects
  fin.salt = key.cache_salt;
  fin.world_size = static_cast<int32_t>(std::max<int64_t>(key.world_size, 1));
  return fin;
}

/// Adds chunk `abs` (counted from the key's token 0) of `key` to `fin`.
void add_l2_name(store_finish& fin, const std::vector<std::string>& names, size_t abs) {
  if (!names.empty())
    fin.l2_names.push_back(abs < names.size() ? names[abs] : std::string{});
}

void add_chunk(store_finish& fin, const cache_key& key, const std::vector<uint64_t>& hashes,
               const std::vector<std::string>& names, size_t abs, size_t cs) {
  fin.hashes.push_back(hashes[abs]);
  add_l2_name(fin, names, abs);
  fin.tokens.emplace_back(key.token_ids.begin() + static_cast<ptrdiff_t>(abs * cs),
                          key.token_ids.begin() + static_cast<ptrdiff_t>((abs + 1) * cs));
  fin.parents.push_back(abs == 0 ? std::nullopt : std::optional<uint64_t>{hashes[abs - 1]});
}

/// A prepare's answers are back: the session may end now.
void prepared(self_ptr self) {
  --self->state.preparing;
  maybe_finish(self);
}

} // namespace session_steps

} // namespace kvs
