// The session's engine-driven transfers (LMCache's EngineDrivenTransferModule),
// single-group instances (hybrid-KV ones: session_hybrid.cpp):
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
#include "actors/cache/session_steps.hpp"

#include "actors/actor_logging.hpp"
#include "actors/caf_error.hpp"
#include "lmcache_wire/tensor_envelope.hpp"

#include <cstring>
#include <memory>

namespace kvs::session_steps {

namespace {

session_state::staged_key staged_key_of(const cache_key& k, int64_t instance, bool to_l1) {
  return {instance, k.start, k.end, to_l1};
}

void drop_staged(self_ptr self, const session_state::staged_key& k) {
  auto& st = self->state;
  auto i = st.staged.find(k);
  if (i == st.staged.end())
    return;
  KVS_DEBUG(st.label, "a second prepare for the same key: the first one's slots are released");
  release_staged(self, i->second);
  st.staged.erase(i);
}

std::vector<shm_slot_desc> slot_descs(const gpu_stage_taken& t, size_t n) {
  std::vector<shm_slot_desc> out;
  for (size_t i = 0; i < n; ++i)
    out.push_back({t.offsets[i], t.slot_bytes, t.chunk_shape, t.dtype});
  return out;
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
    reply_failed(self, call, "commit failed");
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

} // namespace

void release_staged(self_ptr self, staged_transfer& t) {
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

void finish_groups(self_ptr self, std::vector<store_finish>& fins, bool commit) {
  for (auto& f : fins) {
    f.commit = commit;
    self->send(self->state.p.store, std::move(f));
  }
  fins.clear();
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

// -- Named steps ---------------------------------------------------------------
//
// Each transfer is a run of steps joined by `ask` (session_steps.hpp); what
// it carries from step to step is its `transfer`.

namespace {

struct transfer {
  mp_call call;
  session_state::staged_key key;
  size_t begin = 0;
  size_t end = 0;
  gpu_stage_taken taken;        ///< the staging slots (or inline / groups) granted
  std::vector<uint64_t> hashes; ///< the key's chunks 0..end
  std::vector<std::string> l2_names; ///< LMCache's hashes of them (l2.format = "lmcache")
  uint64_t ticket = 0;          ///< prepare_retrieve: the store's pin on the chunks
  std::shared_ptr<staged_transfer> staged; ///< commit_store: what it commits
};
using transfer_ptr = std::shared_ptr<transfer>;

// prepare_store: take staging slots -> reserve in the store -> hand the slots out

/// No slots handed out (the engine then skips the store, as for chunks
/// already stored).
void store_nothing(self_ptr self, const transfer_ptr& t) {
  reply(self, t->call, encode_reply_prepare_store({}, {}));
  prepared(self);
}

void store_not_staged(self_ptr self, const transfer_ptr& t, const caf::error& err) {
  KVS_WARN(self->state.label, "prepare_store refused: {}", from_caf_error(err).detail);
  store_nothing(self, t);
}

void store_not_reserved(self_ptr self, const transfer_ptr& t, const caf::error& err) {
  auto& st = self->state;
  const auto& r = std::get<prepare_store_req>(t->call.request->body);
  KVS_WARN(st.label, "prepare_store refused: {}", from_caf_error(err).detail);
  self->send(st.p.gpu, gpu_stage_give{r.instance_id, std::move(t->taken.offsets)});
  store_nothing(self, t);
}

void store_reserved(self_ptr self, const transfer_ptr& tr, store_reserve_reply& res) {
  auto& st = self->state;
  const auto& r = std::get<prepare_store_req>(tr->call.request->body);
  const auto& taken = tr->taken;
  const auto cs = static_cast<size_t>(st.p.chunk_size);
  const size_t n = taken.inline_data ? res.chunks.size()
                                     : std::min(res.chunks.size(), taken.offsets.size());
  staged_transfer t;
  t.instance_id = r.instance_id;
  t.slot_bytes = taken.slot_bytes;
  t.chunk_shape = taken.chunk_shape;
  t.dtype = taken.dtype;
  const size_t given = std::min(n, taken.offsets.size());
  t.offsets.assign(taken.offsets.begin(), taken.offsets.begin() + static_cast<ptrdiff_t>(given));
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
    add_chunk(fin, r.key, tr->hashes, tr->l2_names, tr->begin + c.position, cs);
  }
  auto slots = taken.inline_data ? std::vector<shm_slot_desc>{} : slot_descs(taken, n);
  if (n > 0) {
    t.reserved = std::move(fin);
    st.staged[tr->key] = std::move(t);
  }
  reply(self, tr->call, encode_reply_prepare_store(slots, indices));
  prepared(self);
}

void store_staged(self_ptr self, const transfer_ptr& t, gpu_stage_taken& taken) {
  auto& st = self->state;
  const auto& r = std::get<prepare_store_req>(t->call.request->body);
  const size_t want = t->end - t->begin;
  if (taken.groups) {
    prepare_store_groups(self, t->call, taken, t->key, t->begin, t->end);
    prepared(self);
    return;
  }
  for (const auto& g : r.skipped_chunks)
    if (!g.empty()) {
      // Only multi-group workers skip null-block chunks: this one sent
      // what its registration did not.
      KVS_WARN(st.label, "prepare_store with skipped_chunks from a single-group registration");
      self->send(st.p.bridge, make_failure_reply(t->call, "prepare_store: skipped_chunks from "
                                                          "a single-group registration"));
      prepared(self);
      return;
    }
  // Inline: no staging slot bounds the store (the data comes in commit_store).
  const size_t room = taken.inline_data ? want : taken.offsets.size();
  if (room < want)
    KVS_WARN(st.label, "instance {}: {} staging slots free for {} chunks to store "
                       "(cache.engine_driven_slots): storing the first {}",
             r.instance_id, taken.offsets.size(), want, taken.offsets.size());
  if (room == 0) {
    store_nothing(self, t);
    return;
  }
  t->hashes = key_hashes(r.key, static_cast<size_t>(st.p.chunk_size), t->end);
  t->l2_names = key_l2_names(st.p, r.key, t->end);
  t->taken = std::move(taken);
  store_reserve q{r.instance_id, static_cast<int32_t>(*r.key.worker_id),
                  {t->hashes.begin() + static_cast<ptrdiff_t>(t->begin), t->hashes.end()},
                  t->taken.format, room};
  ask<store_reserve_reply>(self, st.p.store, std::move(q), t, store_reserved, store_not_reserved);
}

// commit_store: copy staging -> L1, commit -> True (inline: commit_inline)

void store_copied(self_ptr self, const transfer_ptr& t, gpu_copy_done&) {
  t->staged->reserved->commit = true;
  self->send(self->state.p.store, std::move(*t->staged->reserved));
  reply(self, t->call, encode_reply_bool(true));
  prepared(self);
}

void store_copy_failed(self_ptr self, const transfer_ptr& t, const caf::error& err) {
  KVS_WARN(self->state.label, "commit_store copy failed: {}", from_caf_error(err).detail);
  t->staged->reserved->commit = false;
  self->send(self->state.p.store, std::move(*t->staged->reserved));
  reply_failed(self, t->call, "commit failed");
  prepared(self);
}

/// An inline commit_store with no prepare_store first: the instance's
/// registration says whether its data is grouped (hybrid) or not.
void inline_commit_staged(self_ptr self, const transfer_ptr& t, gpu_stage_taken& taken) {
  auto& st = self->state;
  const auto& r = std::get<commit_store_req>(t->call.request->body);
  if (taken.groups) {
    staged_transfer s;
    s.instance_id = r.instance_id;
    s.groups = taken.groups;
    commit_store_groups(self, t->call, std::move(s));
  } else {
    commit_inline(self, t->call, st.staged.end());
  }
  prepared(self);
}

void inline_commit_not_staged(self_ptr self, const transfer_ptr& t, const caf::error&) {
  commit_inline(self, t->call, self->state.staged.end());
  prepared(self);
}

// prepare_retrieve: take staging slots -> acquire -> copy L1 -> staging,
// release -> hand the slots out (inline: the chunks go in the reply)

/// The retrieve cannot be served: staging slots given back, failure value.
void retrieve_refused(self_ptr self, const transfer_ptr& t, const std::string& why,
                      int64_t instance, std::vector<uint64_t> give) {
  auto& st = self->state;
  KVS_WARN(st.label, "prepare_retrieve refused: {}", why);
  if (!give.empty())
    self->send(st.p.gpu, gpu_stage_give{instance, std::move(give)});
  reply_failed(self, t->call, "prepare_retrieve refused");
  prepared(self);
}

void retrieve_not_staged(self_ptr self, const transfer_ptr& t, const caf::error& err) {
  retrieve_refused(self, t, from_caf_error(err).detail, -1, {});
}

void retrieve_not_acquired(self_ptr self, const transfer_ptr& t, const caf::error& err) {
  retrieve_refused(self, t, from_caf_error(err).detail, std::get<0>(t->key), t->taken.offsets);
}

void retrieve_copied(self_ptr self, const transfer_ptr& t, gpu_copy_done&) {
  auto& st = self->state;
  // Copied out: the L1 chunks need no pin while the engine reads.
  self->send(st.p.store, store_release{t->ticket});
  staged_transfer s;
  s.instance_id = std::get<0>(t->key);
  s.offsets = t->taken.offsets;
  st.staged[t->key] = std::move(s);
  reply(self, t->call,
        encode_reply_prepare_retrieve(true, slot_descs(t->taken, t->taken.offsets.size())));
  prepared(self);
}

void retrieve_copy_failed(self_ptr self, const transfer_ptr& t, const caf::error& err) {
  self->send(self->state.p.store, store_release{t->ticket});
  // Not released by the transfer actor (release = false).
  retrieve_refused(self, t, "copy into the staging slots failed: " + from_caf_error(err).detail,
                   std::get<0>(t->key), t->taken.offsets);
}

void retrieve_acquired(self_ptr self, const transfer_ptr& t, store_acquire_reply& acq) {
  auto& st = self->state;
  const auto& r = std::get<prepare_retrieve_req>(t->call.request->body);
  const auto& taken = t->taken;
  if (acq.slot_bytes < taken.slot_bytes) {
    self->send(st.p.store, store_release{acq.ticket});
    retrieve_refused(self, t,
                     "the chunks hold " + std::to_string(acq.slot_bytes) + " bytes, the "
                       "instance's chunks " + std::to_string(taken.slot_bytes),
                     r.instance_id, taken.offsets);
    return;
  }
  if (taken.inline_data) {
    // The chunks go in the reply's data: copied out of L1 while the ticket
    // pins them, then released.
    std::vector<std::string_view> datas;
    for (auto* p : acq.slots)
      datas.emplace_back(reinterpret_cast<const char*>(p), taken.slot_bytes);
    std::string data;
    encode_tensor_envelope(data, taken.dtype, taken.chunk_shape, datas);
    self->send(st.p.store, store_release{acq.ticket});
    reply(self, t->call, encode_reply_prepare_retrieve_inline(data));
    prepared(self);
    return;
  }
  t->ticket = acq.ticket;
  gpu_stage_copy cp{r.instance_id, false, taken.offsets, acq.slots, false};
  ask<gpu_copy_done>(self, st.p.gpu, std::move(cp), t, retrieve_copied, retrieve_copy_failed);
}

void retrieve_staged(self_ptr self, const transfer_ptr& t, gpu_stage_taken& taken) {
  auto& st = self->state;
  const auto& r = std::get<prepare_retrieve_req>(t->call.request->body);
  if (taken.groups) {
    prepare_retrieve_groups(self, t->call, taken, t->begin, t->end); // calls prepared()
    return;
  }
  if (!taken.inline_data && taken.offsets.size() < t->end - t->begin) {
    retrieve_refused(self, t,
                     std::to_string(taken.offsets.size()) + " staging slots free for "
                       + std::to_string(t->end - t->begin) + " chunks (cache.engine_driven_slots)",
                     r.instance_id, std::move(taken.offsets));
    return;
  }
  auto hashes = key_hashes(r.key, static_cast<size_t>(st.p.chunk_size), t->end);
  t->taken = std::move(taken);
  store_acquire q{st.p.request_id, static_cast<int32_t>(*r.key.worker_id), t->begin,
                  {hashes.begin() + static_cast<ptrdiff_t>(t->begin), hashes.end()},
                  t->taken.format};
  ask<store_acquire_reply>(self, st.p.store, std::move(q), t, retrieve_acquired,
                           retrieve_not_acquired);
}

/// A prepare of chunks [begin, end) under `key`: an earlier prepare of the
/// same key is released, and the session does not end before this one answered.
transfer_ptr start_prepare(self_ptr self, const mp_call& call, session_state::staged_key key,
                           size_t begin, size_t end) {
  auto t = std::make_shared<transfer>();
  t->call = call;
  t->key = key;
  t->begin = begin;
  t->end = end;
  drop_staged(self, t->key);
  ++self->state.preparing;
  return t;
}

} // namespace

// -- The ops' entry steps -------------------------------------------------------

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
  auto t = start_prepare(self, call, staged_key_of(r.key, r.instance_id, true), begin, end);
  const auto count = static_cast<uint32_t>(end - begin);
  ask<gpu_stage_taken>(self, st.p.gpu, gpu_stage_take{r.instance_id, count}, t, store_staged,
                       store_not_staged);
}

void on_commit_store(self_ptr self, mp_call& call) {
  auto& st = self->state;
  const auto& r = std::get<commit_store_req>(call.request->body);
  const auto key = staged_key_of(r.key, r.instance_id, true);
  auto i = st.staged.find(key);
  if (i != st.staged.end() && i->second.groups) {
    auto s = std::move(i->second);
    st.staged.erase(i);
    commit_store_groups(self, call, std::move(s));
    return;
  }
  auto t = std::make_shared<transfer>();
  t->call = call;
  if (!r.cpu_data.empty() && i == st.staged.end()) {
    // No prepare_store came first (LMCache's inline strategy needs none): a
    // hybrid instance's grouped data is served all the same.
    ++st.preparing;
    ask<gpu_stage_taken>(self, st.p.gpu, gpu_stage_take{r.instance_id, 0}, t,
                         inline_commit_staged, inline_commit_not_staged);
    return;
  }
  if (!r.cpu_data.empty()) {
    commit_inline(self, call, i);
    return;
  }
  if (i == st.staged.end()) {
    KVS_WARN(st.label, "commit_store of instance {} without a prepared store for tokens {}..{}",
             r.instance_id, r.key.start, r.key.end);
    reply_failed(self, call, "commit failed");
    return;
  }
  t->staged = std::make_shared<staged_transfer>(std::move(i->second));
  st.staged.erase(i);
  ++st.preparing;
  gpu_stage_copy cp{t->staged->instance_id, true, t->staged->offsets, t->staged->l1, true};
  t->staged->offsets.clear(); // the copy gives them back
  ask<gpu_copy_done>(self, st.p.gpu, std::move(cp), t, store_copied, store_copy_failed);
}

void on_prepare_retrieve(self_ptr self, mp_call& call) {
  auto& st = self->state;
  const auto& r = std::get<prepare_retrieve_req>(call.request->body);
  auto [begin, end] = chunk_range(r.key, static_cast<size_t>(st.p.chunk_size));
  if (!r.key.worker_id || end <= begin) {
    KVS_WARN(st.label, "prepare_retrieve refused: {}",
             !r.key.worker_id ? "no worker_id" : "no full chunk in range");
    reply_failed(self, call, "prepare_retrieve refused");
    return;
  }
  auto t = start_prepare(self, call, staged_key_of(r.key, r.instance_id, false), begin, end);
  const auto count = static_cast<uint32_t>(end - begin);
  ask<gpu_stage_taken>(self, st.p.gpu, gpu_stage_take{r.instance_id, count}, t, retrieve_staged,
                       retrieve_not_staged);
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

} // namespace kvs::session_steps
