#include "actors/cache/l2_tier.hpp"

#include "actors/actor_logging.hpp"
#include "actors/cache/event_announce.hpp"
#include "l2/object_header.hpp"


#include <iterator>
#include <limits>
#include <string_view>


namespace kvs {

namespace {

using self_ptr = l2_actor::stateful_pointer<l2_state>;

/// What names the objects of one message: chunk i of it (whose LMCache
/// hashes are `names`) on `rank`.
struct object_at {
  std::string_view model, salt;
  uint64_t fingerprint = 0; ///< l2_model_fingerprint(model, salt)
  uint64_t layout = 0;
  int32_t world_size = 1;
  uint32_t group = 0;
  const std::vector<std::string>* names = nullptr;

  l2_key key(uint64_t hash, size_t i, int32_t rank) const {
    l2_key k;
    k.hash = hash;
    k.rank = rank;
    k.fingerprint = fingerprint;
    k.layout = layout;
    k.model = model;
    k.salt = salt;
    if (i < names->size())
      k.lmcache_hash = (*names)[i];
    k.group = group;
    k.world_size = world_size;
    return k;
  }
};

/// Logs each backend's faults once (a full disk, a Redis node down); the
/// counters keep the totals.
void note_faults(self_ptr self) {
  for (auto& b : self->state.p.backends)
    for (auto& line : b->new_faults())
      KVS_WARN(self->state.label, "{}", line);
}

/// LMCache's name for the L2 adapter a backend is (CacheEventBatch.backend).
const char* lmcache_backend(const l2_backend& b) {
  return std::string_view{b.tier()} == "redis" ? "resp" : "fs";
}

/// Tells the coordinator (when reporting) that backend `b` now holds, no
/// longer holds, or was read for, the object `name`: one event under
/// LMCache's key, which the name carries in LMCache's format.
void report(const l2_state& st, const l2_backend& b, const std::string& name,
            cache_event_kind kind, uint64_t size = 0) {
  if (!st.p.coordinator)
    return;
  auto f = b.fields_of(name);
  if (!f)
    return;
  cache_event e;
  e.kind = kind;
  e.backend = lmcache_backend(b);
  e.shared = b.shared();
  e.key = std::move(*f);
  e.size_bytes = size;
  st.p.coordinator->offer(std::move(e));
}

/// A buffer to read an L2 value into: one the store handed back, or empty.
std::string take_spare(l2_state& st) {
  if (st.spare.empty())
    return {};
  std::string s = std::move(st.spare.back());
  st.spare.pop_back();
  st.spare_bytes -= s.capacity();
  ++st.buffers_reused;
  s.clear();
  return s;
}

/// Keeps a buffer for the next fetch while the spare memory stays within
/// l2_spare_max_bytes; past it the buffer is freed.
void give_spare(l2_state& st, std::string s) {
  if (s.capacity() < l2_spare_min_bytes || st.spare_bytes + s.capacity() > l2_spare_max_bytes)
    return;
  st.spare_bytes += s.capacity();
  st.spare.push_back(std::move(s));
}

/// BlockRemoved for the announced chunks a backend dropped (LRU eviction,
/// a rejected object, clear, erase), one event per medium.
void announce_removals(self_ptr self) {
  note_faults(self);
  auto& st = self->state;
  std::vector<kv_event> events;
  for (size_t j = 0; j < st.at.size(); ++j) {
    if (st.at[j].removed.empty())
      continue;
    block_removed e;
    e.block_hashes = std::move(st.at[j].removed);
    e.medium = st.p.backends[j]->medium();
    events.emplace_back(std::move(e));
    st.at[j].removed.clear();
  }
  if (!events.empty())
    announce_events(self, st.p.events, st.p.events_queue, std::move(events), &st.events_dropped);
}

/// Remembers chunk i of `w` as announced in backend j under `name` (rank
/// 0), newest last; a chunk written again moves to the end, keeping the
/// other backends' names.
void remember(l2_state& st, const l2_write& w, size_t i, size_t j, const std::string& name) {
  auto it = st.announced_at.find(w.hashes[i]);
  if (it != st.announced_at.end()) {
    st.announced.splice(st.announced.end(), st.announced, it->second);
  } else {
    st.announced.emplace_back();
    st.announced_at[w.hashes[i]] = std::prev(st.announced.end());
    if (st.announced.size() > l2_reannounce_max_chunks) {
      st.announced_at.erase(st.announced.front().hash);
      st.announced.pop_front();
      ++st.forgotten;
    }
  }
  auto& a = st.announced.back();
  a.hash = w.hashes[i];
  a.parent = w.parents[i];
  a.tokens = w.tokens[i];
  a.names.resize(st.p.backends.size());
  a.names[j] = name;
}

/// The events rank published an AllBlocksCleared: routers dropped the
/// DISK and SHARED chunks with the engine's blocks. What the tiers still
/// hold is announced again, oldest first, in batches of
/// reannounce_batch_events; Redis is asked first (one EXISTS round), as its
/// TTL or another node's writes may have evicted a chunk since. Chunks no
/// tier holds any more are forgotten.
void on_cleared(self_ptr self) {
  auto& st = self->state;
  const size_t nb = st.p.backends.size();
  std::vector<uint64_t> per(nb, 0);
  for (size_t j = 0; j < nb; ++j) { // one batch per backend (one EXISTS round for Redis)
    std::vector<std::string> names;
    std::vector<l2_announced*> of;
    for (auto& a : st.announced)
      if (j < a.names.size() && !a.names[j].empty()) {
        names.push_back(a.names[j]);
        of.push_back(&a);
      }
    auto there = names.empty() ? std::vector<bool>{} : st.p.backends[j]->contains(names);
    for (size_t k = 0; k < of.size(); ++k)
      if (!there[k])
        of[k]->names[j].clear();
  }
  note_faults(self);
  uint64_t chunks = 0;
  const uint64_t dropped_before = st.events_dropped;
  reannounce_batches batches{self, st.p.events, st.p.events_queue, &st.events_dropped};
  for (auto it = st.announced.begin(); it != st.announced.end();) {
    bool held = false;
    for (size_t j = 0; j < it->names.size(); ++j)
      if (!it->names[j].empty()) {
        batches.add(chunk_stored(it->hash, it->parent, it->tokens, st.p.chunk_size,
                                 st.p.backends[j]->medium()));
        ++per[j];
        held = true;
      }
    if (held) {
      ++chunks;
      ++it;
    } else { // no backend holds it any more
      st.announced_at.erase(it->hash);
      it = st.announced.erase(it);
    }
  }
  batches.flush();
  std::string media;
  for (size_t j = 0; j < nb; ++j) {
    st.reannounced += per[j];
    media += fmt::format("{}{} {}", media.empty() ? "" : ", ", per[j], st.p.backends[j]->medium());
  }
  if (chunks > 0)
    KVS_INFO(st.label, "AllBlocksCleared on the events rank: {} chunks of L2 announced again "
                       "({}){}",
             chunks, media, dropped_suffix(dropped_before, st.events_dropped));
}

void on_write(self_ptr self, l2_write& w) {
  auto& st = self->state;
  const object_at at{w.model, w.salt, l2_model_fingerprint(w.model, w.salt), w.layout,
                     w.world_size, w.group, &w.names};
  std::vector<l2_key> keys;
  keys.reserve(w.hashes.size());
  for (size_t i = 0; i < w.hashes.size(); ++i)
    keys.push_back(at.key(w.hashes[i], i, w.rank));
  std::vector<kv_event> events;
  for (size_t j = 0; j < st.p.backends.size(); ++j) {
    auto& b = *st.p.backends[j];
    std::vector<std::string> names;
    std::vector<size_t> which; // chunks the backend cannot name are not written there
    names.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i)
      if (auto n = b.name(keys[i])) {
        names.push_back(std::move(*n));
        which.push_back(i);
      }
    std::vector<l2_backend::put_item> items;
    items.reserve(names.size());
    for (size_t k = 0; k < names.size(); ++k)
      items.push_back({&names[k], &keys[which[k]], w.bytes[which[k]]});
    auto ok = b.put(items);
    for (size_t k = 0; k < ok.size(); ++k) {
      const size_t i = which[k];
      if (ok[k])
        report(st, b, names[k], cache_event_kind::store, w.bytes[i].size());
      if (!ok[k] || w.rank != 0)
        continue;
      if (w.quiet)
        st.at[j].quiet.insert(names[k]);
      else
        st.at[j].announced[names[k]] = w.hashes[i];
      if (i >= w.tokens.size())
        continue;
      if (st.p.events)
        remember(st, w, i, j, names[k]);
      events.push_back(chunk_stored(w.hashes[i], w.parents[i], w.tokens[i], st.p.chunk_size,
                                    b.medium()));
    }
  }
  st.written_chunks += w.hashes.size();
  st.p.queue->release(static_cast<int64_t>(w.queued_bytes));
  announce_events(self, st.p.events, st.p.events_queue, std::move(events), &st.events_dropped);
  announce_removals(self);
}

/// LMCache's format: chunks of a fetch this actor never announced (another
/// writer, an LMCache node, put them in the shared L2) are announced now,
/// with the medium of the backend rank 0's object came from, and remembered
/// as written ones are (announced again after an AllBlocksCleared; their
/// removal announced).
void announce_found(self_ptr self, const l2_fetch& f, size_t chunks,
                    const std::vector<int>& rank0_from, const std::vector<std::string>& rank0_name) {
  auto& st = self->state;
  if (!st.p.announce_found || !st.p.events || !f.tokens || f.group != 0)
    return;
  const auto cs = static_cast<size_t>(st.p.chunk_size);
  std::vector<kv_event> events;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t abs = f.first_chunk + c;
    if (cs == 0 || (abs + 1) * cs > f.tokens->size())
      break;
    if (st.announced_at.count(f.hashes[c]) || rank0_from[c] < 0)
      continue;
    l2_write one; // remember() reads a write's fields
    one.hashes = {f.hashes[c]};
    one.parents = {c == 0 ? f.parent : std::optional<uint64_t>{f.hashes[c - 1]}};
    one.tokens.emplace_back(f.tokens->begin() + static_cast<ptrdiff_t>(abs * cs),
                            f.tokens->begin() + static_cast<ptrdiff_t>((abs + 1) * cs));
    const auto j = static_cast<size_t>(rank0_from[c]);
    remember(st, one, 0, j, rank0_name[c]);
    st.at[j].announced[rank0_name[c]] = f.hashes[c];
    ++st.found_announced;
    events.push_back(chunk_stored(one.hashes[0], one.parents[0], std::move(one.tokens[0]),
                                  st.p.chunk_size, st.p.backends[j]->medium()));
  }
  announce_events(self, st.p.events, st.p.events_queue, std::move(events), &st.events_dropped);
}

