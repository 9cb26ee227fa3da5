// The session's engine-driven transfers (LMCache's EngineDrivenTransferModule).
//
// One flow serves every instance: a single-group instance is the one-group
// case of a hybrid-KV one (LMCache 0.5.7 workers that registered more than
// one group: sliding-window, recurrent or indexer groups beside full
// attention). Each transfer is done per group, group g's part of chunk c
// being its own L1 entry (group_hash; group 0's is the chunk's own hash,
// cache/group_lookup.hpp). What a hybrid instance changes is what the wire
// carries: its replies name each slot's group, and its inline data is the
// grouped envelope (lmcache_wire/tensor_envelope.hpp).
//
//   prepare_store:    staging slots -> reserve per group (fan-out, joined)
//                     -> hand the slots out
//   commit_store:     copy staging -> L1, commit              -> True
//                     inline: check the data -> copy it in, commit
//   prepare_retrieve: staging slots -> acquire per group (fan-out, joined)
//                     -> copy L1 -> staging, release -> hand the slots out
//                     (inline: the chunks go in the reply)
//   commit_retrieve:  give the slots back                     -> True
//
// Where LMCache's two kinds of worker differ, so do the steps:
//  - a single-group store stores as many chunks as staging slots are free;
//    a hybrid one needs a slot for each group's chunk that is not skipped
//    (all-null), or stores nothing;
//  - an inline single-group store reserves at prepare_store (its reply names
//    the chunks the commit is to carry); an inline hybrid one reserves at
//    commit_store (its data names its chunks).
//
// The engine copies its own pages into / out of the staging slots in
// between (gpu/staging_pool.hpp). An instance that writes L1 in place
// (cache.engine_driven_in_place: its registration named its L1 arena,
// cache/slot_pool.hpp) skips both copies: prepare_store hands out the
// reserved L1 slots themselves and commit_store only commits; prepare_retrieve
// hands out the offsets of the chunks in its own arena, pinned until
// commit_retrieve, and copies only chunks stored by others into staging
// slots at the end of the same object. LMCache's failure values answer every
// step that cannot be served: a store that cannot be staged hands out no
// slots (the engine then skips it, as for chunks already stored).
#include "actors/cache/session_steps.hpp"

#include "actors/actor_logging.hpp"
#include "actors/caf_error.hpp"
#include "cache/chunk_hash.hpp"
#include "cache/group_lookup.hpp"
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

/// The instance's groups: a hybrid instance's own; a single-group
/// instance's registration as its one (full-attention) group.
stage_groups groups_of(const gpu_stage_taken& t) {
  if (t.groups)
    return t.groups;
  return std::make_shared<const std::vector<stage_group>>(
    std::vector<stage_group>{{t.chunk_shape, t.dtype, t.format, t.slot_bytes, -1}});
}

/// Why tensor `x` of the data (`where`) is not a chunk of group `sg`, or "".
std::string mismatch(const envelope_tensor& x, const stage_group& sg, const std::string& where) {
  if (x.dtype == sg.dtype && x.shape == sg.chunk_shape && x.data.size() == sg.slot_bytes)
    return {};
  return where + ": dtype '" + x.dtype.substr(0, 32) + "', " + std::to_string(x.shape.size())
         + "-d, " + std::to_string(x.data.size()) + " bytes; the registration's chunk is '"
         + sg.dtype + "', " + std::to_string(sg.chunk_shape.size()) + "-d, "
         + std::to_string(sg.slot_bytes) + " bytes";
}

void finish_groups(self_ptr self, std::vector<store_finish>& fins, bool commit) {
  for (auto& f : fins) {
    f.commit = commit;
    self->send(self->state.p.store, std::move(f));
  }
  fins.clear();
}

} // namespace

