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

/// Per-group reservations of a hybrid store, between the store's replies
/// and what is done with them.
struct pending_reserve {
  size_t left = 0;
  bool ok = true;
  std::string why;
  /// What was asked: per group, chunks within the range, ascending.
  std::vector<std::vector<size_t>> want;
  std::vector<store_finish> fins;              ///< one per group with reserved chunks
  std::vector<std::vector<uint8_t*>> slots;    ///< per fins entry: the L1 slots
  std::vector<std::vector<size_t>> positions;  ///< per fins entry: index into want[group]

  size_t chunk(size_t f, size_t i) const { return want[fins[f].group][positions[f][i]]; }
};

/// Reserves, for each group g, chunks `want[g]` (within the range of `key`,
/// which `call` holds, from chunk `begin`) in the store, then calls
/// done(pending) once every group answered. Chunks already stored are left out.
template <class Done>
void reserve_groups(self_ptr self, const mp_call& call, const cache_key& key, int64_t instance,
                    const stage_groups& groups, std::vector<std::vector<size_t>> want,
                    size_t begin, size_t end, Done done) {
  auto& st = self->state;
  const auto cs = static_cast<size_t>(st.p.chunk_size);
  const auto rank = static_cast<int32_t>(*key.worker_id);
  auto hashes = std::make_shared<const std::vector<uint64_t>>(key_hashes(key, cs, end));
  auto names = std::make_shared<const std::vector<std::string>>(key_l2_names(st.p, key, end));
  auto pend = std::make_shared<pending_reserve>();
  pend->want = std::move(want);
  for (const auto& w : pend->want)
    pend->left += w.empty() ? 0 : 1;
  if (pend->left == 0) {
    done(*pend);
    return;
  }
  const cache_key* k = &key; // in the request `call` keeps alive
  for (uint32_t g = 0; g < pend->want.size(); ++g) {
    if (pend->want[g].empty())
      continue;
    store_reserve q{instance, rank, {}, (*groups)[g].format, 0, g};
    for (auto c : pend->want[g])
      q.hashes.push_back(group_hash((*hashes)[begin + c], g));
    self->request(st.p.store, caf::infinite, std::move(q))
      .then(
        [self, call, k, hashes, names, pend, done, g, begin, rank](store_reserve_reply& res) {
          const auto cs = static_cast<size_t>(self->state.p.chunk_size);
          store_finish fin = finish_for(*k, rank);
          fin.group = g;
          fin.grouped = true;
          std::vector<uint8_t*> slots;
          std::vector<size_t> positions;
          for (const auto& c : res.chunks) {
            const size_t rel = pend->want[g][c.position];
            slots.push_back(c.slot);
            positions.push_back(c.position);
            if (g == 0) {
              add_chunk(fin, *k, *hashes, *names, begin + rel, cs);
            } else {
              fin.hashes.push_back(group_hash((*hashes)[begin + rel], g));
              add_l2_name(fin, *names, begin + rel); // LMCache: same hash, object group g
              fin.tokens.emplace_back();
              fin.parents.emplace_back();
            }
          }
          if (!fin.hashes.empty()) {
            pend->fins.push_back(std::move(fin));
            pend->slots.push_back(std::move(slots));
            pend->positions.push_back(std::move(positions));
          }
          if (--pend->left == 0)
            done(*pend);
        },
        [pend, done, g](caf::error& err) {
          pend->ok = false;
          pend->why = "group " + std::to_string(g) + ": " + from_caf_error(err).detail;
          if (--pend->left == 0)
            done(*pend);
        });
  }
}

/// A hybrid prepare_retrieve between its acquires and its answer.
struct pending_retrieve {
  size_t left = 0;
  bool ok = true;
  std::string why;
  std::vector<std::optional<store_acquire_reply>> acquired;
  std::vector<size_t> first; ///< each group's first chunk, within the range
};

void release_tickets(self_ptr self, pending_retrieve& p) {
  for (auto& a : p.acquired)
    if (a)
      self->send(self->state.p.store, store_release{a->ticket});
}