l2_fetch_reply on_fetch(self_ptr self, l2_fetch& f) {
  auto& st = self->state;
  l2_fetch_reply out;
  auto world = static_cast<size_t>(std::max(f.world_size, 1));
  const object_at at{f.model, f.salt, l2_model_fingerprint(f.model, f.salt), f.layout,
                     f.world_size, f.group, &f.names};
  const size_t n = f.hashes.size(), shards = n * world, nb = st.p.backends.size();
  std::vector<l2_key> keys;
  keys.reserve(shards);
  for (size_t i = 0; i < shards; ++i)
    keys.push_back(at.key(f.hashes[i / world], i / world, static_cast<int32_t>(i % world)));
  // Where each shard is: the first backend (in order) that holds it. A
  // node-local backend is probed now and read below, shard by shard; a
  // shared one is read now, in one round for every shard the backends
  // before it lack, into buffers the store handed back (recycle): a value
  // lands in memory that is already mapped instead of a fresh multi-MiB
  // allocation that page-faults.
  std::vector<int> from(shards, -1);
  std::vector<std::string> name(shards);
  std::vector<std::string> value(shards);
  std::vector<uint32_t> skip(shards, 0);
  std::vector<bool> read(shards, false); // value[i] holds the shard already
  for (size_t j = 0; j < nb; ++j) {
    auto& b = *st.p.backends[j];
    std::vector<std::string> names;
    std::vector<size_t> where;
    for (size_t i = 0; i < shards; ++i)
      if (from[i] < 0)
        if (auto nm = b.name(keys[i])) {
          names.push_back(std::move(*nm));
          where.push_back(i);
        }
    if (names.empty())
      continue;
    if (!b.shared()) {
      auto there = b.contains(names);
      for (size_t k = 0; k < where.size(); ++k)
        if (there[k]) {
          from[where[k]] = static_cast<int>(j);
          name[where[k]] = std::move(names[k]);
        }
      continue;
    }
    std::vector<l2_backend::get_item> items;
    for (size_t k = 0; k < where.size(); ++k)
      items.push_back({&names[k], &keys[where[k]]});
    std::vector<std::string> values(items.size());
    for (auto& v : values)
      v = take_spare(st);
    std::vector<uint32_t> skips;
    auto hit = b.get(items, values, skips);
    for (size_t k = 0; k < where.size(); ++k) {
      const size_t i = where[k];
      if (hit[k]) {
        from[i] = static_cast<int>(j);
        name[i] = std::move(names[k]);
        value[i] = std::move(values[k]);
        skip[i] = skips[k];
        read[i] = true;
      } else {
        give_spare(st, std::move(values[k]));
      }
    }
  }
  // The contiguous prefix of chunks complete on every rank.
  std::vector<int> rank0_from(n, -1);
  std::vector<std::string> rank0_name(n);
  for (size_t c = 0; c < n; ++c) {
    bool present = true; // read nothing of a chunk that some rank lacks everywhere
    for (size_t r = 0; r < world && present; ++r)
      present = from[c * world + r] >= 0;
    if (!present)
      break;
    std::vector<std::string> chunk(world);
    std::vector<uint32_t> chunk_skip(world, 0);
    bool complete = true;
    for (size_t r = 0; r < world && complete; ++r) {
      const size_t i = c * world + r;
      const auto j = static_cast<size_t>(from[i]);
      if (!read[i]) {
        std::vector<std::string> one(1);
        one[0] = take_spare(st);
        std::vector<uint32_t> one_skip;
        auto hit = st.p.backends[j]->get({{&name[i], &keys[i]}}, one, one_skip);
        if (!hit[0]) {
          give_spare(st, std::move(one[0]));
          complete = false;
          continue;
        }
        value[i] = std::move(one[0]);
        skip[i] = one_skip[0];
      }
      chunk[r] = std::move(value[i]);
      chunk_skip[r] = skip[i];
      ++st.at[j].fetched;
      // Read back: LMCache's adapters report each loaded key as accessed.
      report(st, *st.p.backends[j], name[i], cache_event_kind::access);
      if (r == 0) {
        rank0_from[c] = static_cast<int>(j);
        rank0_name[c] = name[i];
      }
    }
    if (!complete) {
      for (auto& s : chunk)
        give_spare(st, std::move(s));
      break;
    }
    for (size_t r = 0; r < world; ++r) {
      out.bytes.push_back(std::move(chunk[r]));
      out.skip.push_back(chunk_skip[r]);
    }
    ++out.chunks;
  }
  for (auto& v : value) // values past the prefix
    give_spare(st, std::move(v));
  announce_found(self, f, out.chunks, rank0_from, rank0_name);
  announce_removals(self); // a rejected file is dropped from the disk
  return out;
}

