// The session's engine-driven transfers of hybrid-KV instances (the
// `_groups` steps of session_steps.hpp), each a run of named steps joined
// by `ask`, as session_engine_driven.cpp's:
//
//   prepare_store:    check skipped_chunks -> staging slots -> reserve per group
//                     (fan-out, joined) -> hand the slots out
//   commit_store:     staging -> L1 copy, commit; inline: check -> reserve per
//                     group -> copy the tensors in, commit
//   prepare_retrieve: acquire per group (fan-out, joined) -> inline, or
//                     staging slots -> copy L1 -> staging, release -> slots
//
// A run's state is one `hybrid`; a per-group request carries a `group_part`
// (the run and its group). A run that cannot go on ends in its failure step
// (store_refused / commit_refused / retrieve_missed).
#include "actors/cache/session_steps.hpp"

#include "actors/actor_logging.hpp"
#include "actors/caf_error.hpp"
#include "cache/chunk_hash.hpp"
#include "cache/group_lookup.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"
#include "lmcache_wire/tensor_envelope.hpp"

#include <cstring>
#include <memory>

namespace kvs::session_steps {

namespace {

/// Why group g's tensors do not match its registration, or "".
std::string mismatch(const envelope_group& eg, const stage_group& sg, size_t g, size_t n_chunks) {
  for (size_t k = 0; k < eg.tensors.size(); ++k) {
    const auto& x = eg.tensors[k];
    const auto where = "groups[" + std::to_string(g) + "].tensors[" + std::to_string(k) + "]";
    if (static_cast<uint64_t>(eg.chunk_indices[k]) >= n_chunks)
      return where + ": chunk index " + std::to_string(eg.chunk_indices[k]) + " outside the "
             + std::to_string(n_chunks) + " chunks of the range";
    if (x.dtype != sg.dtype || x.shape != sg.chunk_shape || x.data.size() != sg.slot_bytes)
      return where + ": dtype '" + x.dtype.substr(0, 32) + "', " + std::to_string(x.shape.size())
             + "-d, " + std::to_string(x.data.size()) + " bytes; the group's chunk is '"
             + sg.dtype + "', " + std::to_string(sg.chunk_shape.size()) + "-d, "
             + std::to_string(sg.slot_bytes) + " bytes";
  }
  return {};
}

/// One hybrid transfer's state, shared by its steps.
struct hybrid {
  mp_call call;
  session_state::staged_key key; ///< prepare_store: where its slots are kept
  const cache_key* k = nullptr;  ///< the request's key, in the request `call` keeps alive
  int64_t instance = 0;
  stage_groups groups;
  bool inline_data = false;
  size_t begin = 0;
  size_t end = 0;
  std::vector<uint64_t> offsets; ///< the staging slots taken
  uint32_t total = 0;            ///< how many slots were asked for

  // Joining per-group requests: how many are out, and whether all went well.
  size_t left = 0;
  bool ok = true;
  std::string why;

  // Reservations (prepare_store, inline commit_store).
  std::shared_ptr<const std::vector<uint64_t>> hashes;
  std::shared_ptr<const std::vector<std::string>> names;
  /// What was asked: per group, chunks within the range, ascending.
  std::vector<std::vector<size_t>> want;
  std::vector<store_finish> fins;              ///< one per group with reserved chunks
  std::vector<std::vector<uint8_t*>> slots;    ///< per fins entry: the L1 slots
  std::vector<std::vector<size_t>> positions;  ///< per fins entry: index into want[group]
  /// The step once every group's reservation answered.
  void (*reserved)(self_ptr, const std::shared_ptr<hybrid>&) = nullptr;
  /// Inline commit_store: the data's groups (views into the request's data).
  std::shared_ptr<const std::vector<envelope_group>> env;

  /// Pool commit_store: what it commits.
  std::shared_ptr<staged_transfer> staged;

  // prepare_retrieve.
  std::vector<std::optional<store_acquire_reply>> acquired;
  std::vector<size_t> first; ///< each group's first chunk, within the range
  std::vector<shm_slot_desc> descs;
  std::vector<uint64_t> group_ids, chunk_indices;

