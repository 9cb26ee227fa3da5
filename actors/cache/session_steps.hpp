// The session actor's steps (actors/cache/session.hpp), one header for the files
// that serve its jobs. Every step is a free function of (self, ...) named
// for what it does; the entry step of each op the session serves is
// on_<op>(self, call), listed in session.cpp's k_steps.
//
//   session.cpp                shared steps (below), ending, the actor
//   session_lookup.cpp         on_lookup, the prefetch queries, free_lookup_locks
//   session_copy.cpp           on_store / on_retrieve: one copy job,
//                              first step (reserve | acquire) -> copy -> finish
//   session_engine_driven.cpp  on_prepare_* / on_commit_*, each a run of named
//                              steps (take slots -> reserve | acquire per group
//                              -> copy -> answer) joined by `ask`; a
//                              single-group instance is a hybrid one's one-group case
#pragma once

#include "actors/cache/session.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvs::session_steps {

using self_ptr = session_actor::stateful_pointer<session_state>;

// -- Joining named steps -------------------------------------------------------
//
// A transfer of several messages is a run of steps, each one a function of
// (self, state, reply) that the previous step's request leads to; a refusal
// leads to the run's failure step. What the run carries from step to step is
// its state (a shared_ptr, shared by the steps of one request, never copied).

/// Asks `dest` for `q`; its reply goes to step `next`, a refusal to `failed`.
template <class Reply, class Dest, class Request, class State>
void ask(self_ptr self, const Dest& dest, Request q, std::shared_ptr<State> t,
         void (*next)(self_ptr, const std::shared_ptr<State>&, Reply&),
         void (*failed)(self_ptr, const std::shared_ptr<State>&, const caf::error&)) {
  self->request(dest, caf::infinite, std::move(q))
    .then([self, t, next](Reply& r) { next(self, t, r); },
          [self, t, failed](caf::error& err) { failed(self, t, err); });
}

// -- Shared (session.cpp) ----------------------------------------------------

/// Hashes of chunks [0, n_chunks) of the key's tokens (prefix-chained).
std::vector<uint64_t> key_hashes(const cache_key& key, size_t chunk_size, size_t n_chunks);
/// l2.format = "lmcache": LMCache's chunk hashes of chunks [0, n_chunks)
/// (fewer past a token outside uint32; store_lookup::l2_names). Empty
/// for kvsidecar's own format.
std::vector<std::string> key_l2_names(const session_params& p, const cache_key& key,
                                      size_t n_chunks);
/// l2.format = "lmcache": the key's tokens of chunks [0, n_chunks)
/// (store_lookup::tokens); null otherwise.
std::shared_ptr<const std::vector<uint32_t>> lookup_tokens(const session_params& p,
                                                           const cache_key& key,
                                                           size_t n_chunks);
/// Chunk range [begin, end) a key's [start, end) token range covers.
std::pair<size_t, size_t> chunk_range(const cache_key& key, size_t cs);
/// Answers `call` with `body` (nullopt: None).
void reply(self_ptr self, const mp_call& call, std::optional<std::string> body);
/// Answers `call` as failed: LMCache's failure value of its op (the op
/// table's row: (b"", False), False, a failed PrepareRetrieveResponse), or
/// the failure reply naming `why` where the op has none.
void reply_failed(self_ptr self, const mp_call& call, std::string_view why);
/// What a store commits (or aborts): who it is for (L2 names, records).
store_finish finish_for(const cache_key& key, int32_t rank);
/// Adds chunk `abs` (counted from the key's token 0) of `key` to `fin`.
void add_chunk(store_finish& fin, const cache_key& key, const std::vector<uint64_t>& hashes,
               const std::vector<std::string>& names, size_t abs, size_t cs);
/// Adds LMCache's name of chunk `abs` to fin.l2_names ("" when it has none)
/// when names are in use.
void add_l2_name(store_finish& fin, const std::vector<std::string>& names, size_t abs);
/// A prepare's (or an engine-driven commit's) answers are back: the
/// session may end now.
void prepared(self_ptr self);
/// Quits once the session is ending and nothing is in flight; everything
/// held is released first.
void maybe_finish(self_ptr self);
/// end_session: the session ends once its jobs are done, then answers.
void on_end_session(self_ptr self, mp_call& call);

// -- Lookup and prefetch (session_lookup.cpp) --------------------------------

void on_lookup(self_ptr self, mp_call& call);
void on_query_prefetch_status(self_ptr self, mp_call& call);
void on_wait_prefetch_status(self_ptr self, mp_call& call);
/// A wait_prefetch_status deadline passed: its waiters get None.
void on_prefetch_deadline(self_ptr self);
void on_query_prefetch_lookup_hits(self_ptr self, mp_call& call);
void on_free_lookup_locks(self_ptr self, mp_call& call);

// -- The copy job (session_copy.cpp) -----------------------------------------

void on_store(self_ptr self, mp_call& call);
void on_retrieve(self_ptr self, mp_call& call);

// -- Engine-driven transfers (session_engine_driven.cpp) ---------------------

void on_prepare_store(self_ptr self, mp_call& call);
void on_commit_store(self_ptr self, mp_call& call);
void on_prepare_retrieve(self_ptr self, mp_call& call);
void on_commit_retrieve(self_ptr self, mp_call& call);
/// Gives back what a staged engine-driven transfer holds: its staging
/// slots, and a store's reservations (aborted).
void release_staged(self_ptr self, staged_transfer& t);
/// Gives back every staged transfer never committed (the session ends).
void release_all_staged(self_ptr self);

} // namespace kvs::session_steps