/// LMCache's L2EvictionController pass with IsolatedLRU: each backend's
/// over-budget salts lose their own oldest objects (BlockRemoved for the
/// announced ones).
void quota_pass(self_ptr self) {
  auto& st = self->state;
  ++st.quota_passes;
  for (auto& b : st.p.backends) {
    auto victims = l2_quota_victims(b->usage(), st.p.quota_limits, st.p.quota_rule);
    if (victims.empty())
      continue;
    const auto n = b->erase(victims);
    st.quota_evicted += n;
    KVS_DEBUG(st.label, "quota pass: {} of {} objects erased from {}", n, victims.size(),
              b->tier());
  }
  announce_removals(self);
}

/// The backend an objects call names by type name ("": the first), or null.
l2_backend* backend_named(l2_state& st, const std::string& adapter) {
  if (st.p.backends.empty())
    return nullptr;
  if (adapter.empty())
    return st.p.backends.front().get();
  for (auto& b : st.p.backends)
    if (b->tier() == adapter)
      return b.get();
  return nullptr;
}

std::string no_adapter(const std::string& adapter) {
  return "no L2 adapter with type_name='" + adapter + "' (GET /config/adapters lists them)";
}

/// GET /cache/objects, tier l2: LMCache's KeyListPage of one backend,
/// oldest first; page_token is where the next page starts in its listing.
l2_objects_page list_objects(self_ptr self, const l2_list_objects& q) {
  l2_objects_page out;
  auto* b = backend_named(self->state, q.adapter);
  if (!b) {
    out.status = 404;
    out.error = no_adapter(q.adapter);
    return out;
  }
  out.adapter = b->tier();
  out.shared = b->shared();
  auto all = b->list(q.offset, std::numeric_limits<uint64_t>::max());
  uint64_t at = q.offset;
  for (auto& o : all.objects) {
    if (out.entries.size() >= q.limit) {
      out.next = at;
      break;
    }
    ++at;
    auto f = b->fields_of(o.name);
    if (!f || (q.model && f->model != *q.model) || (q.salt && f->salt != *q.salt))
      continue;
    out.entries.push_back({std::move(*f), o.bytes});
  }
  return out;
}