  size_t chunk(size_t f, size_t i) const { return want[fins[f].group][positions[f][i]]; }
};
using hybrid_ptr = std::shared_ptr<hybrid>;

/// One group's request of a run.
struct group_part {
  hybrid_ptr t;
  uint32_t g = 0;
};
using part_ptr = std::shared_ptr<group_part>;

hybrid_ptr start_hybrid(const mp_call& call, const stage_groups& groups) {
  auto t = std::make_shared<hybrid>();
  t->call = call;
  t->groups = groups;
  return t;
}

// -- Reserving each group's chunks (prepare_store, inline commit_store) -------

void group_reserved(self_ptr self, const part_ptr& part, store_reserve_reply& res) {
  auto& t = *part->t;
  const auto g = part->g;
  const auto cs = static_cast<size_t>(self->state.p.chunk_size);
  const auto rank = static_cast<int32_t>(*t.k->worker_id);
  store_finish fin = finish_for(*t.k, rank);
  fin.group = g;
  fin.grouped = true;
  std::vector<uint8_t*> slots;
  std::vector<size_t> positions;
  for (const auto& c : res.chunks) {
    const size_t rel = t.want[g][c.position];
    slots.push_back(c.slot);
    positions.push_back(c.position);
    if (g == 0) {
      add_chunk(fin, *t.k, *t.hashes, *t.names, t.begin + rel, cs);
    } else {
      fin.hashes.push_back(group_hash((*t.hashes)[t.begin + rel], g));
      add_l2_name(fin, *t.names, t.begin + rel); // LMCache: same hash, object group g
      fin.tokens.emplace_back();
      fin.parents.emplace_back();
    }
  }
  if (!fin.hashes.empty()) {
    t.fins.push_back(std::move(fin));
    t.slots.push_back(std::move(slots));
    t.positions.push_back(std::move(positions));
  }
  if (--t.left == 0)
    t.reserved(self, part->t);
}

void group_not_reserved(self_ptr self, const part_ptr& part, const caf::error& err) {
  auto& t = *part->t;
  t.ok = false;
  t.why = "group " + std::to_string(part->g) + ": " + from_caf_error(err).detail;
  if (--t.left == 0)
    t.reserved(self, part->t);
}

/// Reserves, for each group g, chunks `t->want[g]` (within the range of
/// t->k, from chunk t->begin) in the store, then goes on to step
/// t->reserved once every group answered. Chunks already stored are left out.
void reserve_groups(self_ptr self, const hybrid_ptr& t) {
  auto& st = self->state;
  const auto cs = static_cast<size_t>(st.p.chunk_size);
  const auto rank = static_cast<int32_t>(*t->k->worker_id);
  t->hashes = std::make_shared<const std::vector<uint64_t>>(key_hashes(*t->k, cs, t->end));
  t->names = std::make_shared<const std::vector<std::string>>(key_l2_names(st.p, *t->k, t->end));
  for (const auto& w : t->want)
    t->left += w.empty() ? 0 : 1;
  if (t->left == 0) {
    t->reserved(self, t);
    return;
  }
  for (uint32_t g = 0; g < t->want.size(); ++g) {
    if (t->want[g].empty())
      continue;
    store_reserve q{t->instance, rank, {}, (*t->groups)[g].format, 0, g};
    for (auto c : t->want[g])
      q.hashes.push_back(group_hash((*t->hashes)[t->begin + c], g));
    ask<store_reserve_reply>(self, st.p.store, std::move(q),
                             std::make_shared<group_part>(group_part{t, g}), group_reserved,
                             group_not_reserved);
  }
}

// -- prepare_store: staging slots -> reserve per group -> hand the slots out ---

/// No slots handed out (the engine then skips the store).
void store_nothing(self_ptr self, const hybrid_ptr& t) {
  reply(self, t->call, encode_reply_prepare_store_groups({}, {}, {}));
}

/// The failure step: nothing is handed out; the session may end.
void store_refused(self_ptr self, const hybrid_ptr& t) {
  store_nothing(self, t);
  prepared(self);
}

void store_groups_reserved(self_ptr self, const hybrid_ptr& tp) {
  auto& st = self->state;
  auto& p = *tp;
  if (!p.ok) {
    KVS_WARN(st.label, "prepare_store (hybrid) refused: {}", p.why);
    finish_groups(self, p.fins, false);
    self->send(st.p.gpu, gpu_stage_give{p.instance, p.offsets});
    store_refused(self, tp);
    return;
  }
  const auto& offsets = p.offsets;
  staged_transfer t;
  t.instance_id = p.instance;
  t.groups = p.groups;
  std::vector<shm_slot_desc> descs;
  std::vector<uint64_t> chunk_indices, group_ids;
  size_t k = 0;
  for (size_t f = 0; f < p.fins.size(); ++f) {
    const auto g = p.fins[f].group;
    const auto& sg = (*p.groups)[g];
    for (size_t i = 0; i < p.slots[f].size(); ++i, ++k) {
      t.offsets.push_back(offsets[k]);
      t.l1.push_back(p.slots[f][i]);
      t.lengths.push_back(sg.slot_bytes);
      descs.push_back({offsets[k], sg.slot_bytes, sg.chunk_shape, sg.dtype});
      chunk_indices.push_back(p.chunk(f, i));
      group_ids.push_back(g);
    }
  }
  std::vector<uint64_t> spare(offsets.begin() + static_cast<ptrdiff_t>(k), offsets.end());
  if (!spare.empty())
    self->send(st.p.gpu, gpu_stage_give{p.instance, std::move(spare)});
  t.group_reserved = std::move(p.fins);
  if (!t.offsets.empty())
    st.staged[p.key] = std::move(t);
  reply(self, p.call, encode_reply_prepare_store_groups(descs, chunk_indices, group_ids));
  prepared(self);
}

void store_slots_taken(self_ptr self, const hybrid_ptr& t, gpu_stage_taken& slots) {
  auto& st = self->state;
  if (slots.offsets.size() < t->total) {
    KVS_WARN(st.label, "instance {}: {} staging slots free for {} group chunks to store "
                       "(cache.engine_driven_slots per group): nothing stored",
             t->instance, slots.offsets.size(), t->total);
    self->send(st.p.gpu, gpu_stage_give{t->instance, std::move(slots.offsets)});
    store_refused(self, t);
    return;
  }
  t->offsets = std::move(slots.offsets);
  t->reserved = store_groups_reserved;
  reserve_groups(self, t);
}

void store_slots_refused(self_ptr self, const hybrid_ptr& t, const caf::error& err) {
  KVS_WARN(self->state.label, "prepare_store refused: {}", from_caf_error(err).detail);
  store_refused(self, t);
}

// -- commit_store: staging -> L1 copy, commit; inline: reserve -> copy in, commit

void commit_copied(self_ptr self, const hybrid_ptr& t, gpu_copy_done&) {
  finish_groups(self, t->staged->group_reserved, true);
  reply(self, t->call, encode_reply_bool(true));
  prepared(self);
}

void commit_copy_failed(self_ptr self, const hybrid_ptr& t, const caf::error& err) {
  KVS_WARN(self->state.label, "commit_store (hybrid) copy failed: {}", from_caf_error(err).detail);
  release_staged(self, *t->staged);
  reply_failed(self, t->call, "commit failed");
  prepared(self);
}

/// The failure step of an inline commit refused before anything was asked.
void commit_refused(self_ptr self, const mp_call& call, const std::string& why) {
  const auto& r = std::get<commit_store_req>(call.request->body);
  KVS_WARN(self->state.label,
           "commit_store of instance {} (hybrid, {} bytes inline) refused: {}", r.instance_id,
           r.cpu_data.size(), why);
  reply_failed(self, call, "commit failed");
}

void commit_groups_reserved(self_ptr self, const hybrid_ptr& tp) {
  auto& p = *tp;
  if (p.ok) {
    // Copy each reserved chunk's tensor (a position in what was asked is
    // the tensor's index) into its L1 slot.
    for (size_t f = 0; f < p.fins.size(); ++f) {
      const auto& eg = (*p.env)[p.fins[f].group];
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

// -- prepare_retrieve: acquire per group -> inline, or staging slots -> copy,
// release -> hand the slots out

void release_tickets(self_ptr self, hybrid& p) {
  for (auto& a : p.acquired)
    if (a)
      self->send(self->state.p.store, store_release{a->ticket});
}

/// The failure step: LMCache's failed PrepareRetrieveResponse; the session
/// may end.
void retrieve_missed(self_ptr self, const hybrid_ptr& t, const std::string& why) {
  KVS_WARN(self->state.label, "prepare_retrieve (hybrid) refused: {}", why);
  reply_failed(self, t->call, "prepare_retrieve refused");
  prepared(self);
}

void retrieve_groups_copied(self_ptr self, const hybrid_ptr& t, gpu_copy_done&) {
  auto& st = self->state;
  release_tickets(self, *t); // copied out: no pin while the engine reads
  const auto& r = std::get<prepare_retrieve_req>(t->call.request->body);
  staged_transfer s;
  s.instance_id = t->instance;
  s.offsets = t->offsets;
  st.staged[session_state::staged_key{t->instance, r.key.start, r.key.end, false}] = std::move(s);
  reply(self, t->call,
        encode_reply_prepare_retrieve_groups(t->descs, t->group_ids, t->chunk_indices));
  prepared(self);
}

void retrieve_groups_copy_failed(self_ptr self, const hybrid_ptr& t, const caf::error& err) {
  release_tickets(self, *t);
  self->send(self->state.p.gpu, gpu_stage_give{t->instance, t->offsets});
  retrieve_missed(self, t, "copy into the staging slots failed: " + from_caf_error(err).detail);
}

void retrieve_slots_taken(self_ptr self, const hybrid_ptr& tp, gpu_stage_taken& slots) {
  auto& st = self->state;
  auto& p = *tp;
  if (slots.offsets.size() < p.total) {
    release_tickets(self, p);
    self->send(st.p.gpu, gpu_stage_give{p.instance, std::move(slots.offsets)});
    retrieve_missed(self, tp,
                    std::to_string(p.total) + " staging slots needed for every group's chunks "
                    "(cache.engine_driven_slots per group)");
    return;
  }
  gpu_stage_copy cp{p.instance, false, slots.offsets, {}, false};
  size_t k = 0;
  for (size_t g = 0; g < p.groups->size(); ++g) {
    const auto& sg = (*p.groups)[g];
    for (size_t i = 0; i < p.acquired[g]->slots.size(); ++i, ++k) {
      cp.l1.push_back(p.acquired[g]->slots[i]);
      cp.lengths.push_back(sg.slot_bytes);
      p.descs.push_back({slots.offsets[k], sg.slot_bytes, sg.chunk_shape, sg.dtype});
      p.group_ids.push_back(g);
      p.chunk_indices.push_back(p.first[g] + i);
    }
  }
  p.offsets = slots.offsets;
  ask<gpu_copy_done>(self, st.p.gpu, std::move(cp), tp, retrieve_groups_copied,
                     retrieve_groups_copy_failed);
}

void retrieve_slots_refused(self_ptr self, const hybrid_ptr& t, const caf::error& err) {
  release_tickets(self, *t);
  retrieve_missed(self, t, from_caf_error(err).detail);
}

/// Every group's chunks are pinned: answer inline, or copy them into
/// staging slots and answer with those.
void retrieve_acquired(self_ptr self, const hybrid_ptr& tp) {
  auto& st = self->state;
  auto& p = *tp;
  const auto& groups = p.groups;
  for (size_t g = 0; g < groups->size() && p.ok; ++g)
    if (p.acquired[g]->slot_bytes < (*groups)[g].slot_bytes) {
      p.ok = false;
      p.why = "group " + std::to_string(g) + "'s chunks hold "
              + std::to_string(p.acquired[g]->slot_bytes) + " bytes, the instance's "
              + std::to_string((*groups)[g].slot_bytes);
    }
  if (!p.ok) {
    release_tickets(self, p);
    retrieve_missed(self, tp, p.why);
    return;
  }
  if (p.inline_data) {
    // Copied out of L1 into the reply while the tickets pin the chunks.
    std::vector<envelope_group_out> out;
    for (size_t g = 0; g < groups->size(); ++g) {
      const auto& sg = (*groups)[g];
      envelope_group_out eg{sg.dtype, sg.chunk_shape, p.first[g], {}};
      for (auto* slot : p.acquired[g]->slots)
        eg.datas.emplace_back(reinterpret_cast<const char*>(slot), sg.slot_bytes);
      out.push_back(std::move(eg));
    }
    std::string data;
    encode_grouped_tensor_envelope(data, out);
    release_tickets(self, p);
    reply(self, p.call, encode_reply_prepare_retrieve_inline(data));
    prepared(self);
    return;
  }
  // Staging slots, one per group's chunk, as LMCache's ShmTransferStrategy.
  p.total = 0;
  for (auto& a : p.acquired)
    p.total += static_cast<uint32_t>(a->slots.size());
  ask<gpu_stage_taken>(self, st.p.gpu, gpu_stage_take{p.instance, p.total, true}, tp,
                       retrieve_slots_taken, retrieve_slots_refused);
}

void group_acquired(self_ptr self, const part_ptr& part, store_acquire_reply& acq) {
  auto& t = *part->t;
  t.acquired[part->g] = std::move(acq);
  if (--t.left == 0)
    retrieve_acquired(self, part->t);
}

void group_not_acquired(self_ptr self, const part_ptr& part, const caf::error& err) {
  auto& t = *part->t;
  if (t.ok) {
    t.ok = false;
    t.why = "group " + std::to_string(part->g) + ": " + from_caf_error(err).detail;
  }
  if (--t.left == 0)
    retrieve_acquired(self, part->t);
}

} // namespace

// -- The entry steps (session_engine_driven.cpp calls them) --------------------

void prepare_store_groups(self_ptr self, const mp_call& call, const gpu_stage_taken& taken,
                          const session_state::staged_key& key, size_t begin, size_t end) {
  auto& st = self->state;
  const auto& r = std::get<prepare_store_req>(call.request->body);
  const auto& groups = *taken.groups;
  const size_t n_chunks = end - begin;
  auto refuse = [&](const std::string& why) {
    KVS_WARN(st.label, "prepare_store of instance {} refused: {}", r.instance_id, why);
    self->send(st.p.bridge, make_failure_reply(call, "prepare_store: " + why));
  };
  // LMCache: one list per registered group, each within the key's chunks.
  if (!r.skipped_chunks.empty()) {
    if (r.skipped_chunks.size() != groups.size()) {
      refuse("skipped_chunks has " + std::to_string(r.skipped_chunks.size()) + " groups for "
             + std::to_string(groups.size()) + " registered groups");
      return;
    }
    for (size_t g = 0; g < groups.size(); ++g)
      for (auto idx : r.skipped_chunks[g])
        if (idx < 0 || static_cast<uint64_t>(idx) >= n_chunks) {
          refuse("skipped_chunks for group " + std::to_string(g) + " is outside its "
                 + std::to_string(n_chunks) + " chunks");
          return;
        }
  }
  if (taken.inline_data) {
    // LMCache's inline strategy reserves nothing here: the data comes with the commit.
    staged_transfer t;
    t.instance_id = r.instance_id;
    t.groups = taken.groups;
    st.staged[key] = std::move(t);
    reply(self, call, encode_reply_prepare_store({}, {}));
    return;
  }
  // Over the staging pool: a slot for each group's chunk that is neither
  // skipped (all-null) nor stored already.
  auto t = start_hybrid(call, taken.groups);
  t->key = key;
  t->k = &r.key;
  t->instance = r.instance_id;
  t->begin = begin;
  t->end = end;
  t->want.resize(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
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
  if (t->total == 0) {
    store_nothing(self, t);
    return;
  }
  ++st.preparing;
  ask<gpu_stage_taken>(self, st.p.gpu, gpu_stage_take{r.instance_id, t->total, true}, t,
                       store_slots_taken, store_slots_refused);
}

void commit_store_groups(self_ptr self, const mp_call& call, staged_transfer s) {
  auto& st = self->state;
  const auto& r = std::get<commit_store_req>(call.request->body);
  if (r.cpu_data.empty() && !s.offsets.empty()) {
    // The engine wrote the staging slots: copy each into its L1 slot, commit.
    auto t = start_hybrid(call, s.groups);
    t->staged = std::make_shared<staged_transfer>(std::move(s));
    auto& staged = *t->staged;
    gpu_stage_copy cp{staged.instance_id, true, staged.offsets, staged.l1, true, staged.lengths};
    staged.offsets.clear(); // the copy gives them back
    ++st.preparing;
    ask<gpu_copy_done>(self, st.p.gpu, std::move(cp), t, commit_copied, commit_copy_failed);
    return;
  }
  // Inline data (an inline instance, or a worker of a pool instance that
  // sent its chunks inline): what a prepare held is given back first.
  release_staged(self, s);
  const auto cs = static_cast<size_t>(st.p.chunk_size);
  auto [begin, end] = chunk_range(r.key, cs);
  if (!r.key.worker_id || end <= begin) {
    commit_refused(self, call, !r.key.worker_id ? "no worker_id" : "no full chunk in range");
    return;
  }
  if (r.cpu_data.empty()) {
    commit_refused(self, call, "no data and no prepared staging slots");
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
  for (size_t g = 0; g < groups.size(); ++g)
    if (auto why = mismatch((*decoded)[g], groups[g], g, end - begin); !why.empty()) {
      commit_refused(self, call, why);
      return;
    }
  auto t = start_hybrid(call, s.groups);
  t->k = &r.key;
  t->instance = r.instance_id;
  t->begin = begin;
  t->end = end;
  // The tensors are views into the request's data, which `call` keeps alive.
  t->env = std::make_shared<const std::vector<envelope_group>>(std::move(decoded.value()));
  t->want.resize(t->env->size());
  for (size_t g = 0; g < t->env->size(); ++g)
    t->want[g].assign((*t->env)[g].chunk_indices.begin(), (*t->env)[g].chunk_indices.end());
  t->reserved = commit_groups_reserved;
  ++st.preparing;
  reserve_groups(self, t);
}

void prepare_retrieve_groups(self_ptr self, const mp_call& call, const gpu_stage_taken& taken,
                             size_t begin, size_t end) {
  auto& st = self->state;
  const auto& r = std::get<prepare_retrieve_req>(call.request->body);
  const auto cs = static_cast<size_t>(st.p.chunk_size);
  const auto hashes = key_hashes(r.key, cs, end);
  const size_t n = end - begin;
  const auto& groups = *taken.groups;
  auto t = start_hybrid(call, taken.groups);
  t->instance = r.instance_id;
  t->inline_data = taken.inline_data;
  t->begin = begin;
  t->end = end;
  t->left = groups.size();
  t->acquired.resize(groups.size());
  for (uint32_t g = 0; g < groups.size(); ++g) {
    // LMCache serves a windowed group's last `window` chunks of the range only.
    const int32_t w = groups[g].window;
    const size_t first = w < 0 ? 0 : n - std::min(n, static_cast<size_t>(w));
    t->first.push_back(first);
    store_acquire q{group_session(st.p.request_id, g), static_cast<int32_t>(*r.key.worker_id),
                    begin + first, {}, groups[g].format};
    for (size_t c = begin + first; c < end; ++c)
      q.hashes.push_back(group_hash(hashes[c], g));
    ask<store_acquire_reply>(self, st.p.store, std::move(q),
                             std::make_shared<group_part>(group_part{t, g}), group_acquired,
                             group_not_acquired);
  }
}

} // namespace kvs::session_steps