/// Every group's chunks are pinned: answer inline, or copy them into
/// staging slots and answer with those.
void settle_retrieve(self_ptr self, const mp_call& call, const stage_groups& groups,
                     bool inline_data, std::shared_ptr<pending_retrieve> pend) {
  auto& st = self->state;
  auto& p = *pend;
  for (size_t g = 0; g < groups->size() && p.ok; ++g)
    if (p.acquired[g]->slot_bytes < (*groups)[g].slot_bytes) {
      p.ok = false;
      p.why = "group " + std::to_string(g) + "'s chunks hold "
              + std::to_string(p.acquired[g]->slot_bytes) + " bytes, the instance's "
              + std::to_string((*groups)[g].slot_bytes);
    }
  auto miss = [self, call](const std::string& why) {
    KVS_WARN(self->state.label, "prepare_retrieve (hybrid) refused: {}", why);
    reply_failed(self, call, "prepare_retrieve refused");
    prepared(self);
  };
  if (!p.ok) {
    release_tickets(self, p);
    miss(p.why);
    return;
  }
  if (inline_data) {
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
    reply(self, call, encode_reply_prepare_retrieve_inline(data));
    prepared(self);
    return;
  }
  // Staging slots, one per group's chunk, as LMCache's ShmTransferStrategy.
  uint32_t total = 0;
  for (auto& a : p.acquired)
    total += static_cast<uint32_t>(a->slots.size());
  const int64_t instance = std::get<prepare_retrieve_req>(call.request->body).instance_id;
  self->request(st.p.gpu, caf::infinite, gpu_stage_take{instance, total, true})
    .then(
      [self, call, pend, groups, total, instance, miss](gpu_stage_taken& slots) {
        auto& st = self->state;
        auto& p = *pend;
        if (slots.offsets.size() < total) {
          release_tickets(self, p);
          self->send(st.p.gpu, gpu_stage_give{instance, std::move(slots.offsets)});
          miss(std::to_string(total) + " staging slots needed for every group's chunks "
               "(cache.engine_driven_slots per group)");
          return;
        }
        gpu_stage_copy cp{instance, false, slots.offsets, {}, false};
        std::vector<shm_slot_desc> descs;
        std::vector<uint64_t> group_ids, chunk_indices;
        size_t k = 0;
        for (size_t g = 0; g < groups->size(); ++g) {
          const auto& sg = (*groups)[g];
          for (size_t i = 0; i < p.acquired[g]->slots.size(); ++i, ++k) {
            cp.l1.push_back(p.acquired[g]->slots[i]);
            cp.lengths.push_back(sg.slot_bytes);
            descs.push_back({slots.offsets[k], sg.slot_bytes, sg.chunk_shape, sg.dtype});
            group_ids.push_back(g);
            chunk_indices.push_back(p.first[g] + i);
          }
        }
        auto offsets = slots.offsets;
        self->request(st.p.gpu, caf::infinite, std::move(cp))
          .then(
            [self, call, pend, offsets, instance, descs, group_ids, chunk_indices](gpu_copy_done&) {
              auto& st = self->state;
              release_tickets(self, *pend); // copied out: no pin while the engine reads
              const auto& r = std::get<prepare_retrieve_req>(call.request->body);
              staged_transfer t;
              t.instance_id = instance;
              t.offsets = offsets;
              st.staged[session_state::staged_key{instance, r.key.start, r.key.end, false}] =
                std::move(t);
              reply(self, call, encode_reply_prepare_retrieve_groups(descs, group_ids, chunk_indices));
              prepared(self);
            },
            [self, pend, offsets, instance, miss](caf::error& err) {
              release_tickets(self, *pend);
              self->send(self->state.p.gpu, gpu_stage_give{instance, offsets});
              miss("copy into the staging slots failed: " + from_caf_error(err).detail);
            });
      },
      [self, pend, miss](caf::error& err) {
        release_tickets(self, *pend);
        miss(from_caf_error(err).detail);
      });
}

} // namespace

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
  std::vector<std::vector<size_t>> want(groups.size());
  uint32_t total = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<bool> skip(n_chunks, false);
    if (!r.skipped_chunks.empty())
      for (auto idx : r.skipped_chunks[g])
        skip[static_cast<size_t>(idx)] = true; // checked above: within the range
    for (size_t c = 0; c < n_chunks; ++c)
      if (!skip[c]) {
        want[g].push_back(c);
        ++total;
      }
  }
  auto empty = [self, call] { reply(self, call, encode_reply_prepare_store_groups({}, {}, {})); };
  if (total == 0) {
    empty();
    return;
  }
  ++st.preparing;
  const auto groups_ptr = taken.groups;
  self->request(st.p.gpu, caf::infinite, gpu_stage_take{r.instance_id, total, true})
    .then(
      [self, call, key, groups_ptr, want, total, begin, end, empty](gpu_stage_taken& slots) mutable {
        auto& st = self->state;
        const auto& r = std::get<prepare_store_req>(call.request->body);
        if (slots.offsets.size() < total) {
          KVS_WARN(st.label, "instance {}: {} staging slots free for {} group chunks to store "
                             "(cache.engine_driven_slots per group): nothing stored",
                   r.instance_id, slots.offsets.size(), total);
          self->send(st.p.gpu, gpu_stage_give{r.instance_id, std::move(slots.offsets)});
          empty();
          prepared(self);
          return;
        }
        auto offsets = std::move(slots.offsets);
        reserve_groups(
          self, call, r.key, r.instance_id, groups_ptr, std::move(want), begin, end,
          [self, call, key, groups_ptr, offsets, empty](pending_reserve& p) {
            auto& st = self->state;
            const auto& r = std::get<prepare_store_req>(call.request->body);
            if (!p.ok) {
              KVS_WARN(st.label, "prepare_store (hybrid) refused: {}", p.why);
              finish_groups(self, p.fins, false);
              self->send(st.p.gpu, gpu_stage_give{r.instance_id, offsets});
              empty();
              prepared(self);
              return;
            }
            staged_transfer t;
            t.instance_id = r.instance_id;
            t.groups = groups_ptr;
            std::vector<shm_slot_desc> descs;
            std::vector<uint64_t> chunk_indices, group_ids;
            size_t k = 0;
            for (size_t f = 0; f < p.fins.size(); ++f) {
              const auto g = p.fins[f].group;
              const auto& sg = (*groups_ptr)[g];
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
              self->send(st.p.gpu, gpu_stage_give{r.instance_id, std::move(spare)});
            t.group_reserved = std::move(p.fins);
            if (!t.offsets.empty())
              st.staged[key] = std::move(t);
            reply(self, call, encode_reply_prepare_store_groups(descs, chunk_indices, group_ids));
            prepared(self);
          });
      },
      [self, empty](caf::error& err) {
        KVS_WARN(self->state.label, "prepare_store refused: {}", from_caf_error(err).detail);
        empty();
        prepared(self);
      });
}