/// DELETE /cache/objects, tier l2: the keys' objects leave one backend
/// (BlockRemoved for the announced ones).
l2_deleted delete_objects(self_ptr self, const l2_delete_objects& q) {
  l2_deleted out;
  auto* b = backend_named(self->state, q.adapter);
  if (!b) {
    out.status = 404;
    out.error = no_adapter(q.adapter);
    return out;
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < q.keys.size(); ++i) {
    auto n = b->name_of(q.keys[i]);
    if (!n) {
      out.status = 400;
      out.error = "keys[" + std::to_string(i) + "]: not a key of this L2's objects (l2.format "
                  "= \"kvsidecar\": a 16-hex-digit chunk_hash_hex, object_group_id 0; "
                  "\"lmcache\": LMCache's ObjectKey)";
      return out;
    }
    names.push_back(std::move(*n));
  }
  b->erase(names);
  out.deleted = q.keys.size(); // LMCache's count: the batch (absent keys are no error)
  announce_removals(self);
  return out;
}

} // namespace

stats_snapshot snapshot(const l2_state& st) {
  stats_snapshot s;
  s.actor = st.label;
  s.counter("written", "kvsidecar_l2_written_chunks_total", static_cast<double>(st.written_chunks));
  for (size_t j = 0; j < st.at.size(); ++j) {
    const std::string tier = st.p.backends[j]->tier();
    s.counter("fetched_" + tier, "kvsidecar_l2_fetched_chunks_total",
              static_cast<double>(st.at[j].fetched), "tier", tier);
  }
  size_t quiet = 0;
  for (auto& a : st.at)
    quiet += a.quiet.size();
  s.gauge("queued_bytes", "", static_cast<double>(st.p.queue->in_flight()))
    .counter("events_dropped", "kvsidecar_l2_events_dropped_total",
             static_cast<double>(st.events_dropped))
    .log_only("buffers_reused", static_cast<double>(st.buffers_reused))
    .log_only("spare_bytes", static_cast<double>(st.spare_bytes))
    .counter("clears", "", static_cast<double>(st.clears))
    .counter("reannounce_rounds", "", static_cast<double>(st.reannounce_rounds))
    .counter("reannounced", "kvsidecar_l2_reannounced_chunks_total",
             static_cast<double>(st.reannounced))
    .log_only("remembered", static_cast<double>(st.announced.size()))
    .log_only("forgotten", static_cast<double>(st.forgotten))
    .gauge("disk_quiet", "", static_cast<double>(quiet))
    .counter("found_announced", "", static_cast<double>(st.found_announced))
    .counter("quota_evicted", "kvsidecar_l2_quota_evicted_objects_total",
             static_cast<double>(st.quota_evicted));
  if (st.p.coordinator) {
    auto f = st.p.coordinator->read();
    s.counter("coord_queued", "kvsidecar_coordinator_events_queued_total",
              static_cast<double>(f.queued))
      .counter("coord_dropped", "kvsidecar_coordinator_events_dropped_total",
               static_cast<double>(f.dropped))
      .counter("coord_posted", "kvsidecar_coordinator_events_posted_total",
               static_cast<double>(f.posted))
      .counter("coord_batches", "kvsidecar_coordinator_event_batches_posted_total",
               static_cast<double>(f.batches))
      .counter("coord_failed_posts", "kvsidecar_coordinator_event_posts_failed_total",
               static_cast<double>(f.failed_posts))
      .counter("coord_lost", "kvsidecar_coordinator_events_lost_total",
               static_cast<double>(f.lost));
  }
  for (auto& b : st.p.backends)
    b->figures([&](std::string_view key, std::string_view metric, bool gauge, double value,
                   std::string_view label, std::string_view label_value) {
      if (gauge)
        s.gauge(std::string(key), std::string(metric), value, std::string(label),
                std::string(label_value));
      else
        s.counter(std::string(key), std::string(metric), value, std::string(label),
                  std::string(label_value));
    });
  return s;
}

