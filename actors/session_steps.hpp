// The session actor's shared steps (actors/session.cpp), for the files
// that serve one family of its ops: session_hybrid.cpp (engine-driven
// transfers of hybrid-KV models).
#pragma once

#include "actors/session.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kvs::session_steps {

using self_ptr = session_actor::stateful_pointer<session_state>;

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
/// What a store commits (or aborts): who it is for (L2 names, records).
store_finish finish_for(const cache_key& key, int32_t rank);
/// Adds chunk `abs` (counted from the key's token 0) of `key` to `fin`
/// (`names`: key_l2_names of the key, maybe empty).
void add_chunk(store_finish& fin, const cache_key& key, const std::vector<uint64_t>& hashes,
               const std::vector<std::string>& names, size_t abs, size_t cs);
/// Adds LMCache's name of chunk `abs` to fin.l2_names ("" when it has none)
/// when names are in use.
void add_l2_name(store_finish& fin, const std::vector<std::string>& names, size_t abs);
/// A prepare's (or an engine-driven commit's) answers are back: the
/// session may end now.
void prepared(self_ptr self);
/// Commits (or aborts) each of a hybrid store's per-group reservations
/// in the store, and clears them.
void finish_groups(self_ptr self, std::vector<store_finish>& fins, bool commit);
/// Gives back what a staged engine-driven transfer holds: its staging
/// slots, and a store's reservations (aborted).
void release_staged(self_ptr self, staged_transfer& t);

} // namespace kvs::session_steps
