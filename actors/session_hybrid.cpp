#include "actors/session_hybrid.hpp"

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

/// A hybrid commit_store between its reservations and its answer.
struct pending_store {
  size_t left = 0;
  bool ok = true;
  std::string why;
  std::vector<store_finish> fins;
};

/// A hybrid prepare_retrieve between its acquires and its answer.
struct pending_retrieve {
  size_t left = 0;
  bool ok = true;
  std::string why;
  std::vector<std::optional<store_acquire_reply>> acquired;
  std::vector<size_t> first; ///< each group's first chunk, within the range
};

void settle_retrieve(self_ptr self, const mp_call& call, const stage_groups& groups,
                     pending_retrieve& p) {
  auto& st = self->state;
  auto release = [&] {
    for (auto& a : p.acquired)
      if (a)
        self->send(st.p.store, store_release{a->ticket});
  };
  for (size_t g = 0; g < groups->size() && p.ok; ++g)
    if (p.acquired[g]->slot_bytes < (*groups)[g].slot_bytes) {
      p.ok = false;
      p.why = "group " + std::to_string(g) + "'s chunks hold " + std::to_string(p.acquired[g]->slot_bytes)
              + " bytes, the instance's " + std::to_string((*groups)[g].slot_bytes);
    }
  if (!p.ok) {
    release();
    KVS_WARN(st.label, "prepare_retrieve (hybrid) refused: {}", p.why);
    reply(self, call, encode_reply_prepare_retrieve(false, {}));
    prepared(self);
    return;
  }
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
  release();
  reply(self, call, encode_reply_prepare_retrieve_inline(data));
  prepared(self);
}

} // namespace

void prepare_store_groups(self_ptr self, const mp_call& call, const gpu_stage_taken& taken,
                          const session_state::staged_key& key, size_t n_chunks) {
  auto& st = self->state;
  const auto& r = std::get<prepare_store_req>(call.request->body);
  const auto& groups = *taken.groups;
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
  staged_transfer t;
  t.instance_id = r.instance_id;
  t.groups = taken.groups;
  st.staged[key] = std::move(t);
  reply(self, call, encode_reply_prepare_store({}, {}));
}

void commit_store_groups(self_ptr self, const mp_call& call, staged_transfer t) {
  auto& st = self->state;
  const auto& r = std::get<commit_store_req>(call.request->body);
  auto fail = [&](const std::string& why) {
    KVS_WARN(st.label, "commit_store of instance {} (hybrid, {} bytes inline) refused: {}",
             r.instance_id, r.cpu_data.size(), why);
    reply(self, call, encode_reply_bool(false));
  };
  const auto cs = static_cast<size_t>(st.p.chunk_size);
  auto [begin, end] = chunk_range(r.key, cs);
  if (!r.key.worker_id || end <= begin) {
    fail(!r.key.worker_id ? "no worker_id" : "no full chunk in range");
    return;
  }
  if (r.cpu_data.empty()) {
    fail("no data: a hybrid instance's chunks travel inline");
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
  auto hashes = std::make_shared<const std::vector<uint64_t>>(key_hashes(r.key, cs, end));
  auto pend = std::make_shared<pending_store>();
  const auto rank = static_cast<int32_t>(*r.key.worker_id);
  for (const auto& eg : *env)
    pend->left += eg.tensors.empty() ? 0 : 1;
  if (pend->left == 0) {
    reply(self, call, encode_reply_bool(true)); // every chunk was all-null
    return;
  }
  ++st.preparing;
  auto done = [self, call, pend] {
    if (--pend->left > 0)
      return;
    auto& st = self->state;
    if (!pend->ok)
      KVS_WARN(st.label, "commit_store (hybrid) refused: {}", pend->why);
    for (auto& f : pend->fins) {
      f.commit = pend->ok;
      self->send(st.p.store, std::move(f));
    }
    reply(self, call, encode_reply_bool(pend->ok));
    prepared(self);
  };
  for (uint32_t g = 0; g < env->size(); ++g) {
    const auto& eg = (*env)[g];
    if (eg.tensors.empty())
      continue;
    store_reserve q{r.instance_id, rank, {}, groups[g].format, 0, g};
    for (auto idx : eg.chunk_indices)
      q.hashes.push_back(group_hash((*hashes)[begin + static_cast<size_t>(idx)], g));
    self->request(st.p.store, caf::infinite, std::move(q))
      .then(
        [self, call, env, hashes, pend, done, g, begin, bytes = groups[g].slot_bytes,
         rank](store_reserve_reply& res) {
          const auto& r = std::get<commit_store_req>(call.request->body);
          const auto cs = static_cast<size_t>(self->state.p.chunk_size);
          const auto& eg = (*env)[g];
          store_finish fin = finish_for(r.key, rank);
          fin.group = g;
          for (const auto& c : res.chunks) {
            std::memcpy(c.slot, eg.tensors[c.position].data.data(), bytes);
            const size_t abs = begin + static_cast<size_t>(eg.chunk_indices[c.position]);
            if (g == 0) {
              add_chunk(fin, r.key, *hashes, abs, cs);
            } else {
              fin.hashes.push_back(group_hash((*hashes)[abs], g));
              fin.tokens.emplace_back();
              fin.parents.emplace_back();
            }
          }
          if (!fin.hashes.empty())
            pend->fins.push_back(std::move(fin));
          done();
        },
        [pend, done, g](caf::error& err) {
          pend->ok = false;
          pend->why = "group " + std::to_string(g) + ": " + from_caf_error(err).detail;
          done();
        });
  }
}

void prepare_retrieve_groups(self_ptr self, const mp_call& call, const gpu_stage_taken& taken,
                             size_t begin, size_t end) {
  auto& st = self->state;
  const auto& r = std::get<prepare_retrieve_req>(call.request->body);
  const auto cs = static_cast<size_t>(st.p.chunk_size);
  const auto hashes = key_hashes(r.key, cs, end);
  const size_t n = end - begin;
  const auto groups = taken.groups;
  auto pend = std::make_shared<pending_retrieve>();
  pend->left = groups->size();
  pend->acquired.resize(groups->size());
  for (uint32_t g = 0; g < groups->size(); ++g) {
    // LMCache serves a windowed group's last `window` chunks of the range only.
    const int32_t w = (*groups)[g].window;
    const size_t first = w < 0 ? 0 : n - std::min(n, static_cast<size_t>(w));
    pend->first.push_back(first);
    store_acquire q{group_session(st.p.request_id, g), static_cast<int32_t>(*r.key.worker_id),
                    begin + first, {}, (*groups)[g].format};
    for (size_t c = begin + first; c < end; ++c)
      q.hashes.push_back(group_hash(hashes[c], g));
    self->request(st.p.store, caf::infinite, std::move(q))
      .then(
        [self, call, groups, pend, g](store_acquire_reply& acq) {
          pend->acquired[g] = std::move(acq);
          if (--pend->left == 0)
            settle_retrieve(self, call, groups, *pend);
        },
        [self, call, groups, pend, g](caf::error& err) {
          if (pend->ok) {
            pend->ok = false;
            pend->why = "group " + std::to_string(g) + ": " + from_caf_error(err).detail;
          }
          if (--pend->left == 0)
            settle_retrieve(self, call, groups, *pend);
        });
  }
}

} // namespace kvs::session_steps
