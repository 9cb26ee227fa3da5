#include "actors/cache/store.hpp"

#include "actors/cache/l1_prefault.hpp"

#include "actors/actor_logging.hpp"
#include "actors/caf_error.hpp"
#include "actors/cache/event_announce.hpp"
#include "actors/cache/store_admin.hpp"
#include "actors/cache/store_objects.hpp"
#include "actors/cache/sweep.hpp"
#include "cache/group_lookup.hpp"
#include "config/config.hpp"
#include "gpu/staging_pool.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"

#include <algorithm>
#include <ctime>
#include <map>

namespace kvs {

namespace {

using self_ptr = store_actor::stateful_pointer<store_state>;

/// Locks and reservations are swept at least this often (lock_ttl/4 below).
constexpr std::chrono::seconds max_lock_sweep_interval{1};

/// Hands a batch of our own events to the configured publisher (if any),
/// through the same bounded queue as the engine's batches.
void announce(self_ptr self, std::vector<kv_event> events) {
  auto& st = self->state;
  announce_events(self, st.p.events, st.p.events_queue, std::move(events), &st.events_dropped);
}

/// Hands records to the subscribe_kv_events log (if the bridge asked).
void record(self_ptr self, std::vector<kv_event_record> records) {
  auto& st = self->state;
  if (records.empty() || !st.records_sink)
    return;
  self->send(st.records_sink, kv_event_records{std::move(records)});
}

uint32_t model_id(store_state& st, const std::string& model) {
  auto [it, added] = st.model_ids.emplace(model, static_cast<uint32_t>(st.models.size()));
  if (added)
    st.models.push_back(model);
  return it->second;
}

/// BlockRemoved for evicted rank-0 chunks (one announcement per prefix hash),
/// and one "removed" record per model.
void announce_removed(self_ptr self, const std::vector<chunk_key>& keys) {
  auto& st = self->state;
  std::vector<kv_event> events;
  std::map<uint32_t, std::vector<uint64_t>> by_model;
  for (auto& k : keys) {
    ++st.evicted;
    st.quota.removed(k);
    st.l1_keys.removed(k);
    if (k.rank != 0)
      continue;
    if (auto a = st.announced.find(k.hash); a != st.announced.end()) {
      st.announce_order.erase(a->second.order);
      st.announced.erase(a);
    }
    block_removed e;
    e.block_hashes.push_back(k.hash);
    e.medium = "CPU";
    events.emplace_back(std::move(e));
    if (auto m = st.chunk_model.find(k.hash); m != st.chunk_model.end()) {
      by_model[m->second].push_back(k.hash);
      st.chunk_model.erase(m);
    }
  }
  announce(self, std::move(events));
  std::vector<kv_event_record> records;
  for (auto& [id, hashes] : by_model) {
    kv_event_record r;
    r.stored = false;
    r.model_name = st.models[id];
    r.block_hashes = std::move(hashes);
    records.push_back(std::move(r));
  }
  record(self, std::move(records));
}

size_t distinct_sizes(const std::unordered_map<int64_t, size_t>& m) {
  std::vector<size_t> v;
  for (auto& [id, b] : m)
    v.push_back(b);
  std::sort(v.begin(), v.end());
  return static_cast<size_t>(std::unique(v.begin(), v.end()) - v.begin());
}

// The store's handlers, one per message (store() below lists them).

/// How many groups' sessions a request's locks are held under.
uint32_t groups_of(const store_state& st, const std::string& session) {
  if (st.session_groups.empty()) // no hybrid model looked up: skip hashing the id
    return 1;
  auto i = st.session_groups.find(session);
  return i == st.session_groups.end() ? 1 : i->second;
}

/// LOOKUP: locks the prefix found in L1 (and asks L2 for the rest); a
/// hybrid model's by its groups' windows (cache/group_lookup.hpp).
caf::result<uint64_t> on_lookup(self_ptr self, store_lookup& q) {
  auto& st = self->state;
  auto now = cache_clock::now();
  // Only with a hybrid instance registered: the key copies the model name.
  if (auto gm = st.group_models.empty() ? st.group_models.end()
                                        : st.group_models.find({q.model, q.world_size});
      gm != st.group_models.end()) {
    // A hybrid model: every group's in-window part of the prefix, from L1,
    // then what L2 holds of each group's part of a longer one.
    const auto& windows = gm->second.groups.windows;
    for (uint32_t g = static_cast<uint32_t>(windows.size()); g < groups_of(st, q.session); ++g)
      st.ledger->end_session(group_session(q.session, g)); // a model that had more groups
    st.session_groups[q.session] = static_cast<uint32_t>(windows.size());
    if (!st.p.l2.fetches.empty()) // L2 hook: an older prefetch of it takes no locks
      st.p.l2.fetches.erase(q.session);
    const auto hit = lookup_groups(*st.index, *st.ledger, q.session, q.hashes, windows,
                                   q.world_size, q.readers_per_key, now, q.begin);
    if (l2_wants_group_prefetch(self, q, hit, gm->second.groups)) // L2 hook
      return l2_prefetch_groups(self, std::move(q), gm->second.groups);
    return static_cast<uint64_t>(hit);
  }
  // LMCache 0.5.7: the engine holds the chunks below key.start. They
  // keep their recency; the lookup (locks, L2) covers only the rest,
  // and the hit counts them (q.begin + what is found after them).
  const size_t base = std::min(q.begin, q.hashes.size());
  if (base > 0) {
    for (size_t c = 0; c < base; ++c)
      for (int32_t r = 0; r < std::max(q.world_size, 1); ++r)
        st.index->touch(chunk_key{q.hashes[c], r});
    q.hashes.erase(q.hashes.begin(), q.hashes.begin() + static_cast<ptrdiff_t>(base));
  }
  q.begin = base;
  auto hits = st.ledger->lookup(q.session, q.hashes.data(), q.hashes.size(), q.world_size,
                                q.readers_per_key, now, base);
  if (l2_wants_prefetch(self, q, hits)) // L2 hook: the rest of the prefix from L2
    return l2_prefetch(self, std::move(q), hits);
  return static_cast<uint64_t>(base + hits);
}

/// FREE_LOOKUP_LOCKS: gives back a request's lookup locks on a range.
void on_release_range(self_ptr self, store_release_range& q) {
  auto& ledger = *self->state.ledger;
  for (uint32_t g = 0, n = groups_of(self->state, q.session); g < n; ++g) {
    auto session = group_session(q.session, g);
    if (q.rank)
      ledger.release_rank(session, *q.rank, q.begin, q.end, cache_clock::now(), UINT32_MAX);
    else
      ledger.release_range(session, q.begin, q.end, cache_clock::now());
  }
}

/// END_SESSION: every lock the request still holds.
uint64_t on_end_session(self_ptr self, store_end_session& q) {
  auto& st = self->state;
  st.p.l2.fetches.erase(q.session); // L2 hook: a late prefetch takes no locks
  uint64_t released = 0;
  for (uint32_t g = 0, n = groups_of(st, q.session); g < n; ++g)
    released += st.ledger->end_session(group_session(q.session, g));
  if (!st.session_groups.empty())
    st.session_groups.erase(q.session);
  return released;
}

/// STORE, step 1: a slot for each chunk not in L1 yet (evicting to make room).
caf::result<store_reserve_reply> on_reserve(self_ptr self, store_reserve& q) {
  auto& st = self->state;
  store_reserve_reply out;
  auto refuse = [&](error e) {
    ++st.refused;
    KVS_WARN(st.label, "store of {} chunks on rank {} refused: {}", q.hashes.size(), q.rank,
             e.detail);
    return to_caf_error(e);
  };
  auto sized = st.chunk_bytes.find(q.instance_id);
  if (sized == st.chunk_bytes.end())
    return refuse({"not_registered",
                   "instance " + std::to_string(q.instance_id) + " is not registered"});
  out.slot_bytes = sized->second;
  if (q.group != 0) {
    auto gb = st.group_bytes.find(q.instance_id);
    if (gb == st.group_bytes.end() || q.group >= gb->second.size())
      return refuse({"not_registered", "instance " + std::to_string(q.instance_id)
                                         + " registered no group " + std::to_string(q.group)});
    out.slot_bytes = gb->second[q.group];
  }
  auto now = cache_clock::now();
  std::vector<chunk_key> reserved;
  const auto ar = st.arenas.find(q.instance_id);
  const arena_id arena = ar == st.arenas.end() ? anonymous_arena : ar->second;
  out.in_place = arena != anonymous_arena;
  for (size_t i = 0; i < q.hashes.size(); ++i) {
    if (q.max_chunks != 0 && reserved.size() >= q.max_chunks)
      break;
    chunk_key k{q.hashes[i], q.rank};
    auto r = st.index->reserve(k, out.slot_bytes, now, q.format, arena);
    announce_removed(self, r.evicted);
    if (r.status == reserve_status::already_present)
      continue;
    if (r.status == reserve_status::no_space) {
      for (auto& rk : reserved)
        st.index->abort(rk);
      const auto& why = st.p.pool->arena_error();
      return refuse({"no_space", std::string{"no space in L1: "} + to_string(r.reason)
                                   + (r.detail.empty() ? "" : " (" + r.detail + ")")
                                   + (arena == anonymous_arena || why.empty() ? ""
                                                                              : "; " + why)});
    }
    reserved.push_back(k);
    out.chunks.push_back(reserved_chunk{i, reinterpret_cast<uint8_t*>(r.data), r.offset});
  }
  nudge_l1_prefault(st.p.l1_prefault, *st.p.pool, st.prefault_nudged);
  // The arena's next extent, once this answer is out (the reservation
  // takes ~50 ms per 256 MiB): the engine gathers into these slots
  // meanwhile, and its next store finds room reserved and faulted in.
  if (arena != anonymous_arena && st.p.arena_prefault)
    self->send(self, prefault_atom_v, static_cast<uint32_t>(arena));
  return out;
}

/// Claims arena `a`'s next extent ahead of need and has it faulted in
/// (slot_pool::claim_ahead: free space only, nothing evicted).
void claim_ahead(self_ptr self, uint32_t a) {
  auto& st = self->state;
  if (!st.p.arena_prefault)
    return;
  if (auto extent = st.p.pool->claim_ahead(a))
    caf::anon_send(st.p.arena_prefault, prefault_atom_v, static_cast<uint64_t>(extent->first),
                   static_cast<uint64_t>(extent->second));
}

/// STORE, step 2: commits (or aborts) the reserved chunks once copied; announces them.
void on_finish(self_ptr self, store_finish& f) {
  auto& st = self->state;
  std::vector<kv_event> events;
  std::vector<kv_event_record> records;
  for (size_t i = 0; i < f.hashes.size(); ++i) {
    chunk_key k{f.hashes[i], f.rank};
    if (!f.commit) {
      st.index->abort(k);
      continue;
    }
    if (!st.index->commit(k))
      continue;
    ++st.stored;
    quota_committed(st, k, f.salt);
    if (st.l1_keys.reporting())
      if (auto e = st.index->find(k))
        st.l1_keys.stored(k, f.model, f.salt, f.world_size, f.group,
                          i < f.l2_names.size() ? f.l2_names[i] : std::string{}, e->bytes);
    l2_stage(self, f, i); // L2 hook: write-through
    if (f.group != 0)
      continue; // a hybrid model's other groups: group 0's chunk is announced
    if (f.rank != 0)
      continue;
    st.chunk_model[k.hash] = model_id(st, f.model);
    kv_event_record rec;
    rec.model_name = f.model;
    rec.block_hashes.push_back(k.hash);
    rec.parent_block_hash = f.parents[i];
    rec.token_ids = f.tokens[i];
    records.push_back(std::move(rec));
    if (st.p.events) {
      auto [a, fresh] = st.announced.try_emplace(k.hash);
      if (!fresh) // not expected: a chunk is committed once while in L1
        st.announce_order.erase(a->second.order);
      a->second.order = st.next_order++;
      a->second.parent = f.parents[i];
      a->second.tokens = f.tokens[i];
      st.announce_order[a->second.order] = k.hash;
    }
    events.push_back(
      chunk_stored(k.hash, f.parents[i], std::move(f.tokens[i]), st.p.chunk_size, "CPU"));
  }
  l2_flush(self); // L2 hook
  announce(self, std::move(events));
  record(self, std::move(records));
  if (f.commit && !f.hashes.empty())
    quota_enforce(self, {f.salt}); // after the BlockStored: a removal follows its store
}

/// RETRIEVE, step 1: pins the chunks the request's lookup found, for the copy.
caf::result<store_acquire_reply> on_acquire(self_ptr self, store_acquire& q) {
  auto& st = self->state;
  store_acquire_reply out;
  out.slot_bytes = SIZE_MAX;
  store_state::read_ticket t;
  t.session = q.session;
  t.rank = q.rank;
  t.begin = q.begin;
  t.end = q.begin + q.hashes.size();
  auto now = cache_clock::now();
  // Like LMCache 0.5.6 (its read needs the request's own lookup locks):
  // a RETRIEVE reads only chunks a LOOKUP of the same request found.
  if (auto found = st.ledger->locked_end(q.session); found < t.end) {
    // What the lookup did lock in this range is given back all the same.
    st.ledger->release_rank(q.session, q.rank, t.begin, t.end, now);
    return to_caf_error(
      "not_looked_up",
      found == 0 ? "no lookup of this request found chunks to retrieve"
                 : "chunks " + std::to_string(found) + ".." + std::to_string(t.end - 1)
                     + " are past the " + std::to_string(found) + " its lookup found");
  }
  const auto ar = q.instance_id < 0 ? st.arenas.end() : st.arenas.find(q.instance_id);
  const bool has_arena = ar != st.arenas.end();
  for (size_t i = 0; i < q.hashes.size(); ++i) {
    chunk_key k{q.hashes[i], q.rank};
    auto e = st.index->find(k);
    std::optional<lock_token> tok;
    if (e && e->state == entry_state::committed && e->format != q.format) {
      for (auto& l : t.locks)
        st.index->unlock(l);
      st.ledger->release_rank(q.session, q.rank, t.begin, t.end, now);
      return to_caf_error("other_format",
                          "chunk " + std::to_string(q.begin + i) + " of rank "
                            + std::to_string(q.rank) + " was stored in another chunk format ("
                            + (e->format == chunk_format_single_plane ? "one plane, engine-driven"
                                                                      : "KV_2LTD")
                            + ")");
    }
    if (e && e->state == entry_state::committed)
      tok = st.index->lock(k, 1, now);
    if (!tok) {
      for (auto& l : t.locks)
        st.index->unlock(l);
      // The lookup's locks on this range are consumed all the same.
      st.ledger->release_rank(q.session, q.rank, t.begin, t.end, now);
      return to_caf_error("not_in_l1", "chunk " + std::to_string(q.begin + i) + " of rank "
                                         + std::to_string(q.rank) + " is not in L1");
    }
    t.locks.push_back(*tok);
    st.quota.touched(k); // read: the most recently used of its salt's chunks
    st.l1_keys.read(k);
    out.slots.push_back(reinterpret_cast<uint8_t*>(e->data));
    out.slot_bytes = std::min(out.slot_bytes, e->bytes);
    if (has_arena) {
      out.in_place.push_back(e->arena == ar->second ? 1 : 0);
      out.offsets.push_back(e->offset);
    }
  }
  if (out.slots.empty())
    out.slot_bytes = 0;
  out.ticket = st.next_ticket++;
  st.tickets.emplace(out.ticket, std::move(t));
  return out;
}

/// RETRIEVE, step 2: the copy is over; unpins and consumes the lookup locks.
void on_release_ticket(self_ptr self, store_release& r) {
  auto& st = self->state;
  auto i = st.tickets.find(r.ticket);
  if (i == st.tickets.end())
    return;
  auto now = cache_clock::now();
  for (auto& l : i->second.locks)
    st.index->unlock(l);
  st.ledger->release_rank(i->second.session, i->second.rank, i->second.begin, i->second.end,
                          now);
  st.tickets.erase(i);
}

/// Drops a multi-group instance's groups; its model's lookups go back to
/// one group once no instance of it is registered.
void forget_groups(store_state& st, int64_t instance) {
  st.group_bytes.erase(instance);
  auto m = st.group_instance_model.find(instance);
  if (m == st.group_instance_model.end())
    return;
  if (auto gm = st.group_models.find(m->second); gm != st.group_models.end()) {
    gm->second.instances.erase(instance);
    if (gm->second.instances.empty())
      st.group_models.erase(gm);
  }
  st.group_instance_model.erase(m);
}

/// An instance's arena goes when it unregisters or registers again: its
/// name is unlinked, its chunks stay (read by copy) until evicted.
void close_arena(self_ptr self, int64_t instance) {
  auto& st = self->state;
  auto i = st.arenas.find(instance);
  if (i == st.arenas.end())
    return;
  KVS_INFO(st.label, "instance {}'s L1 arena {} closed ({} extents still hold its chunks)",
           instance, st.p.pool->arena_name(i->second), st.p.pool->arena_extents(i->second));
  st.p.pool->close_arena(i->second);
  st.arenas.erase(i);
}

/// An engine-driven instance writing in place: an L1 arena of its own. One
/// that cannot have one (a chunk larger than an extent, /dev/shm refusing)
/// gets none, and the registry falls back to a staging object.
void open_arena(self_ptr self, const store_configure& c, store_configure_reply& out) {
  auto& st = self->state;
  auto& pool = *st.p.pool;
  uint64_t largest = c.slot_bytes;
  for (auto b : c.group_slot_bytes)
    largest = std::max<uint64_t>(largest, b);
  if (pool.stride_for(largest) > pool.extent_bytes()) {
    KVS_WARN(st.label, "instance {}: chunks of {} bytes exceed an L1 arena extent of {} bytes: "
                       "it stages through a copy instead of writing L1 in place",
             c.instance_id, largest, pool.extent_bytes());
    return;
  }
  auto a = pool.open_arena(staging_pool_name(c.instance_id), c.owner_uid, c.arena_extra_bytes);
  if (!a) {
    KVS_WARN(st.label, "instance {}: no L1 arena ({}): it stages through a copy instead",
             c.instance_id, a.error_value().detail);
    return;
  }
  st.arenas[c.instance_id] = *a;
  // Its first extent ahead of its first store.
  if (st.p.arena_prefault)
    self->send(self, prefault_atom_v, static_cast<uint32_t>(*a));
  out.arena_name = pool.arena_name(*a);
  out.arena_size = pool.arena_size(*a);
  out.arena_origin = pool.mapped_bytes();
}

/// REGISTER: the slot size of an instance (0: it unregistered).
caf::result<store_configure_reply> on_configure(self_ptr self, store_configure& c) {
  // Every instance gets slots of its own chunk size from the one L1
  // region (slot_pool.hpp); chunks it stored before re-registering with
  // another layout keep theirs (a RETRIEVE checks the size it gets).
  auto& st = self->state;
  store_configure_reply out;
  auto usable = st.p.pool->capacity_bytes();
  forget_groups(st, c.instance_id);
  close_arena(self, c.instance_id);
  for (auto b : c.group_slot_bytes)
    if (st.p.pool->stride_for(b) == 0 || st.p.pool->stride_for(b) > usable)
      return to_caf_error("l1_too_small", "a group's chunks of " + std::to_string(b)
                                            + " bytes per rank do not fit in the L1 region of "
                                            + std::to_string(usable) + " bytes (cache.l1_size)");
  if (c.slot_bytes == 0 || c.model.empty())
    st.instance_model.erase(c.instance_id);
  else
    st.instance_model[c.instance_id] = {c.model, c.world_size};
  if (c.slot_bytes == 0) {
    st.chunk_bytes.erase(c.instance_id);
  } else if (st.p.pool->stride_for(c.slot_bytes) == 0
             || st.p.pool->stride_for(c.slot_bytes) > usable) {
    return to_caf_error("l1_too_small", "chunks of " + std::to_string(c.slot_bytes)
                                          + " bytes per rank do not fit in the L1 region of "
                                          + std::to_string(usable) + " bytes (cache.l1_size)");
  } else {
    st.chunk_bytes[c.instance_id] = c.slot_bytes;
    out.slot_bytes = c.slot_bytes;
    if (!c.group_slot_bytes.empty()) {
      st.group_bytes[c.instance_id] = {c.group_slot_bytes.begin(), c.group_slot_bytes.end()};
      st.group_instance_model[c.instance_id] = {c.model, c.world_size};
      auto& gm = st.group_models[{c.model, c.world_size}];
      if (gm.groups.windows != c.group_windows && !gm.instances.empty())
        KVS_WARN(st.label, "model {} (world_size {}) registered again with other groups: its "
                           "lookups follow instance {}'s", c.model, c.world_size, c.instance_id);
      gm.groups = {c.group_windows, c.group_slot_bytes, c.group_formats};
      gm.instances.insert(c.instance_id);
    }
    if (c.arena)
      open_arena(self, c, out);
    // "N slots": how many chunks of this size alone would fill L1.
    KVS_INFO(st.label, "chunk slots of {} KiB: {} slots in L1 for instance {} ({} instances, "
                       "{} chunk sizes share L1)",
             c.slot_bytes >> 10, usable / st.p.pool->stride_for(c.slot_bytes), c.instance_id,
             st.chunk_bytes.size(), distinct_sizes(st.chunk_bytes));
  }
  return out;
}

/// The rank the store announces on published an AllBlocksCleared: routers
/// dropped L1's chunks with the engine's blocks. Every rank-0 chunk L1 still
/// holds is announced again, oldest first (a parent before its child), in
/// batches of reannounce_batch_events through the rank's relay queue (a
/// full queue drops a batch and counts it, as for any announcement).
void on_cleared(self_ptr self) {
  auto& st = self->state;
  const uint64_t dropped_before = st.events_dropped;
  reannounce_batches batches{self, st.p.events, st.p.events_queue, &st.events_dropped};
  for (const auto& [order, hash] : st.announce_order) {
    const auto& a = st.announced.at(hash);
    batches.add(chunk_stored(hash, a.parent, a.tokens, st.p.chunk_size, "CPU"));
  }
  batches.flush();
  st.reannounced += st.announce_order.size();
  if (!st.announce_order.empty())
    KVS_INFO(st.label, "AllBlocksCleared on the events rank: {} chunks of L1 announced again{}",
             st.announce_order.size(), dropped_suffix(dropped_before, st.events_dropped));
}

/// LMCache's CLEAR op: drops every unlocked chunk, as the HTTP clear does.
void on_clear(self_ptr self, mp_call& call) {
  clear_l1(self, "LMCache CLEAR");
  self->send(self->state.bridge, make_reply(call, std::nullopt));
}

/// Lock TTLs are enforced here, whatever sessions do (idle sessions are
/// ended by the session router, which releases their locks).
void on_sweep(self_ptr self, std::chrono::nanoseconds expiry) {
  auto& st = self->state;
  auto now = cache_clock::now();
  auto locks = st.index->expire_locks(now);
  auto stale = st.index->expire_reservations(now);
  // Sessions the ledger ended by their idle TTL take their group count along.
  for (auto i = st.session_groups.begin(); i != st.session_groups.end();)
    i = st.ledger->has_session(i->first) ? std::next(i) : st.session_groups.erase(i);
  if (locks + stale.size() > 0)
    KVS_WARN(st.label, "expired: {} read locks past lock_ttl, {} reservations never "
                       "committed", locks, stale.size());
  self->delayed_send(self, expiry, sweep_atom_v);
}

} // namespace

stats_snapshot snapshot(const store_state& st) {
  auto x = st.index->stats();
  stats_snapshot s;
  s.actor = st.label;
  auto ratio = x.capacity_bytes ? static_cast<double>(x.slot_bytes_used)
                                    / static_cast<double>(x.capacity_bytes)
                                : 0.0;
  s.gauge("chunks", "kvsidecar_cache_chunks", x.chunks)
    .gauge("reserved", "kvsidecar_cache_reserved_chunks", x.reserved)
    .gauge("used_bytes", "kvsidecar_cache_l1_used_bytes", x.slot_bytes_used)
    .gauge("capacity_bytes", "kvsidecar_cache_l1_capacity_bytes", x.capacity_bytes)
    .gauge("", "kvsidecar_cache_l1_usage_ratio", ratio)
    .gauge("locks", "kvsidecar_cache_locks", x.outstanding_readers)
    .gauge("locked_chunks", "kvsidecar_cache_locked_chunks", x.locked_entries)
    .gauge("sessions", "kvsidecar_cache_lock_sessions", st.ledger->session_count())
    .counter("lookups", "kvsidecar_cache_lookups_total", x.lookups)
    .counter("hits", "kvsidecar_cache_lookup_hit_chunks_total", x.hit_chunks, "tier", "l1")
    .counter("misses", "kvsidecar_cache_lookup_miss_chunks_total", x.miss_chunks)
    .counter("stored", "kvsidecar_cache_stored_chunks_total", st.stored)
    .counter("evicted", "kvsidecar_cache_evictions_total", st.evicted, "tier", "l1")
    .counter("refused", "kvsidecar_cache_store_refused_total", st.refused)
    .counter("reannounced", "kvsidecar_cache_reannounced_chunks_total", st.reannounced)
    .counter("events_dropped", "kvsidecar_cache_events_dropped_total", st.events_dropped)
    .gauge("arenas", "kvsidecar_cache_l1_arenas", st.arenas.size())
    .counter("arena_heals", "kvsidecar_cache_l1_arena_heals_total", arena_heal_count());
  if (st.p.l2.actor) {
    auto& l2 = st.p.l2;
    s.counter("", "kvsidecar_cache_l2_prefetches_total", l2.prefetches)
      .counter("", "kvsidecar_cache_lookup_hit_chunks_total", l2.prefetched_chunks, "tier", "l2")
      .counter("", "kvsidecar_cache_l2_prefetch_failures_total", l2.prefetch_failures)
      .counter("", "kvsidecar_cache_l2_write_skipped_total", l2.queued_skipped)
      .gauge("", "kvsidecar_cache_l2_queued_bytes", l2.queue->in_flight());
  }
  quota_snapshot(st, s);
  return s;
}

void announce_evicted(self_ptr self, const std::vector<chunk_key>& keys) {
  announce_removed(self, keys);
}

store_actor::behavior_type store(store_actor::stateful_pointer<store_state> self,
                                 store_params params) {
  auto& st = self->state;
  st.p = std::move(params);
  st.l1_keys = store_l1_keys{st.p.coordinator};
  st.label = log::label(store_state::name, "", self->id());
  index_options io;
  io.evict_high = st.p.evict_high;
  io.evict_low = st.p.evict_low;
  io.lock_ttl = st.p.lock_ttl;
  st.index = std::make_unique<chunk_index>(*st.p.pool, io);
  st.ledger = std::make_unique<lock_ledger>(*st.index, ledger_options{});
  quota_init(st);
  log_lifecycle(self, st.label,
                fmt::format("started: L1 pool of {} MiB, evict between {:.0f}% and {:.0f}%, "
                            "lock_ttl {}",
                            st.p.pool->mapped_bytes() >> 20, st.p.evict_high * 100,
                            st.p.evict_low * 100, to_string(st.p.lock_ttl)));
  if (st.p.l1_prefault)
    self->link_to(st.p.l1_prefault); // the store's exit ends the fault-ahead
  if (st.p.arena_prefault)
    self->link_to(st.p.arena_prefault);
  arm_stats(self, st.p.stats_interval);
  // The lock and reservation sweep (on_sweep).
  auto expiry = sweep_interval(st.p.lock_ttl, max_lock_sweep_interval);
  self->delayed_send(self, expiry, sweep_atom_v);
  return {
    [self](store_lookup& q) -> caf::result<uint64_t> { return on_lookup(self, q); },
    [self](store_release_range& q) { on_release_range(self, q); },
    [self](store_end_session& q) -> uint64_t { return on_end_session(self, q); },
    [self](store_reserve& q) -> caf::result<store_reserve_reply> { return on_reserve(self, q); },
    [self](store_finish& f) { on_finish(self, f); },
    [self](store_acquire& q) -> caf::result<store_acquire_reply> { return on_acquire(self, q); },
    [self](store_release& r) { on_release_ticket(self, r); },
    [self](store_configure& c) -> caf::result<store_configure_reply> {
      return on_configure(self, c);
    },
    [self](mp_call& call) { on_clear(self, call); },
    [self](cleared_atom) { on_cleared(self); },
    [self](store_status_query) -> store_status { return status_of(self->state); },
    [self](store_clear_l1) -> uint64_t { return clear_l1(self, "HTTP control plane"); },
    [self](store_quota_list& q) -> store_quota_reply { return on_quota(self, q); },
    [self](store_quota_get& q) -> store_quota_reply { return on_quota(self, q); },
    [self](store_quota_set& q) -> store_quota_reply { return on_quota(self, q); },
    [self](store_quota_delete& q) -> store_quota_reply { return on_quota(self, q); },
    [self](store_list_objects& q) -> store_objects_page { return list_objects(self, q); },
    [self](store_delete_objects& q) -> store_deleted { return delete_objects(self, q); },
    [self](store_lock_chunks& q) -> store_locked_chunks { return lock_chunks(self, q); },
    [self](store_unlock_chunks& q) { unlock_chunks(self, q); },
    [self](bridge_atom, engine_bridge_actor& bridge) { self->state.bridge = std::move(bridge); },
    [self](record_atom, engine_bridge_actor& sink) { self->state.records_sink = std::move(sink); },
    [self, expiry](sweep_atom) { on_sweep(self, expiry); },
    [self](prefault_atom, uint32_t arena) { claim_ahead(self, arena); },
    [self](stats_atom) {
      l2_log_stats(self); // L2 hook
      log_stats(self, snapshot(self->state), self->state.p.stats_interval);
    },
    [self](metrics_atom, const caf::actor& to) { send_snapshot(self, to, snapshot(self->state)); },
  };
}

} // namespace kvs
