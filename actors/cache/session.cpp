// The session actor: one request id's LOOKUP, prefetch queries, copies and
// engine-driven transfers. Each op the session serves (its op-table row
// routes it to a session) has one step, listed in `k_steps` below; the
// steps live with their job:
//   session_lookup.cpp         lookup and the prefetch queries
//   session_copy.cpp           STORE / RETRIEVE: one copy job in named steps
//   session_engine_driven.cpp  prepare_* / commit_*, single-group and hybrid-KV instances
// This file holds what they share (session_steps.hpp), the end of the
// session, and the actor.
#include "actors/cache/session.hpp"
#include "actors/cache/session_steps.hpp"
#include "actors/cache/op_handlers.hpp"

#include "actors/actor_logging.hpp"
#include "cache/chunk_hash.hpp"
#include "cache/lookup_keys.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"

namespace kvs {

namespace session_steps {

std::vector<uint64_t> key_hashes(const cache_key& key, size_t chunk_size, size_t n_chunks) {
  return prefix_chunk_hashes(key.token_ids.data(), key.token_ids.size(), chunk_size, n_chunks,
                             identity_seed(key.model_name, key.world_size, key.cache_salt));
}

std::vector<std::string> key_l2_names(const session_params& p, const cache_key& key,
                                      size_t n_chunks) {
  if (!p.l2_lmcache_names || p.chunk_size <= 0)
    return {};
  return prefix_l2_names(key.token_ids.data(), key.token_ids.size(),
                         static_cast<size_t>(p.chunk_size), n_chunks);
}

std::shared_ptr<const std::vector<uint32_t>> lookup_tokens(const session_params& p,
                                                           const cache_key& key,
                                                           size_t n_chunks) {
  if (!p.l2_lmcache_names || p.chunk_size <= 0)
    return nullptr;
  return prefix_l2_tokens(key.token_ids.data(), key.token_ids.size(),
                          n_chunks * static_cast<size_t>(p.chunk_size));
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

void reply_failed(self_ptr self, const mp_call& call, std::string_view why) {
  if (auto body = failure_body(call.request->op))
    reply(self, call, std::move(body));
  else
    self->send(self->state.p.bridge, make_failure_reply(call, why));
}

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

void add_l2_name(store_finish& fin, const std::vector<std::string>& names, size_t abs) {
  if (!names.empty())
    fin.l2_names.push_back(abs < names.size() ? names[abs] : std::string{});
}

/// Adds chunk `abs` (counted from the key's token 0) of `key` to `fin`.
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

void on_end_session(self_ptr self, mp_call& call) {
  auto& st = self->state;
  st.ending = true;
  st.end_call = call;
  maybe_finish(self);
}

} // namespace session_steps

namespace {

using namespace session_steps;

/// The step of each op the session serves (session_serves: every row routed
/// to a session has one, tests/unit/test_actor_op_handlers.cpp).
struct session_step {
  mp_op op;
  void (*serve)(self_ptr, mp_call&);
};
constexpr session_step k_steps[] = {
  {mp_op::lookup, on_lookup},
  {mp_op::query_prefetch_status, on_query_prefetch_status},
  {mp_op::wait_prefetch_status, on_wait_prefetch_status},
  {mp_op::query_prefetch_lookup_hits, on_query_prefetch_lookup_hits},
  {mp_op::free_lookup_locks, on_free_lookup_locks},
  {mp_op::store, on_store},
  {mp_op::retrieve, on_retrieve},
  {mp_op::prepare_store, on_prepare_store},
  {mp_op::commit_store, on_commit_store},
  {mp_op::prepare_retrieve, on_prepare_retrieve},
  {mp_op::commit_retrieve, on_commit_retrieve},
  {mp_op::end_session, on_end_session},
};

void on_call(self_ptr self, mp_call& call) {
  for (const auto& s : k_steps)
    if (s.op == call.request->op) {
      s.serve(self, call);
      return;
    }
  // The router sends a session nothing else; should it, the caller still gets an answer.
  reply(self, call, std::nullopt);
}

} // namespace

bool session_serves(mp_op op) {
  for (const auto& s : k_steps)
    if (s.op == op)
      return true;
  return false;
}

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
    [self](deadline_atom) { on_prefetch_deadline(self); },
  };
}

} // namespace kvs