void release_staged(self_ptr self, staged_transfer& t) {
  auto& st = self->state;
  if (!t.offsets.empty())
    self->send(st.p.gpu, gpu_stage_give{t.instance_id, std::move(t.offsets)});
  t.offsets.clear();
  for (auto ticket : t.tickets)
    self->send(st.p.store, store_release{ticket});
  t.tickets.clear();
  finish_groups(self, t.reserved, false);
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
// it carries from step to step is its `transfer`, a per-group request its
// `group_part` (the transfer and its group). A run that cannot go on ends in
// its failure step (store_nothing, commit_refused, retrieve_refused).

namespace {

struct transfer {
  mp_call call;
  session_state::staged_key key; ///< prepare_*: where what it holds is kept
  const cache_key* k = nullptr;  ///< the request's key, in the request `call` keeps alive
  int64_t instance = 0;
  size_t begin = 0; ///< the key's chunk range [begin, end)
  size_t end = 0;
  stage_groups groups;   ///< the instance's (one: a single-group instance)
  bool grouped = false;  ///< a hybrid instance: the wire names each slot's group
  bool inline_data = false;
  bool in_place = false;         ///< writes / reads its L1 arena directly
  std::vector<uint64_t> offsets; ///< the staging slots taken
  uint32_t total = 0;            ///< slots needed: one per group's chunk
  size_t max_chunks = 0;         ///< store_reserve::max_chunks of each group

  // Joining per-group requests: how many are out, and whether all went well.
  size_t left = 0;
  bool ok = true;
  std::string why;

  // Reservations (prepare_store, a hybrid inline commit_store).
  std::vector<uint64_t> hashes;       ///< the key's chunks 0..end
  std::vector<std::string> l2_names;  ///< LMCache's hashes of them (l2.format = "lmcache")
  /// What is asked: per group, chunks within the range, ascending.
  std::vector<std::vector<size_t>> want;
  std::vector<store_finish> fins;             ///< one per group with reserved chunks
  std::vector<std::vector<uint8_t*>> slots;   ///< per fins entry: the L1 slots
  std::vector<std::vector<uint64_t>> l1_offsets; ///< per fins entry: their L1 offsets
  std::vector<std::vector<size_t>> positions; ///< per fins entry: index into want[group]
  /// The step once every group's reservation answered.
  void (*reserved)(self_ptr, const std::shared_ptr<transfer>&) = nullptr;
  /// A hybrid inline commit_store: the data's groups (views into the request's data).
  std::vector<envelope_group> env;

  /// Pool commit_store: what it commits.
  std::shared_ptr<staged_transfer> staged;

  // prepare_retrieve.
  std::vector<std::optional<store_acquire_reply>> acquired;
  std::vector<size_t> first; ///< each group's first chunk, within the range

  size_t chunk(size_t f, size_t i) const { return want[fins[f].group][positions[f][i]]; }
  /// The instance's layout, as the staging answer gives it.
  void layout(const gpu_stage_taken& t) {
    groups = groups_of(t);
    grouped = t.groups != nullptr;
    inline_data = t.inline_data;
    in_place = t.in_place && !t.inline_data;
  }
  /// Group g's request failed: the first failure is why the run fails.
  void fail(uint32_t g, const std::string& detail) {
    if (!ok)
      return;
    ok = false;
    why = grouped ? "group " + std::to_string(g) + ": " + detail : detail;
  }
};
using transfer_ptr = std::shared_ptr<transfer>;

struct group_part {
  transfer_ptr t;
  uint32_t g = 0;
};
using part_ptr = std::shared_ptr<group_part>;

transfer_ptr start_transfer(const mp_call& call, const cache_key& k, int64_t instance,
                            size_t begin, size_t end) {
  auto t = std::make_shared<transfer>();
  t->call = call;
  t->k = &k;
  t->instance = instance;
  t->begin = begin;
  t->end = end;
  return t;
}

/// A prepare of chunks [begin, end) under `key`: an earlier prepare of the
/// same key is released, and the session does not end before this one answered.
transfer_ptr start_prepare(self_ptr self, const mp_call& call, const cache_key& k,
                           int64_t instance, bool to_l1, size_t begin, size_t end) {
  auto t = start_transfer(call, k, instance, begin, end);
  t->key = staged_key_of(k, instance, to_l1);
  drop_staged(self, t->key);
  ++self->state.preparing;
  return t;
}

// -- Reserving each group's chunks (prepare_store, a hybrid inline commit_store)

void group_reserved(self_ptr self, const part_ptr& part, store_reserve_reply& res) {
  auto& t = *part->t;
  const auto g = part->g;
  const auto cs = static_cast<size_t>(self->state.p.chunk_size);
  store_finish fin = finish_for(*t.k, static_cast<int32_t>(*t.k->worker_id));
  fin.group = g;
  fin.grouped = t.grouped;
  std::vector<uint8_t*> slots;
  std::vector<uint64_t> offsets;
  std::vector<size_t> positions;
  if (t.in_place && !res.in_place && !res.chunks.empty())
    t.fail(g, "the store reserved outside the instance's L1 arena");
  for (const auto& c : res.chunks) {
    const size_t rel = t.want[g][c.position];
    slots.push_back(c.slot);
    offsets.push_back(c.offset);
    positions.push_back(c.position);
    if (g == 0) {
      add_chunk(fin, *t.k, t.hashes, t.l2_names, t.begin + rel, cs);
    } else {
      fin.hashes.push_back(group_hash(t.hashes[t.begin + rel], g));
      add_l2_name(fin, t.l2_names, t.begin + rel); // LMCache: same hash, object group g
      fin.tokens.emplace_back();
      fin.parents.emplace_back();
    }
  }
  if (!fin.hashes.empty()) {
    t.fins.push_back(std::move(fin));
    t.slots.push_back(std::move(slots));
    t.l1_offsets.push_back(std::move(offsets));
    t.positions.push_back(std::move(positions));
  }
  if (--t.left == 0)
    t.reserved(self, part->t);
}

void group_not_reserved(self_ptr self, const part_ptr& part, const caf::error& err) {
  auto& t = *part->t;
  t.fail(part->g, from_caf_error(err).detail);
  if (--t.left == 0)
    t.reserved(self, part->t);
}

/// Reserves, for each group g, chunks `t->want[g]` (within the range of
/// t->k, from chunk t->begin) in the store, then goes on to step
/// t->reserved once every group answered. Chunks already stored are left out.
void reserve_groups(self_ptr self, const transfer_ptr& t) {
  auto& st = self->state;
  t->hashes = key_hashes(*t->k, static_cast<size_t>(st.p.chunk_size), t->end);
  t->l2_names = key_l2_names(st.p, *t->k, t->end);
  for (const auto& w : t->want)
    t->left += w.empty() ? 0 : 1;
  if (t->left == 0) {
    t->reserved(self, t);
    return;
  }
  const auto rank = static_cast<int32_t>(*t->k->worker_id);
  for (uint32_t g = 0; g < t->want.size(); ++g) {
    if (t->want[g].empty())
      continue;
    store_reserve q{t->instance, rank, {}, (*t->groups)[g].format, t->max_chunks, g};
    for (auto c : t->want[g])
      q.hashes.push_back(group_hash(t->hashes[t->begin + c], g));
    ask<store_reserve_reply>(self, st.p.store, std::move(q),
                             std::make_shared<group_part>(group_part{t, g}), group_reserved,
                             group_not_reserved);
  }
}

// -- prepare_store: staging slots -> reserve per group -> hand the slots out ---

/// The failure step: no slots handed out (the engine then skips the store,
/// as for chunks already stored); the session may end.
void store_nothing(self_ptr self, const transfer_ptr& t) {
  reply(self, t->call,
        t->grouped ? encode_reply_prepare_store_groups({}, {}, {})
                   : encode_reply_prepare_store({}, {}));
  prepared(self);
}

void store_not_staged(self_ptr self, const transfer_ptr& t, const caf::error& err) {
  KVS_WARN(self->state.label, "prepare_store refused: {}", from_caf_error(err).detail);
  store_nothing(self, t);
}

void store_reserved(self_ptr self, const transfer_ptr& tp) {
  auto& st = self->state;
  auto& p = *tp;
  if (!p.ok) {
    KVS_WARN(st.label, "prepare_store refused: {}", p.why);
    finish_groups(self, p.fins, false);
    if (!p.offsets.empty())
      self->send(st.p.gpu, gpu_stage_give{p.instance, std::move(p.offsets)});
    store_nothing(self, tp);
    return;
  }
  staged_transfer s;
  s.instance_id = p.instance;
  s.groups = p.groups;
  s.grouped = p.grouped;
  s.in_place = p.in_place && !p.inline_data;
  std::vector<shm_slot_desc> descs;
  std::vector<uint64_t> chunk_indices, group_ids;
  size_t k = 0; // the staging slot of the next reserved chunk (inline: none)
  for (size_t f = 0; f < p.fins.size(); ++f) {
    const auto g = p.fins[f].group;
    const auto& sg = (*p.groups)[g];
    for (size_t i = 0; i < p.slots[f].size(); ++i) {
      s.l1.push_back(p.slots[f][i]);
      s.lengths.push_back(sg.slot_bytes);
      s.positions.push_back(p.chunk(f, i));
      chunk_indices.push_back(p.chunk(f, i));
      group_ids.push_back(g);
      if (p.inline_data)
        continue;
      if (s.in_place) {
        // The engine writes the L1 slot itself, at its offset in the arena.
        descs.push_back({p.l1_offsets[f][i], sg.slot_bytes, sg.chunk_shape, sg.dtype});
        continue;
      }
      s.offsets.push_back(p.offsets[k]);
      descs.push_back({p.offsets[k++], sg.slot_bytes, sg.chunk_shape, sg.dtype});
    }
  }
  std::vector<uint64_t> spare(p.offsets.begin() + static_cast<ptrdiff_t>(k), p.offsets.end());
  if (!spare.empty())
    self->send(st.p.gpu, gpu_stage_give{p.instance, std::move(spare)});
  s.reserved = std::move(p.fins);
  if (!s.l1.empty())
    st.staged[p.key] = std::move(s);
  reply(self, p.call,
        p.grouped ? encode_reply_prepare_store_groups(descs, chunk_indices, group_ids)
                  : encode_reply_prepare_store(descs, chunk_indices));
  prepared(self);
}

/// A hybrid store's slots, one per group's chunk: all of them, or nothing stored.
void store_slots_taken(self_ptr self, const transfer_ptr& t, gpu_stage_taken& slots) {
  auto& st = self->state;
  if (slots.offsets.size() < t->total) {
    KVS_WARN(st.label, "instance {}: {} staging slots free for {} group chunks to store "
                       "(cache.engine_driven_slots per group): nothing stored",
             t->instance, slots.offsets.size(), t->total);
    self->send(st.p.gpu, gpu_stage_give{t->instance, std::move(slots.offsets)});
    store_nothing(self, t);
    return;
  }
  t->offsets = std::move(slots.offsets);
  reserve_groups(self, t);
}

/// Why the request's skipped_chunks cannot be served, or "".
std::string skipped_refusal(const prepare_store_req& r, const transfer& t) {
  const auto& groups = *t.groups;
  const size_t n_chunks = t.end - t.begin;
  if (!t.grouped) {
    // Only multi-group workers skip null-block chunks.
    for (const auto& g : r.skipped_chunks)
      if (!g.empty())
        return "skipped_chunks from a single-group registration";
    return {};
  }
  // LMCache: one list per registered group, each within the key's chunks.
  if (r.skipped_chunks.empty())
    return {};
  if (r.skipped_chunks.size() != groups.size())
    return "skipped_chunks has " + std::to_string(r.skipped_chunks.size()) + " groups for "
           + std::to_string(groups.size()) + " registered groups";
  for (size_t g = 0; g < groups.size(); ++g)
    for (auto idx : r.skipped_chunks[g])
      if (idx < 0 || static_cast<uint64_t>(idx) >= n_chunks)
        return "skipped_chunks for group " + std::to_string(g) + " is outside its "
               + std::to_string(n_chunks) + " chunks";
  return {};
}

void store_staged(self_ptr self, const transfer_ptr& t, gpu_stage_taken& taken) {
  auto& st = self->state;
  const auto& r = std::get<prepare_store_req>(t->call.request->body);
  t->layout(taken);
  if (auto why = skipped_refusal(r, *t); !why.empty()) {
    KVS_WARN(st.label, "prepare_store of instance {} refused: {}", r.instance_id, why);
    self->send(st.p.bridge, make_failure_reply(t->call, "prepare_store: " + why));
    prepared(self);
    return;
  }
  if (t->grouped && t->inline_data) {
    // LMCache's inline strategy reserves nothing here: the data, naming
    // its chunks, comes with the commit.
    staged_transfer s;
    s.instance_id = r.instance_id;
    s.groups = t->groups;
    s.grouped = true;
    st.staged[t->key] = std::move(s);
    reply(self, t->call, encode_reply_prepare_store({}, {}));
    prepared(self);
    return;
  }
  // A slot for each group's chunk that is not skipped (all-null) and not
  // stored already (the reservation leaves those out).
  const size_t n_chunks = t->end - t->begin;
  t->want.resize(t->groups->size());
  for (size_t g = 0; g < t->want.size(); ++g) {
    std::vector<bool> skip(n_chunks, false);
    if (!r.skipped_chunks.empty())
      for (auto idx : r.skipped_chunks[g])
        skip[static_cast<size_t>(idx)] = true; // checked above: within the range
    for (size_t c = 0; c < n_chunks; ++c)
      if (!skip[c]) {
        t->want[g].push_back(c);
        ++t->total;
      }
  }
  t->reserved = store_reserved;
  if (t->in_place) {
    // L1 slots are reserved in the instance's arena: no staging slot, no
    // limit but L1's.
    if (!taken.offsets.empty())
      self->send(st.p.gpu, gpu_stage_give{r.instance_id, std::move(taken.offsets)});
    if (t->total == 0) {
      store_nothing(self, t);
      return;
    }
    reserve_groups(self, t);
    return;
  }
  if (t->grouped) {
    if (t->total == 0) {
      store_nothing(self, t);
      return;
    }
    ask<gpu_stage_taken>(self, st.p.gpu, gpu_stage_take{r.instance_id, t->total, true}, t,
                         store_slots_taken, store_not_staged);
    return;
  }
  // One group: the slots free were taken with the answer; the store keeps
  // the first chunks they hold (inline, no slot bounds it).
  t->offsets = std::move(taken.offsets);
  const size_t room = t->inline_data ? t->total : t->offsets.size();
  if (room < t->total)
    KVS_WARN(st.label, "instance {}: {} staging slots free for {} chunks to store "
                       "(cache.engine_driven_slots): storing the first {}",
             r.instance_id, room, t->total, room);
  if (room == 0) {
    store_nothing(self, t);
    return;
  }
  t->max_chunks = room;
  reserve_groups(self, t);
}

// -- commit_store: copy staging -> L1, commit; inline: check -> copy in, commit

void store_copied(self_ptr self, const transfer_ptr& t, gpu_copy_done&) {
  finish_groups(self, t->staged->reserved, true);
  reply(self, t->call, encode_reply_bool(true));
  prepared(self);
}

void store_copy_failed(self_ptr self, const transfer_ptr& t, const caf::error& err) {
  KVS_WARN(self->state.label, "commit_store copy failed: {}", from_caf_error(err).detail);
  release_staged(self, *t->staged);
  reply_failed(self, t->call, "commit failed");
  prepared(self);
}

/// The failure step of an inline commit_store refused before anything was
/// asked: nothing is committed, the warning names why.
void commit_refused(self_ptr self, const mp_call& call, const std::string& why) {
  const auto& r = std::get<commit_store_req>(call.request->body);
  KVS_WARN(self->state.label, "commit_store of instance {} (inline data, {} bytes) refused: {}",
           r.instance_id, r.cpu_data.size(), why);
  reply_failed(self, call, "commit failed");
}

/// A single-group instance's inline commit_store (LMCache 0.5.7's inline
/// transfer context: an instance registered without a pool, or a worker
/// that could not map the one named): the chunks its prepare_store reserved
/// are in the data, each tensor at its chunk's position in the range; they
/// are copied into their L1 slots and committed. Anything that does not
/// match the registration (count, dtype, shape, size) fails the store:
/// nothing is committed.
void commit_inline_one(self_ptr self, const mp_call& call, staged_transfer& s) {
  const auto& r = std::get<commit_store_req>(call.request->body);
  auto fail = [&](const std::string& why) {
    release_staged(self, s);
    commit_refused(self, call, why);
  };
  if (s.reserved.empty()) {
    fail("no prepared store for tokens " + std::to_string(r.key.start) + ".."
         + std::to_string(r.key.end));
    return;
  }
  auto tensors = decode_tensor_envelope(r.cpu_data);
  if (!tensors) {
    fail(tensors.error_value().detail);
    return;
  }
  const auto& sg = (*s.groups)[0];
  for (auto pos : s.positions) {
    if (pos >= tensors->size()) {
      fail(std::to_string(tensors->size()) + " tensors, but chunk " + std::to_string(pos)
           + " of the range was reserved");
      return;
    }
    if (auto why = mismatch((*tensors)[pos], sg, "tensors[" + std::to_string(pos) + "]");
        !why.empty()) {
      fail(why);
      return;
    }
  }
  for (size_t k = 0; k < s.positions.size(); ++k)
    std::memcpy(s.l1[k], (*tensors)[s.positions[k]].data.data(), sg.slot_bytes);
  if (!s.offsets.empty()) // a pool was named but the worker sent its data inline
    self->send(self->state.p.gpu, gpu_stage_give{s.instance_id, std::move(s.offsets)});
  finish_groups(self, s.reserved, true);
  reply(self, call, encode_reply_bool(true));
}

void commit_groups_reserved(self_ptr self, const transfer_ptr& tp) {
  auto& p = *tp;
  if (p.ok) {
    // Copy each reserved chunk's tensor (a position in what was asked is
    // the tensor's index) into its L1 slot.
    for (size_t f = 0; f < p.fins.size(); ++f) {
      const auto& eg = p.env[p.fins[f].group];
      for (size_t i = 0; i < p.slots[f].size(); ++i) {
        const auto& x = eg.tensors[p.positions[f][i]];
        std::memcpy(p.slots[f][i], x.data.data(), x.data.size());
      }
    }
  } else {
    KVS_WARN(self->state.label, "commit_store (hybrid) refused: {}", p.why);
  }
  const bool ok = p.ok;
  finish_groups(self, p.fins, ok);
  reply(self, p.call, encode_reply_bool(ok));
  prepared(self);
}

/// A hybrid instance's inline commit_store: every group's tensors are
/// checked against its layout, then per group reserve -> copy in -> commit.
void commit_inline_groups(self_ptr self, const mp_call& call, staged_transfer& s) {
  auto& st = self->state;
  const auto& r = std::get<commit_store_req>(call.request->body);
  release_staged(self, s); // a pool instance's prepare: its slots and reservations
  auto [begin, end] = chunk_range(r.key, static_cast<size_t>(st.p.chunk_size));
  if (!r.key.worker_id || end <= begin) {
    commit_refused(self, call, !r.key.worker_id ? "no worker_id" : "no full chunk in range");
    return;
  }
  auto decoded = decode_grouped_tensor_envelope(r.cpu_data);
  if (!decoded) {
    commit_refused(self, call, decoded.error_value().detail);
    return;
  }
  const auto& groups = *s.groups;
  if (decoded->size() != groups.size()) {
    commit_refused(self, call,
                   std::to_string(decoded->size()) + " groups in the data for "
                     + std::to_string(groups.size()) + " registered groups");
    return;
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& eg = (*decoded)[g];
    for (size_t k = 0; k < eg.tensors.size(); ++k) {
      const auto where = "groups[" + std::to_string(g) + "].tensors[" + std::to_string(k) + "]";
      auto why = static_cast<uint64_t>(eg.chunk_indices[k]) >= end - begin
                   ? where + ": chunk index " + std::to_string(eg.chunk_indices[k])
                       + " outside the " + std::to_string(end - begin) + " chunks of the range"
                   : mismatch(eg.tensors[k], groups[g], where);
      if (!why.empty()) {
        commit_refused(self, call, why);
        return;
      }
    }
  }
  auto t = start_transfer(call, r.key, r.instance_id, begin, end);
  t->groups = s.groups;
  t->grouped = true;
  // The tensors are views into the request's data, which `call` keeps alive.
  t->env = std::move(decoded.value());
  t->want.resize(t->env.size());
  for (size_t g = 0; g < t->env.size(); ++g)
    t->want[g].assign(t->env[g].chunk_indices.begin(), t->env[g].chunk_indices.end());
  t->reserved = commit_groups_reserved;
  ++st.preparing;
  reserve_groups(self, t);
}

void commit_inline(self_ptr self, const mp_call& call, staged_transfer& s) {
  if (s.grouped)
    commit_inline_groups(self, call, s);
  else
    commit_inline_one(self, call, s);
}

/// An inline commit_store with no prepare_store first: the instance's
/// registration says whether its data is grouped (hybrid) or not.
void inline_commit_staged(self_ptr self, const transfer_ptr& t, gpu_stage_taken& taken) {
  staged_transfer s;
  s.instance_id = t->instance;
  s.groups = groups_of(taken);
  s.grouped = taken.groups != nullptr;
  commit_inline(self, t->call, s);
  prepared(self);
}

void inline_commit_not_staged(self_ptr self, const transfer_ptr& t, const caf::error&) {
  staged_transfer none;
  commit_inline_one(self, t->call, none);
  prepared(self);
}

// -- prepare_retrieve: staging slots -> acquire per group -> copy L1 -> staging,
// release -> hand the slots out (inline: the chunks go in the reply)

void release_tickets(self_ptr self, transfer& t) {
  for (auto& a : t.acquired)
    if (a)
      self->send(self->state.p.store, store_release{a->ticket});
  t.acquired.clear();
}

/// The failure step: what the run holds is given back, LMCache's failed
/// PrepareRetrieveResponse answers; the session may end.
void retrieve_refused(self_ptr self, const transfer_ptr& t, const std::string& why) {
  auto& st = self->state;
  KVS_WARN(st.label, "prepare_retrieve refused: {}", why);
  release_tickets(self, *t);
  if (!t->offsets.empty())
    self->send(st.p.gpu, gpu_stage_give{t->instance, std::move(t->offsets)});
  reply_failed(self, t->call, "prepare_retrieve refused");
  prepared(self);
}

void retrieve_not_staged(self_ptr self, const transfer_ptr& t, const caf::error& err) {
  retrieve_refused(self, t, from_caf_error(err).detail);
}

void retrieve_copied(self_ptr self, const transfer_ptr& t, gpu_copy_done&) {
  auto& st = self->state;
  release_tickets(self, *t); // copied out: no pin while the engine reads
  std::vector<shm_slot_desc> descs;
  std::vector<uint64_t> group_ids, chunk_indices;
  size_t k = 0;
  for (uint32_t g = 0; g < t->groups->size(); ++g) {
    const auto& sg = (*t->groups)[g];
    for (size_t c = t->first[g]; c < t->end - t->begin; ++c, ++k) {
      descs.push_back({t->offsets[k], sg.slot_bytes, sg.chunk_shape, sg.dtype});
      group_ids.push_back(g);
      chunk_indices.push_back(c);
    }
  }
  staged_transfer s;
  s.instance_id = t->instance;
  s.offsets = std::move(t->offsets);
  st.staged[t->key] = std::move(s);
  reply(self, t->call,
        t->grouped ? encode_reply_prepare_retrieve_groups(descs, group_ids, chunk_indices)
                   : encode_reply_prepare_retrieve(true, descs));
  prepared(self);
}

void retrieve_copy_failed(self_ptr self, const transfer_ptr& t, const caf::error& err) {
  // Not released by the transfer actor (release = false).
  retrieve_refused(self, t, "copy into the staging slots failed: " + from_caf_error(err).detail);
}

// -- In place: the chunks in the instance's arena are handed out where they
// are (pinned until commit_retrieve); the others are copied into staging
// slots at the end of the arena's object.

bool chunk_in_place(const store_acquire_reply& a, size_t j) {
  return j < a.in_place.size() && a.in_place[j] != 0;
}

void retrieve_answer_in_place(self_ptr self, const transfer_ptr& t) {
  auto& st = self->state;
  std::vector<shm_slot_desc> descs;
  std::vector<uint64_t> group_ids, chunk_indices;
  size_t k = 0; // the staging slot of the next chunk stored by another instance
  for (uint32_t g = 0; g < t->groups->size(); ++g) {
    const auto& sg = (*t->groups)[g];
    const auto& a = *t->acquired[g];
    for (size_t j = 0; j < a.slots.size(); ++j) {
      const uint64_t off = chunk_in_place(a, j) ? a.offsets[j] : t->offsets[k++];
      descs.push_back({off, sg.slot_bytes, sg.chunk_shape, sg.dtype});
      group_ids.push_back(g);
      chunk_indices.push_back(t->first[g] + j);
    }
  }
  staged_transfer s;
  s.instance_id = t->instance;
  s.in_place = true;
  s.offsets = std::move(t->offsets);
  for (auto& a : t->acquired)
    s.tickets.push_back(a->ticket); // the engine reads them in place until commit_retrieve
  t->acquired.clear();
  st.staged[t->key] = std::move(s);
  reply(self, t->call,
        t->grouped ? encode_reply_prepare_retrieve_groups(descs, group_ids, chunk_indices)
                   : encode_reply_prepare_retrieve(true, descs));
  prepared(self);
}

void retrieve_foreign_copied(self_ptr self, const transfer_ptr& t, gpu_copy_done&) {
  retrieve_answer_in_place(self, t);
}

void retrieve_foreign_slots(self_ptr self, const transfer_ptr& t, gpu_stage_taken& slots) {
  t->offsets = std::move(slots.offsets);
  gpu_stage_copy cp{t->instance, false, {}, {}, false};
  for (uint32_t g = 0; g < t->groups->size(); ++g) {
    const auto& a = *t->acquired[g];
    for (size_t j = 0; j < a.slots.size(); ++j)
      if (!chunk_in_place(a, j)) {
        cp.l1.push_back(a.slots[j]);
        cp.lengths.push_back((*t->groups)[g].slot_bytes);
      }
  }
  if (t->offsets.size() < cp.l1.size()) {
    retrieve_refused(self, t,
                     std::to_string(t->offsets.size()) + " staging slots free for "
                       + std::to_string(cp.l1.size())
                       + " chunks stored by other instances (cache.engine_driven_slots)");
    return;
  }
  cp.offsets = t->offsets;
  ask<gpu_copy_done>(self, self->state.p.gpu, std::move(cp), t, retrieve_foreign_copied,
                     retrieve_copy_failed);
}

void retrieve_in_place(self_ptr self, const transfer_ptr& t) {
  uint32_t foreign = 0;
  for (const auto& a : t->acquired)
    for (size_t j = 0; j < a->slots.size(); ++j)
      foreign += chunk_in_place(*a, j) ? 0 : 1;
  if (foreign == 0) {
    retrieve_answer_in_place(self, t);
    return;
  }
  ask<gpu_stage_taken>(self, self->state.p.gpu, gpu_stage_take{t->instance, foreign, true}, t,
                       retrieve_foreign_slots, retrieve_not_staged);
}

/// Every group's chunks are pinned: answer inline, or copy them into the
/// staging slots and answer with those.
void retrieve_acquired(self_ptr self, const transfer_ptr& tp) {
  auto& st = self->state;
  auto& p = *tp;
  const auto& groups = *p.groups;
  for (uint32_t g = 0; g < groups.size() && p.ok; ++g)
    if (p.acquired[g]->slot_bytes < groups[g].slot_bytes)
      p.fail(g, "the chunks hold " + std::to_string(p.acquired[g]->slot_bytes)
                  + " bytes, the instance's chunks " + std::to_string(groups[g].slot_bytes));
  if (!p.ok) {
    retrieve_refused(self, tp, p.why);
    return;
  }
  if (p.inline_data) {
    // Copied out of L1 into the reply while the tickets pin the chunks.
    std::vector<envelope_group_out> out;
    for (uint32_t g = 0; g < groups.size(); ++g) {
      envelope_group_out eg{groups[g].dtype, groups[g].chunk_shape, p.first[g], {}};
      for (auto* slot : p.acquired[g]->slots)
        eg.datas.emplace_back(reinterpret_cast<const char*>(slot), groups[g].slot_bytes);
      out.push_back(std::move(eg));
    }
    std::string data;
    if (p.grouped)
      encode_grouped_tensor_envelope(data, out);
    else
      encode_tensor_envelope(data, out[0].dtype, out[0].shape, out[0].datas);
    release_tickets(self, p);
    reply(self, p.call, encode_reply_prepare_retrieve_inline(data));
    prepared(self);
    return;
  }
  if (p.in_place) {
    retrieve_in_place(self, tp);
    return;
  }
  gpu_stage_copy cp{p.instance, false, p.offsets, {}, false};
  for (uint32_t g = 0; g < groups.size(); ++g)
    for (auto* slot : p.acquired[g]->slots) {
      cp.l1.push_back(slot);
      cp.lengths.push_back(groups[g].slot_bytes);
    }
  ask<gpu_copy_done>(self, st.p.gpu, std::move(cp), tp, retrieve_copied, retrieve_copy_failed);
}

void group_acquired(self_ptr self, const part_ptr& part, store_acquire_reply& acq) {
  auto& t = *part->t;
  t.acquired[part->g] = std::move(acq);
  if (--t.left == 0)
    retrieve_acquired(self, part->t);
}

void group_not_acquired(self_ptr self, const part_ptr& part, const caf::error& err) {
  auto& t = *part->t;
  t.fail(part->g, from_caf_error(err).detail);
  if (--t.left == 0)
    retrieve_acquired(self, part->t);
}

/// Pins each group's in-window suffix of the range (the whole range for
/// full attention), then goes on to retrieve_acquired.
void acquire_groups(self_ptr self, const transfer_ptr& t) {
  auto& st = self->state;
  const auto hashes = key_hashes(*t->k, static_cast<size_t>(st.p.chunk_size), t->end);
  const auto& groups = *t->groups;
  t->left = groups.size();
  t->acquired.resize(groups.size());
  for (uint32_t g = 0; g < groups.size(); ++g) {
    store_acquire q{group_session(st.p.request_id, g), static_cast<int32_t>(*t->k->worker_id),
                    t->begin + t->first[g], {}, groups[g].format,
                    t->in_place ? t->instance : int64_t{-1}};
    for (size_t c = t->begin + t->first[g]; c < t->end; ++c)
      q.hashes.push_back(group_hash(hashes[c], g));
    ask<store_acquire_reply>(self, st.p.store, std::move(q),
                             std::make_shared<group_part>(group_part{t, g}), group_acquired,
                             group_not_acquired);
  }
}

/// A slot for each group's chunk, or the retrieve is refused.
void retrieve_slots_taken(self_ptr self, const transfer_ptr& t, gpu_stage_taken& slots) {
  t->offsets = std::move(slots.offsets);
  if (t->offsets.size() < t->total) {
    retrieve_refused(self, t,
                     std::to_string(t->offsets.size()) + " staging slots free for "
                       + std::to_string(t->total) + " chunks (cache.engine_driven_slots"
                       + (t->grouped ? " per group)" : ")"));
    return;
  }
  acquire_groups(self, t);
}

void retrieve_staged(self_ptr self, const transfer_ptr& t, gpu_stage_taken& taken) {
  auto& st = self->state;
  t->layout(taken);
  // LMCache serves a windowed group's last `window` chunks of the range only.
  const size_t n = t->end - t->begin;
  for (const auto& sg : *t->groups) {
    const size_t first = sg.window < 0 ? 0 : n - std::min(n, static_cast<size_t>(sg.window));
    t->first.push_back(first);
    t->total += static_cast<uint32_t>(n - first);
  }
  if (t->inline_data || t->in_place) // in place: staging slots only for what is not
    acquire_groups(self, t);         // in the arena, counted once acquired
  else if (t->grouped) // a hybrid instance's slots are taken once its groups are known
    ask<gpu_stage_taken>(self, st.p.gpu, gpu_stage_take{t->instance, t->total, true}, t,
                         retrieve_slots_taken, retrieve_not_staged);
  else
    retrieve_slots_taken(self, t, taken);
}

} // namespace

// -- The ops' entry steps -------------------------------------------------------

void on_prepare_store(self_ptr self, mp_call& call) {
  auto& st = self->state;
  const auto& r = std::get<prepare_store_req>(call.request->body);
  auto [begin, end] = chunk_range(r.key, static_cast<size_t>(st.p.chunk_size));
  if (!r.key.worker_id || end <= begin) {
    if (!r.key.worker_id)
      KVS_WARN(st.label, "prepare_store without worker_id: nothing to store");
    reply(self, call, encode_reply_prepare_store({}, {}));
    return;
  }
  auto t = start_prepare(self, call, r.key, r.instance_id, true, begin, end);
  const auto count = static_cast<uint32_t>(end - begin);
  ask<gpu_stage_taken>(self, st.p.gpu, gpu_stage_take{r.instance_id, count}, t, store_staged,
                       store_not_staged);
}

void on_commit_store(self_ptr self, mp_call& call) {
  auto& st = self->state;
  const auto& r = std::get<commit_store_req>(call.request->body);
  auto i = st.staged.find(staged_key_of(r.key, r.instance_id, true));
  if (!r.cpu_data.empty()) {
    if (i != st.staged.end()) {
      auto s = std::move(i->second);
      st.staged.erase(i);
      commit_inline(self, call, s);
      return;
    }
    // No prepare_store came first (LMCache's inline strategy needs none):
    // a hybrid instance's grouped data is served all the same.
    ++st.preparing;
    ask<gpu_stage_taken>(self, st.p.gpu, gpu_stage_take{r.instance_id, 0},
                         start_transfer(call, r.key, r.instance_id, 0, 0), inline_commit_staged,
                         inline_commit_not_staged);
    return;
  }
  if (i != st.staged.end() && i->second.in_place && !i->second.reserved.empty()) {
    // The engine wrote the L1 slots themselves: commit them.
    finish_groups(self, i->second.reserved, true);
    st.staged.erase(i);
    reply(self, call, encode_reply_bool(true));
    return;
  }
  if (i == st.staged.end() || i->second.offsets.empty()) {
    KVS_WARN(st.label, "commit_store of instance {} without a prepared store for tokens {}..{}",
             r.instance_id, r.key.start, r.key.end);
    if (i != st.staged.end()) {
      release_staged(self, i->second);
      st.staged.erase(i);
    }
    reply_failed(self, call, "commit failed");
    return;
  }
  // The engine wrote the staging slots: copy each into its L1 slot, commit.
  auto t = start_transfer(call, r.key, r.instance_id, 0, 0);
  t->staged = std::make_shared<staged_transfer>(std::move(i->second));
  st.staged.erase(i);
  auto& s = *t->staged;
  gpu_stage_copy cp{s.instance_id, true, s.offsets, s.l1, true, s.lengths};
  s.offsets.clear(); // the copy gives them back
  ++st.preparing;
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
  auto t = start_prepare(self, call, r.key, r.instance_id, false, begin, end);
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