void commit_store_groups(self_ptr self, const mp_call& call, staged_transfer t) {
  auto& st = self->state;
  const auto& r = std::get<commit_store_req>(call.request->body);
  if (r.cpu_data.empty() && !t.offsets.empty()) {
    // The engine wrote the staging slots: copy each into its L1 slot, commit.
    auto staged = std::make_shared<staged_transfer>(std::move(t));
    gpu_stage_copy cp{staged->instance_id, true, staged->offsets, staged->l1, true,
                      staged->lengths};
    staged->offsets.clear(); // the copy gives them back
    ++st.preparing;
    self->request(st.p.gpu, caf::infinite, std::move(cp))
      .then(
        [self, call, staged](gpu_copy_done&) {
          finish_groups(self, staged->group_reserved, true);
          reply(self, call, encode_reply_bool(true));
          prepared(self);
        },
        [self, call, staged](caf::error& err) {
          KVS_WARN(self->state.label, "commit_store (hybrid) copy failed: {}",
                   from_caf_error(err).detail);
          release_staged(self, *staged);
          reply_failed(self, call, "commit failed");
          prepared(self);
        });
    return;
  }
  // Inline data (an inline instance, or a worker of a pool instance that
  // sent its chunks inline): what a prepare held is given back first.
  release_staged(self, t);
  auto fail = [&](const std::string& why) {
    KVS_WARN(st.label, "commit_store of instance {} (hybrid, {} bytes inline) refused: {}",
             r.instance_id, r.cpu_data.size(), why);
    reply_failed(self, call, "commit failed");
  };
  const auto cs = static_cast<size_t>(st.p.chunk_size);
  auto [begin, end] = chunk_range(r.key, cs);
  if (!r.key.worker_id || end <= begin) {
    fail(!r.key.worker_id ? "no worker_id" : "no full chunk in range");
    return;
  }
  if (r.cpu_data.empty()) {
    fail("no data and no prepared staging slots");
    return;
  }
  auto decoded = decode_grouped_tensor_envelope(r.cpu_data);
  if (!decoded) {
    fail(decoded.error_value().detail);
    return;
  }
  const auto& groups = *t.groups;
  if (decoded->size() != groups.size()) {
    fail(std::to_string(decoded->size()) + " groups in the data for " + std::to_string(groups.size())
         + " registered groups");
    return;
  }
  for (size_t g = 0; g < groups.size(); ++g)
    if (auto why = mismatch((*decoded)[g], groups[g], g, end - begin); !why.empty()) {
      fail(why);
      return;
    }
  // The tensors are views into the request's data, which `call` keeps alive.
  auto env = std::make_shared<const std::vector<envelope_group>>(std::move(decoded.value()));
  std::vector<std::vector<size_t>> want(env->size());
  for (size_t g = 0; g < env->size(); ++g)
    want[g].assign((*env)[g].chunk_indices.begin(), (*env)[g].chunk_indices.end());
  ++st.preparing;
  reserve_groups(self, call, r.key, r.instance_id, t.groups, std::move(want), begin, end,
                 [self, call, env](pending_reserve& p) {
                   if (p.ok) {
                     // Copy each reserved chunk's tensor (a position in what
                     // was asked is the tensor's index) into its L1 slot.
                     for (size_t f = 0; f < p.fins.size(); ++f) {
                       const auto& eg = (*env)[p.fins[f].group];
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
                   reply(self, call, encode_reply_bool(ok));
                   prepared(self);
                 });
}

void prepare_retrieve_groups(self_ptr self, const mp_call& call, const gpu_stage_taken& taken,
                             size_t begin, size_t end) {
  auto& st = self->state;
  const auto& r = std::get<prepare_retrieve_req>(call.request->body);
  const auto cs = static_cast<size_t>(st.p.chunk_size);
  const auto hashes = key_hashes(r.key, cs, end);
  const size_t n = end - begin;
  const auto& groups = *taken.groups;
  const auto groups_ptr = taken.groups;
  const bool inline_data = taken.inline_data;
  auto pend = std::make_shared<pending_retrieve>();
  pend->left = groups.size();
  pend->acquired.resize(groups.size());
  for (uint32_t g = 0; g < groups.size(); ++g) {
    // LMCache serves a windowed group's last `window` chunks of the range only.
    const int32_t w = groups[g].window;
    const size_t first = w < 0 ? 0 : n - std::min(n, static_cast<size_t>(w));
    pend->first.push_back(first);
    store_acquire q{group_session(st.p.request_id, g), static_cast<int32_t>(*r.key.worker_id),
                    begin + first, {}, groups[g].format};
    for (size_t c = begin + first; c < end; ++c)
      q.hashes.push_back(group_hash(hashes[c], g));
    self->request(st.p.store, caf::infinite, std::move(q))
      .then(
        [self, call, groups_ptr, inline_data, pend, g](store_acquire_reply& acq) {
          pend->acquired[g] = std::move(acq);
          if (--pend->left == 0)
            settle_retrieve(self, call, groups_ptr, inline_data, pend);
        },
        [self, call, groups_ptr, inline_data, pend, g](caf::error& err) {
          if (pend->ok) {
            pend->ok = false;
            pend->why = "group " + std::to_string(g) + ": " + from_caf_error(err).detail;
          }
          if (--pend->left == 0)
            settle_retrieve(self, call, groups_ptr, inline_data, pend);
        });
  }
}

} // namespace kvs::session_steps