l2_actor::behavior_type l2_tier(l2_actor::stateful_pointer<l2_state> self, l2_params params) {
  auto& st = self->state;
  st.p = std::move(params);
  st.label = log::label(l2_state::name, "", self->id());
  st.at.resize(st.p.backends.size());
  std::string what;
  for (size_t j = 0; j < st.p.backends.size(); ++j) {
    auto& b = *st.p.backends[j];
    // A removal is announced under the hash this actor announced the object
    // with, or else the hash its name carries (kvsidecar's layout, rank 0:
    // objects found at start-up); never for a quiet one.
    b.on_removed = [self, j](const l2_removed& r) {
      report(self->state, *self->state.p.backends[j], r.name, cache_event_kind::remove);
      auto& at = self->state.at[j];
      if (auto it = at.announced.find(r.name); it != at.announced.end()) {
        at.removed.push_back(it->second);
        at.announced.erase(it);
      } else if (at.quiet.erase(r.name) == 0 && r.fields.hash && r.fields.rank == 0) {
        at.removed.push_back(*r.fields.hash);
      }
    };
    what += (what.empty() ? "" : ", ") + b.describe();
  }
  if (st.p.announce_found)
    what += ", LMCache object format (l2.format = \"lmcache\")";
  if (st.p.quota_isolated) {
    what += fmt::format(", quotas: IsolatedLRU at {} x limit, ratio {}, every {} ms",
                        st.p.quota_rule.watermark, st.p.quota_rule.ratio,
                        std::chrono::duration_cast<std::chrono::milliseconds>(
                          st.p.quota_interval).count());
    self->delayed_send(self, st.p.quota_interval, tick_atom_v);
  }
  log_lifecycle(self, st.label, "started: " + what);
  arm_stats(self, st.p.stats_interval);
  return {
    [self](l2_write& w) { on_write(self, w); },
    [self](l2_fetch& f) -> l2_fetch_reply { return on_fetch(self, f); },
    // Clears that queue up while one waits share its round: what routers
    // need is the chunks announced after the last clear, and a flood of
    // clears (an engine resetting in a loop) must not become a flood of
    // EXISTS rounds on a Redis every node shares.
    [self](cleared_atom) {
      auto& st = self->state;
      ++st.clears;
      if (!st.reannounce_queued) {
        st.reannounce_queued = true;
        self->send(self, reannounce_atom_v);
      }
    },
    [self](reannounce_atom) {
      self->state.reannounce_queued = false;
      ++self->state.reannounce_rounds;
      on_cleared(self);
    },
    [self](recycle_atom, l2_fetch_reply& used) {
      for (auto& b : used.bytes)
        give_spare(self->state, std::move(b));
    },
    [self](stats_atom) {
      log_stats(self, snapshot(self->state), self->state.p.stats_interval);
    },
    [self](metrics_atom, const caf::actor& to) { send_snapshot(self, to, snapshot(self->state)); },
    [self](clear_l2_atom) -> uint64_t {
      // Only node-local backends: a Redis every node shares is not one
      // node's to empty (its keys stay; the HTTP answer says so).
      auto& st = self->state;
      uint64_t n = 0;
      bool left = false;
      for (auto& b : st.p.backends) {
        if (b->shared())
          left = true;
        else
          n += b->clear();
      }
      announce_removals(self); // BlockRemoved for what routers were told
      KVS_INFO(st.label, "clear (HTTP control plane): {} objects removed from the disk tier{}", n,
               left ? "; the Redis tier, shared by every node, is left as it is" : "");
      return n;
    },
    [self](l2_quota_limit& q) {
      auto& limits = self->state.p.quota_limits;
      if (q.bytes)
        limits[q.salt] = *q.bytes;
      else
        limits.erase(q.salt);
    },
    [self](l2_usage_atom) -> l2_usage {
      l2_usage u;
      for (auto& b : self->state.p.backends) // summed, as LMCache sums its adapters
        for (auto& [salt, bytes] : b->usage().bytes_by_salt())
          u.bytes_by_salt[salt] += bytes;
      u.quota_evicted = self->state.quota_evicted;
      return u;
    },
    [self](l2_list_objects& q) -> l2_objects_page { return list_objects(self, q); },
    [self](l2_delete_objects& q) -> l2_deleted { return delete_objects(self, q); },
    [self](tick_atom) {
      quota_pass(self);
      self->delayed_send(self, self->state.p.quota_interval, tick_atom_v);
    },
  };
}

} // namespace kvs
