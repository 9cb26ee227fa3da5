#include "actors/cache/store_l2.hpp"

#include "actors/actor_logging.hpp"
#include "actors/cache/store.hpp"
#include "actors/cache/store_admin.hpp"

#include "cache/chunk_hash.hpp"
#include "cache/group_lookup.hpp"

#include <cstring>
#include <functional>

namespace kvs {

void l2_stage(store_self self, const store_finish& f, size_t i) {
  auto& st = self->state;
  auto& l2 = st.p.l2;
  if (!l2.actor)
    return;
  auto e = st.index->find(chunk_key{f.hashes[i], f.rank});
  // L2 objects are named by model and byte size only (l2/object_header.hpp),
  // and a fetched chunk becomes a KV_2LTD one: a one-plane engine-driven
  // chunk stays in L1. A hybrid model's groups are fetched back in the
  // formats its registration gives them (l2_prefetch_groups), one-plane too.
  if (!e || (e->format != chunk_format_kv_2ltd && !f.grouped))
    return;
  if (!l2.queue->admit(static_cast<int64_t>(e->bytes))) {
    ++l2.queued_skipped;
    return;
  }
  auto& w = l2.pending;
  if (w.hashes.empty()) {
    w.model = f.model;
    w.salt = f.salt;
    w.rank = f.rank;
    w.quiet = f.group != 0;
    w.group = f.group;
    w.world_size = f.world_size;
  }
  // Every write batch is one model and rank; its chunks share one byte size.
  w.layout = e->bytes;
  w.hashes.push_back(f.hashes[i]);
  if (!f.l2_names.empty()) { // l2.format = "lmcache": kept parallel to hashes
    w.names.resize(w.hashes.size() - 1);
    w.names.push_back(i < f.l2_names.size() ? f.l2_names[i] : std::string{});
  }
  w.bytes.emplace_back(reinterpret_cast<const char*>(e->data), e->bytes);
  if (f.rank == 0 && f.group == 0 && i < f.tokens.size()) {
    w.tokens.push_back(f.tokens[i]);
    w.parents.push_back(i < f.parents.size() ? f.parents[i] : std::nullopt);
  }
  w.queued_bytes += e->bytes;
}

void l2_flush(store_self self) {
  auto& l2 = self->state.p.l2;
  if (!l2.actor || l2.pending.hashes.empty())
    return;
  self->send(l2.actor, std::exchange(l2.pending, l2_write{}));
}

bool l2_wants_prefetch(store_self self, const store_lookup& q, uint64_t l1_hits) {
  auto& st = self->state;
  return st.p.l2.actor && !st.chunk_bytes.empty() && l1_hits < q.hashes.size();
}

namespace {

/// A LOOKUP waits at most this long for L2 (a hung Redis); then it is
/// answered with what L1 had.
constexpr std::chrono::seconds l2_prefetch_timeout{30};

/// The layout fingerprint a prefetch asks L2 for: the chunk byte size the
/// instances registered for the lookup's (model, world size) agree on, else
/// the one every registered instance has (objects of another size are
/// misses); with several sizes, 0: the model fingerprint and the object's
/// own size check guard it (l2/object_header.hpp), and l2.format =
/// "lmcache", whose objects carry no header, takes nothing.
uint64_t lookup_layout(const store_state& st, const store_lookup& q) {
  size_t mine = 0, only = 0;
  bool mine_agree = true, all_agree = true;
  for (auto& [id, bytes] : st.chunk_bytes) {
    all_agree = all_agree && (only == 0 || bytes == only);
    only = bytes;
    auto m = st.instance_model.find(id);
    if (m != st.instance_model.end() && m->second.first == q.model
        && m->second.second == q.world_size) {
      mine_agree = mine_agree && (mine == 0 || bytes == mine);
      mine = bytes;
    }
  }
  if (mine != 0)
    return mine_agree ? mine : 0;
  return all_agree ? only : 0;
}

/// Copies the fetched prefix of `hashes` (the L1 keys the fetch asked for,
/// in its order) into L1 slots of `format` (reserve, copy, commit); stops at
/// the first chunk that does not fit, or (with `expect_bytes`) whose payload
/// is not that long: an object whose header names the layout but carries
/// another size (another writer of a shared Redis) never becomes a short L1
/// entry. Shards already in L1 are left as they are. Each chunk loaded is
/// charged to `salt`'s quota as a stored one is (cache/salt_quota), and
/// reported to the coordinator under LMCache's key, names[c] (chunk c's
/// hash; l2.format = "lmcache"), as a stored one is (store_coordinator.hpp).
struct l1_load_names {
  const std::string& model;
  const std::vector<std::string>& names; ///< parallel to the fetched chunks; may be shorter
  uint32_t group = 0;
};
void load_into_l1(store_self self, const uint64_t* hashes, int32_t world_size,
                  l2_fetch_reply& r, const std::string& salt, const l1_load_names& n,
                  uint8_t format = chunk_format_kv_2ltd, size_t expect_bytes = 0) {
  auto& st = self->state;
  auto world = static_cast<size_t>(std::max(world_size, 1));
  auto now = cache_clock::now();
  for (size_t c = 0; c < r.chunks; ++c) {
    for (size_t rank = 0; rank < world; ++rank) {
      chunk_key k{hashes[c], static_cast<int32_t>(rank)};
      auto& bytes = r.bytes[c * world + rank];
      size_t skip = r.skip[c * world + rank];
      size_t payload = bytes.size() - skip;
      if (expect_bytes != 0 && payload != expect_bytes)
        return;
      auto res = st.index->reserve(k, payload, now, format);
      announce_evicted(self, res.evicted);
      if (res.status == reserve_status::already_present)
        continue;
      if (res.status != reserve_status::reserved)
        return;
      std::memcpy(res.data, bytes.data() + skip, payload);
      st.index->commit(k);
      quota_committed(st, k, salt);
      if (st.l1_keys.reporting())
        st.l1_keys.stored(k, n.model, salt, world_size, n.group,
                          c < n.names.size() ? n.names[c] : std::string{}, payload);
      ++st.p.l2.prefetched_chunks;
    }
  }
}

} // namespace

caf::typed_response_promise<uint64_t> l2_prefetch(store_self self, store_lookup q,
                                                  uint64_t l1_hits) {
  auto& st = self->state;
  auto rp = self->make_response_promise<uint64_t>();
  auto gen = st.p.l2.next_fetch++;
  st.p.l2.fetches[q.session] = gen;
  ++st.p.l2.prefetches;
  l2_fetch f;
  f.model = q.model;
  f.salt = q.salt;
  f.layout = lookup_layout(st, q);
  f.world_size = q.world_size;
  f.hashes.assign(q.hashes.begin() + static_cast<ptrdiff_t>(l1_hits), q.hashes.end());
  if (l1_hits < q.l2_names.size())
    f.names.assign(q.l2_names.begin() + static_cast<ptrdiff_t>(l1_hits), q.l2_names.end());
  f.tokens = q.tokens; // announces chunks another writer put in L2 (lmcache format)
  f.first_chunk = l1_hits;
  if (l1_hits > 0)
    f.parent = q.hashes[l1_hits - 1];
  const uint64_t layout = f.layout; // an object of this layout must be this long
  // The session's L1 locks stay held while L2 answers; the relock below
  // replaces them with the longer prefix in one step.
  auto current = [self, gen](const std::string& session) {
    auto& fetches = self->state.p.l2.fetches;
    auto i = fetches.find(session);
    if (i == fetches.end() || i->second != gen)
      return false;
    fetches.erase(i);
    return true;
  };
  // High priority: a prefetch goes ahead of queued write-throughs.
  self->request<caf::message_priority::high>(st.p.l2.actor, l2_prefetch_timeout, std::move(f))
    .then(
      [self, q, l1_hits, rp, current, layout](l2_fetch_reply& r) mutable {
        auto& st = self->state;
        if (r.chunks > 0) {
          const std::vector<std::string> names(
            q.l2_names.begin() + static_cast<ptrdiff_t>(std::min(l1_hits, q.l2_names.size())),
            q.l2_names.end());
          load_into_l1(self, q.hashes.data() + l1_hits, q.world_size, r, q.salt,
                       {q.model, names, 0}, chunk_format_kv_2ltd, layout);
          // The bytes are in L1 now: their buffers go back for the next fetch.
          self->send(st.p.l2.actor, recycle_atom_v, std::move(r));
        }
        if (!current(q.session)) {
          rp.deliver(uint64_t{0}); // ended or superseded: nobody reads this
          return;
        }
        rp.deliver(static_cast<uint64_t>(
          q.begin + st.ledger->lookup(q.session, q.hashes.data(), q.hashes.size(), q.world_size,
                                      q.readers_per_key, cache_clock::now(), q.begin)));
      },
      [self, q, l1_hits, rp, current](caf::error&) mutable {
        ++self->state.p.l2.prefetch_failures;
        current(q.session);
        rp.deliver(q.begin + l1_hits); // what L1 had, still locked
      });
  return rp;
}

bool l2_wants_group_prefetch(store_self self, const store_lookup& q, uint64_t l1_hit,
                             const model_groups& gm) {
  return self->state.p.l2.actor && l1_hit < q.hashes.size() && !gm.bytes.empty()
         && gm.bytes.size() == gm.windows.size() && gm.formats.size() == gm.windows.size();
}

namespace {

/// One hybrid LOOKUP's prefetch in flight: its request, the model's groups
/// as registered when it began, and the fetches of the current phase.
struct group_prefetch {
  store_lookup q;
  model_groups groups;
  caf::typed_response_promise<uint64_t> rp;
  uint64_t gen = 0;
  size_t left = 0; ///< fetches of this phase not answered yet
};
using group_prefetch_ptr = std::shared_ptr<group_prefetch>;

/// Still the session's newest lookup (END_SESSION or a later LOOKUP of it
/// drops this one)?
bool still_current(const store_state& st, const group_prefetch& p) {
  auto i = st.p.l2.fetches.find(p.q.session);
  return i != st.p.l2.fetches.end() && i->second == p.gen;
}

/// Asks L2 for each group's chunks in `want` (group -> chunk indices, in
/// order; one fetch per group, of the group's layout) and loads what comes
/// back into L1 in the group's format; `then` runs once every fetch is
/// answered (an error counts as nothing found).
void fetch_groups(store_self self, const group_prefetch_ptr& p,
                  std::vector<std::pair<uint32_t, std::vector<size_t>>> want,
                  std::function<void()> then) {
  auto& st = self->state;
  p->left = 0;
  for (const auto& [g, chunks] : want)
    p->left += chunks.empty() ? 0 : 1;
  if (p->left == 0) {
    then();
    return;
  }
  for (auto& [g, chunks] : want) {
    if (chunks.empty())
      continue;
    l2_fetch f;
    f.model = p->q.model;
    f.salt = p->q.salt;
    f.layout = p->groups.bytes[g];
    f.world_size = p->q.world_size;
    f.group = g;
    for (auto c : chunks) {
      f.hashes.push_back(group_hash(p->q.hashes[c], g));
      if (!p->q.l2_names.empty()) // LMCache: the prefix's hash, object group g
        f.names.push_back(c < p->q.l2_names.size() ? p->q.l2_names[c] : std::string{});
    }
    auto keys = std::make_shared<std::vector<uint64_t>>(f.hashes);
    auto names = std::make_shared<std::vector<std::string>>(f.names);
    const auto group = static_cast<uint32_t>(g);
    const uint8_t format = p->groups.formats[g];
    const size_t bytes = p->groups.bytes[g];
    self->request<caf::message_priority::high>(st.p.l2.actor, l2_prefetch_timeout, std::move(f))
      .then(
        [self, p, keys, names, group, format, bytes, then](l2_fetch_reply& r) {
          if (r.chunks > 0) {
            load_into_l1(self, keys->data(), p->q.world_size, r, p->q.salt,
                         {p->q.model, *names, group}, format, bytes);
            self->send(self->state.p.l2.actor, recycle_atom_v, std::move(r));
          }
          if (--p->left == 0)
            then();
        },
        [self, p, then](caf::error&) {
          ++self->state.p.l2.prefetch_failures;
          if (--p->left == 0)
            then();
        });
  }
}

/// The lookup again over L1, now holding what L2 had: every group's
/// in-window chunks relocked, the hit delivered.
void finish_group_prefetch(store_self self, const group_prefetch_ptr& p) {
  auto& st = self->state;
  if (!still_current(st, *p)) {
    p->rp.deliver(uint64_t{0}); // ended or superseded: nobody reads this
    return;
  }
  st.p.l2.fetches.erase(p->q.session);
  p->rp.deliver(static_cast<uint64_t>(
    lookup_groups(*st.index, *st.ledger, p->q.session, p->q.hashes, p->groups.windows,
                  p->q.world_size, p->q.readers_per_key, cache_clock::now(), p->q.begin)));
}

} // namespace

caf::typed_response_promise<uint64_t> l2_prefetch_groups(store_self self, store_lookup q,
                                                         const model_groups& gm) {
  auto& st = self->state;
  auto p = std::make_shared<group_prefetch>();
  p->q = std::move(q);
  p->groups = gm;
  p->rp = self->make_response_promise<uint64_t>();
  p->gen = st.p.l2.next_fetch++;
  st.p.l2.fetches[p->q.session] = p->gen;
  ++st.p.l2.prefetches;
  const auto& windows = p->groups.windows;
  const size_t n = p->q.hashes.size();
  // Phase 1: every full-attention group's chunks after its L1 run (they
  // bound the hit). Phase 2: each windowed group's window ending where the
  // shortest full-attention run now ends (the whole prefix without one).
  std::vector<std::pair<uint32_t, std::vector<size_t>>> full;
  for (uint32_t g = 0; g < windows.size(); ++g)
    if (windows[g] < 0) {
      auto from = group_run_end(*st.index, p->q.hashes, g, p->q.world_size, p->q.begin);
      full.emplace_back(g, group_chunks_missing(*st.index, p->q.hashes, g, from, n,
                                                p->q.world_size, p->q.begin));
    }
  fetch_groups(self, p, std::move(full), [self, p] {
    auto& st = self->state;
    if (!still_current(st, *p)) {
      finish_group_prefetch(self, p);
      return;
    }
    const auto& windows = p->groups.windows;
    size_t bound = p->q.hashes.size();
    for (uint32_t g = 0; g < windows.size(); ++g)
      if (windows[g] < 0)
        bound = std::min(bound, group_run_end(*st.index, p->q.hashes, g, p->q.world_size,
                                              p->q.begin));
    std::vector<std::pair<uint32_t, std::vector<size_t>>> windowed;
    for (uint32_t g = 0; g < windows.size(); ++g)
      if (windows[g] >= 0) {
        const size_t w = std::min<size_t>(static_cast<size_t>(windows[g]), bound);
        windowed.emplace_back(g, group_chunks_missing(*st.index, p->q.hashes, g, bound - w,
                                                      bound, p->q.world_size, p->q.begin));
      }
    fetch_groups(self, p, std::move(windowed), [self, p] { finish_group_prefetch(self, p); });
  });
  return p->rp;
}

void l2_log_stats(store_self self) {
  auto& st = self->state;
  auto& l2 = st.p.l2;
  if (!l2.actor)
    return;
  auto line = fmt::format("prefetches={} prefetched_chunks={} prefetch_failures={} "
                          "write_skipped_queue_full={} queued={}B",
                          l2.prefetches, l2.prefetched_chunks, l2.prefetch_failures,
                          l2.queued_skipped, l2.queue->in_flight());
  if (log::stats_line_due(st.label + " l2", line))
    KVS_INFO(st.label, "stats l2: {}", line);
}

} // namespace kvs
