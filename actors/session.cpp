#include "actors/session.hpp"

#include "actors/actor_logging.hpp"
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
  if (!st.ending || st.inflight > 0)
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

/// A copy this session started is over: one less in flight.
void copy_over(self_ptr self) {
  --self->state.inflight;
  maybe_finish(self);
}

/// A STORE's copy is settled: commit its reservations, or give them back.
void settle_store(self_ptr self, store_finish fin, bool commit) {
  fin.commit = commit;
  self->send(self->state.p.store, std::move(fin));
  copy_over(self);
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

void on_store(self_ptr self, const mp_call& call, const store_req& r) {
  auto& st = self->state;
  auto cs = static_cast<size_t>(st.p.chunk_size);
  auto [begin, end] = chunk_range(r.key, cs);
  if (!r.key.worker_id) {
    KVS_WARN(st.label, "store without worker_id: refused");
    reply_copy(self, call, {}, false);
    return;
  }
  auto all = key_hashes(r.key, cs, end);
  std::vector<uint64_t> hashes(all.begin() + static_cast<ptrdiff_t>(begin), all.end());
  auto rank = static_cast<int32_t>(*r.key.worker_id);
  ++st.inflight;
  self->request(st.p.store, caf::infinite, store_reserve{r.instance_id, rank, hashes})
    .then(
      [self, call, r, all, begin, rank](store_reserve_reply& res) {
        auto& st = self->state;
        if (!res.ok) {
          KVS_WARN(st.label, "store of {} chunks refused: {}", all.size() - begin, res.why);
          reply_copy(self, call, {}, false);
          copy_over(self);
          return;
        }
        gpu_copy cp;
        cp.instance_id = r.instance_id;
        cp.to_l1 = true;
        cp.block_ids = r.block_ids;
        cp.chunk_tokens = static_cast<uint64_t>(st.p.chunk_size);
        cp.slot_bytes = res.slot_bytes;
        cp.engine_event_handle = r.event_ipc_handle;
        // What L1 already holds is not copied twice.
        store_finish fin;
        fin.rank = rank;
        fin.model = r.key.model_name; // names the L2 objects
        fin.salt = r.key.cache_salt;
        auto cs = static_cast<size_t>(st.p.chunk_size);
        for (auto& c : res.chunks) {
          cp.chunk_positions.push_back(c.position);
          cp.slots.push_back(c.slot);
          size_t abs = begin + c.position;
          fin.hashes.push_back(all[abs]);
          fin.tokens.emplace_back(r.key.token_ids.begin() + static_cast<ptrdiff_t>(abs * cs),
                                  r.key.token_ids.begin() + static_cast<ptrdiff_t>((abs + 1) * cs));
          fin.parents.push_back(abs == 0 ? std::nullopt : std::optional<uint64_t>{all[abs - 1]});
        }
        self->request(st.p.gpu, caf::infinite, std::move(cp))
          .then(
            [self, call, fin](gpu_copy_started& started) mutable {
              auto& st = self->state;
              if (!started.ok || started.complete) {
                // Settled already: commit (or abort) before answering, so a
                // lookup after the reply sees the chunks.
                if (!started.ok)
                  KVS_WARN(st.label, "store copy refused: {}", started.why);
                settle_store(self, std::move(fin), started.ok);
                reply_copy(self, call, started.event_handle, started.ok);
                return;
              }
              reply_copy(self, call, started.event_handle, true);
              // Commit only once the copy has completed.
              self->request(st.p.gpu, caf::infinite, gpu_await{started.ticket})
                .then(
                  [self, fin](gpu_copy_done& done) mutable {
                    if (!done.ok)
                      KVS_WARN(self->state.label, "store copy failed: {}", done.why);
                    settle_store(self, std::move(fin), done.ok);
                  },
                  [self, fin](caf::error&) mutable { settle_store(self, std::move(fin), false); });
            },
            [self, call, fin](caf::error& err) mutable {
              auto& st = self->state;
              KVS_WARN(st.label, "store copy failed: {}", caf::to_string(err));
              reply_copy(self, call, {}, false);
              settle_store(self, std::move(fin), false);
            });
      },
      [self, call](caf::error& err) {
        KVS_WARN(self->state.label, "store failed: {}", caf::to_string(err));
        reply_copy(self, call, {}, false);
        copy_over(self);
      });
}

void on_retrieve(self_ptr self, const mp_call& call, const retrieve_req& r) {
  auto& st = self->state;
  auto cs = static_cast<size_t>(st.p.chunk_size);
  auto [begin, end] = chunk_range(r.key, cs);
  if (!r.key.worker_id || end <= begin) {
    KVS_WARN(st.label, "retrieve refused: {}", !r.key.worker_id ? "no worker_id" : "no full chunk in range");
    reply_copy(self, call, {}, false);
    return;
  }
  auto all = key_hashes(r.key, cs, end);
  std::vector<uint64_t> hashes(all.begin() + static_cast<ptrdiff_t>(begin), all.end());
  auto rank = static_cast<int32_t>(*r.key.worker_id);
  ++st.inflight;
  auto release = [self](uint64_t ticket) {
    if (ticket != 0)
      self->send(self->state.p.store, store_release{ticket});
    copy_over(self);
  };
  self->request(st.p.store, caf::infinite, store_acquire{st.p.request_id, rank, begin, hashes})
    .then(
      [self, call, r, release](store_acquire_reply& acq) {
        auto& st = self->state;
        if (!acq.ok) {
          KVS_WARN(st.label, "retrieve refused: {}", acq.why);
          reply_copy(self, call, {}, false);
          release(acq.ticket);
          return;
        }
        gpu_copy cp;
        cp.instance_id = r.instance_id;
        cp.to_l1 = false;
        cp.block_ids = r.block_ids;
        cp.chunk_tokens = static_cast<uint64_t>(st.p.chunk_size);
        cp.slot_bytes = acq.slot_bytes;
        cp.skip_first_n = static_cast<uint64_t>(std::max<int64_t>(r.skip_first_n, 0));
        cp.engine_event_handle = r.event_ipc_handle;
        for (size_t i = 0; i < acq.slots.size(); ++i) {
          cp.chunk_positions.push_back(i);
          cp.slots.push_back(acq.slots[i]);
        }
        auto ticket = acq.ticket;
        self->request(st.p.gpu, caf::infinite, std::move(cp))
          .then(
            [self, call, ticket, release](gpu_copy_started& started) {
              auto& st = self->state;
              if (!started.ok || started.complete) {
                if (!started.ok)
                  KVS_WARN(st.label, "retrieve copy refused: {}", started.why);
                release(ticket);
                reply_copy(self, call, started.event_handle, started.ok);
                return;
              }
              reply_copy(self, call, started.event_handle, true);
              // Locks are released after the copy, never before.
              self->request(st.p.gpu, caf::infinite, gpu_await{started.ticket})
                .then(
                  [self, ticket, release](gpu_copy_done& done) {
                    if (!done.ok)
                      KVS_WARN(self->state.label, "retrieve copy failed: {}", done.why);
                    release(ticket);
                  },
                  [ticket, release](caf::error&) { release(ticket); });
            },
            [self, call, ticket, release](caf::error& err) {
              KVS_WARN(self->state.label, "retrieve copy failed: {}", caf::to_string(err));
              reply_copy(self, call, {}, false);
              release(ticket);
            });
      },
      [self, call, release](caf::error& err) {
        KVS_WARN(self->state.label, "retrieve failed: {}", caf::to_string(err));
        reply_copy(self, call, {}, false);
        release(0);
      });
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
      auto wait = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double>(std::min(timeout, 86400.0)));
      st.waiters.push_back({call, session_state::clock::now() + wait});
      self->delayed_send(self, wait, tick_atom_v);
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
      on_store(self, call, std::get<store_req>(req.body));
      return;
    case mp_op::retrieve:
      on_retrieve(self, call, std::get<retrieve_req>(req.body));
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
    [self](expire_atom) {
      self->state.ending = true;
      maybe_finish(self);
    },
    [self](tick_atom) {
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
