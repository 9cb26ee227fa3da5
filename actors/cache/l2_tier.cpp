#include "actors/cache/l2_tier.hpp"

#include "actors/actor_logging.hpp"
#include "actors/cache/event_announce.hpp"
#include "l2/lmcache_object_name.hpp"

#include <fmt/ranges.h>

#include <iterator>
#include <tuple>
#include <string_view>


namespace kvs {

namespace {

using self_ptr = l2_actor::stateful_pointer<l2_state>;

/// What names one object: chunk `hash` (i-th of its message, whose
/// LMCache hashes are `names`) of `rank`.
struct object_at {
  std::string_view model, salt;
  uint64_t fingerprint = 0; ///< l2_model_fingerprint(model, salt)
  uint64_t layout = 0;
  int32_t world_size = 1;
  uint32_t group = 0;
  const std::vector<std::string>* names = nullptr;
};

l2_ref make_ref(const l2_state& st, const object_at& o, uint64_t hash, size_t i, int32_t rank) {
  l2_ref r;
  r.id = l2_object_id{hash, rank, o.fingerprint, o.layout};
  if (!st.p.lmcache_format) {
    r.redis_key = l2_key_string(st.p.key_prefix, o.model, rank, 0, hash, o.salt);
    return r;
  }
  const std::string* name = i < o.names->size() ? &(*o.names)[i] : nullptr;
  r.named = name && !name->empty() && lmcache_nameable(o.model, o.salt);
  if (!r.named)
    return r;
  lmcache_object_key k{o.model, lmcache_kv_rank(o.world_size, rank), o.group, *name, o.salt};
  if (st.p.lmcache_dir)
    r.file = lmcache_file_name(k);
  if (st.p.redis)
    r.redis_key = lmcache_redis_key(st.p.key_prefix, k);
  return r;
}

bool disk_has(const l2_state& st, const l2_ref& r) {
  if (st.p.lmcache_format)
    return st.p.lmcache_dir && r.named && st.p.lmcache_dir->contains(r.file);
  return st.p.disk && st.p.disk->contains(r.id);
}

/// True when the object is now on disk because of this put.
bool disk_put(const l2_state& st, const l2_ref& r, const std::string& bytes) {
  if (st.p.lmcache_format)
    return st.p.lmcache_dir && r.named
           && st.p.lmcache_dir->put(r.file, bytes.data(), bytes.size()) == lmcache_dir_put::stored;
  return st.p.disk && st.p.disk->put(r.id, bytes.data(), bytes.size()) == disk_put::stored;
}

/// Reads the object's payload (LMCache's format: exactly `layout` bytes).
bool disk_get(const l2_state& st, const l2_ref& r, std::string* out) {
  if (st.p.lmcache_format)
    return st.p.lmcache_dir && r.named && st.p.lmcache_dir->get(r.file, r.id.layout, out);
  return st.p.disk && st.p.disk->get(r.id, out);
}

/// A Redis value is the object asked for: kvsidecar's header checks, or
/// LMCache's raw bytes of exactly the layout's length. *skip: where the
/// payload starts.
bool redis_value_ok(const l2_state& st, const l2_ref& r, const std::string& v, uint32_t* skip) {
  if (st.p.lmcache_format) {
    *skip = 0;
    return r.id.layout != 0 && v.size() == r.id.layout;
  }
  uint64_t payload = 0;
  *skip = static_cast<uint32_t>(l2_header_bytes);
  return check_l2_header(reinterpret_cast<const uint8_t*>(v.data()), v.size(), r.id, &payload)
         == l2_header_check::ok;
}

/// Logs a Redis failure once per distinct message (a dead node would
/// otherwise log on every batch); the counters keep the totals.
void note_redis_error(self_ptr self) {
  auto& st = self->state;
  auto& e = st.redis->last_error();
  if (!e.empty() && e != st.last_redis_error) {
    KVS_WARN(st.label, "redis: {} (lookups degrade to the other tiers; retrying by itself)", e);
    st.last_redis_error = e;
  }
}

/// Logs the first disk fault of each kind (ENOSPC, I/O error, rejected
/// object); the stats line keeps counting them.
void note_disk_faults(self_ptr self) {
  auto& st = self->state;
  uint64_t no_space = 0, io_errors = 0, rejected = 0;
  const char* rejected_what = "object rejected (corrupt, truncated or foreign)";
  if (st.p.lmcache_dir) {
    auto& d = st.p.lmcache_dir->stats();
    std::tie(no_space, io_errors, rejected) = std::tie(d.no_space, d.io_errors, d.wrong_size);
    rejected_what = "file of another length than the layout's (a miss, left alone)";
  } else if (st.p.disk) {
    auto& d = st.p.disk->stats();
    std::tie(no_space, io_errors, rejected) = std::tie(d.no_space, d.io_errors, d.rejected);
  } else {
    return;
  }
  auto once = [&](uint64_t now, uint64_t& seen, const char* what) {
    if (now > 0 && seen == 0)
      KVS_WARN(st.label, "disk {}: {} so far (skipped as misses; counted in the stats line)",
               what, now);
    seen = now;
  };
  once(no_space, st.seen_no_space, "full (ENOSPC) on write");
  once(io_errors, st.seen_io_errors, "I/O error");
  once(rejected, st.seen_rejected, rejected_what);
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

void announce_disk_removals(self_ptr self) {
  note_disk_faults(self);
  auto& st = self->state;
  if (st.disk_removed.empty())
    return;
  std::vector<kv_event> events;
  block_removed e;
  e.block_hashes = std::move(st.disk_removed);
  e.medium = l2_disk_medium;
  events.emplace_back(std::move(e));
  st.disk_removed.clear();
  announce_events(self, st.p.events, st.p.events_queue, std::move(events), &st.events_dropped);
}

/// Remembers chunk i of `w` as announced on disk or in Redis (rank 0), newest
/// last; a chunk written again moves to the end, keeping its other medium.
void remember(l2_state& st, const l2_write& w, size_t i, const l2_ref& ref, bool disk) {
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
  if (disk) {
    a.disk_ref = ref;
    a.on_disk = true;
  } else {
    a.redis_key = ref.redis_key;
  }
}

/// The events rank published an AllBlocksCleared: routers dropped the
/// DISK and SHARED chunks with the engine's blocks. What the tiers still
/// hold is announced again, oldest first, in batches of
/// reannounce_batch_events; Redis is asked first (one EXISTS round), as its
/// TTL or another node's writes may have evicted a chunk since. Chunks no
/// tier holds any more are forgotten.
void on_cleared(self_ptr self) {
  auto& st = self->state;
  if (st.redis && !st.announced.empty()) {
    std::vector<std::string> keys;
    std::vector<l2_announced*> of;
    for (auto& a : st.announced)
      if (!a.redis_key.empty()) {
        keys.push_back(a.redis_key);
        of.push_back(&a);
      }
    auto there = st.redis->exists(keys);
    for (size_t k = 0; k < of.size(); ++k)
      if (!there[k])
        of[k]->redis_key.clear();
    note_redis_error(self);
  }
  uint64_t chunks = 0, on_disk = 0, in_redis = 0;
  const uint64_t dropped_before = st.events_dropped;
  reannounce_batches batches{self, st.p.events, st.p.events_queue, &st.events_dropped};
  auto add = [&](const l2_announced& a, const char* medium) {
    batches.add(chunk_stored(a.hash, a.parent, a.tokens, st.p.chunk_size, medium));
  };
  for (auto it = st.announced.begin(); it != st.announced.end();) {
    it->on_disk = it->on_disk && disk_has(st, it->disk_ref);
    if (it->on_disk) {
      add(*it, l2_disk_medium);
      ++on_disk;
    }
    if (!it->redis_key.empty()) {
      add(*it, l2_redis_medium);
      ++in_redis;
    }
    if (it->on_disk || !it->redis_key.empty()) {
      ++chunks;
      ++it;
    } else { // no tier holds it any more
      st.announced_at.erase(it->hash);
      it = st.announced.erase(it);
    }
  }
  batches.flush();
  st.reannounced += on_disk + in_redis;
  if (chunks > 0)
    KVS_INFO(st.label, "AllBlocksCleared on the events rank: {} chunks of L2 announced again "
                       "({} DISK, {} SHARED){}",
             chunks, on_disk, in_redis, dropped_suffix(dropped_before, st.events_dropped));
}

void on_write(self_ptr self, l2_write& w) {
  auto& st = self->state;
  const object_at at{w.model, w.salt, l2_model_fingerprint(w.model, w.salt), w.layout,
                     w.world_size, w.group, &w.names};
  std::vector<l2_ref> refs;
  refs.reserve(w.hashes.size());
  for (size_t i = 0; i < w.hashes.size(); ++i)
    refs.push_back(make_ref(st, at, w.hashes[i], i, w.rank));
  std::vector<kv_event> events;
  auto stored_event = [&](size_t i, const char* medium) {
    if (w.rank != 0 || i >= w.tokens.size())
      return;
    if (st.p.events)
      remember(st, w, i, refs[i], medium == std::string_view{l2_disk_medium});
    events.push_back(chunk_stored(w.hashes[i], w.parents[i], w.tokens[i], st.p.chunk_size, medium));
  };
  // kvsidecar's Redis objects are header + payload; the payload goes out
  // from the write's own bytes (no object is assembled in memory).
  // LMCache's are the payload alone.
  const bool headers_on = st.redis && !st.p.lmcache_format;
  std::string headers(headers_on ? w.hashes.size() * l2_header_bytes : 0, '\0');
  for (size_t i = 0; i < w.hashes.size(); ++i) {
    if (disk_put(st, refs[i], w.bytes[i])) {
      stored_event(i, l2_disk_medium);
      if (w.quiet && w.rank == 0)
        st.disk_quiet.insert(w.hashes[i]);
      else if (st.p.lmcache_dir && w.rank == 0)
        st.dir_announced[refs[i].file] = w.hashes[i];
    }
    if (headers_on)
      encode_l2_header(refs[i].id, w.bytes[i].size(),
                       reinterpret_cast<uint8_t*>(headers.data() + i * l2_header_bytes));
  }
  if (st.redis) {
    std::vector<std::string> keys;
    std::vector<std::string_view> heads, values;
    std::vector<size_t> which; // LMCache's format: chunks without a name are not written
    for (size_t i = 0; i < w.hashes.size(); ++i) {
      if (!refs[i].named)
        continue;
      keys.push_back(refs[i].redis_key);
      if (headers_on)
        heads.emplace_back(headers.data() + i * l2_header_bytes, l2_header_bytes);
      values.emplace_back(w.bytes[i].data(), w.bytes[i].size());
      which.push_back(i);
    }
    auto ok = keys.empty() ? std::vector<bool>{} : st.redis->set(keys, values, heads);
    for (size_t k = 0; k < ok.size(); ++k)
      if (ok[k])
        stored_event(which[k], l2_redis_medium);
    note_redis_error(self);
  }
  st.written_chunks += w.hashes.size();
  st.p.queue->release(static_cast<int64_t>(w.queued_bytes));
  announce_events(self, st.p.events, st.p.events_queue, std::move(events), &st.events_dropped);
  announce_disk_removals(self);
}

/// LMCache's format: chunks of a fetch this actor never announced (another
/// writer, an LMCache node, put them in the shared L2) are announced now,
/// as DISK or SHARED by where rank 0's object came from, and remembered as
/// written ones are (announced again after an AllBlocksCleared; a file's
/// eviction announced).
void announce_found(self_ptr self, const l2_fetch& f, size_t chunks,
                    const std::vector<bool>& rank0_on_disk, const std::vector<l2_ref>& refs,
                    size_t world) {
  auto& st = self->state;
  if (!st.p.lmcache_format || !st.p.events || !f.tokens || f.group != 0)
    return;
  const auto cs = static_cast<size_t>(st.p.chunk_size);
  std::vector<kv_event> events;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t abs = f.first_chunk + c;
    if (cs == 0 || (abs + 1) * cs > f.tokens->size())
      break;
    if (st.announced_at.count(f.hashes[c]))
      continue;
    l2_write one; // remember() reads a write's fields
    one.hashes = {f.hashes[c]};
    one.parents = {c == 0 ? f.parent : std::optional<uint64_t>{f.hashes[c - 1]}};
    one.tokens.emplace_back(f.tokens->begin() + static_cast<ptrdiff_t>(abs * cs),
                            f.tokens->begin() + static_cast<ptrdiff_t>((abs + 1) * cs));
    const auto& ref = refs[c * world];
    const bool disk = rank0_on_disk[c];
    remember(st, one, 0, ref, disk);
    if (disk)
      st.dir_announced[ref.file] = f.hashes[c];
    ++st.found_announced;
    events.push_back(chunk_stored(one.hashes[0], one.parents[0], std::move(one.tokens[0]),
                                  st.p.chunk_size, disk ? l2_disk_medium : l2_redis_medium));
  }
  announce_events(self, st.p.events, st.p.events_queue, std::move(events), &st.events_dropped);
}

l2_fetch_reply on_fetch(self_ptr self, l2_fetch& f) {
  auto& st = self->state;
  l2_fetch_reply out;
  auto world = static_cast<size_t>(std::max(f.world_size, 1));
  const object_at at{f.model, f.salt, l2_model_fingerprint(f.model, f.salt), f.layout,
                     f.world_size, f.group, &f.names};
  auto n = f.hashes.size();
  std::vector<l2_ref> refs;
  refs.reserve(n * world);
  for (size_t i = 0; i < n * world; ++i)
    refs.push_back(make_ref(st, at, f.hashes[i / world], i / world, static_cast<int32_t>(i % world)));
  // One Redis round trip for every shard the disk does not hold, read into
  // buffers the store handed back (recycle): a value lands in memory that is
  // already mapped instead of a fresh multi-MiB allocation that page-faults.
  std::vector<std::string> remote(n * world);
  std::vector<bool> remote_hit(n * world, false);
  std::vector<bool> on_disk(n * world, false);
  std::vector<bool> rank0_on_disk(n, false); // where each chunk's rank-0 object came from
  for (size_t i = 0; i < n * world; ++i)
    on_disk[i] = refs[i].named && disk_has(st, refs[i]);
  if (st.redis) {
    std::vector<std::string> keys;
    std::vector<size_t> where;
    for (size_t i = 0; i < n * world; ++i) {
      if (on_disk[i] || !refs[i].named)
        continue;
      keys.push_back(refs[i].redis_key);
      where.push_back(i);
    }
    if (!keys.empty()) {
      std::vector<std::string> values(keys.size());
      for (auto& v : values)
        v = take_spare(st);
      auto hit = st.redis->get_into(keys, values);
      for (size_t k = 0; k < keys.size(); ++k) {
        remote_hit[where[k]] = hit[k];
        remote[where[k]] = std::move(values[k]);
      }
      note_redis_error(self);
    }
  }
  // The contiguous prefix of chunks complete on every rank.
  for (size_t c = 0; c < n; ++c) {
    // Read nothing of a chunk that some rank lacks everywhere.
    bool present = true;
    for (size_t r = 0; r < world && present; ++r)
      present = on_disk[c * world + r] || remote_hit[c * world + r];
    if (!present)
      break;
    std::vector<std::string> shards(world);
    std::vector<uint32_t> skip(world, 0);
    for (auto& s : shards)
      s = take_spare(st);
    bool complete = true;
    for (size_t r = 0; r < world && complete; ++r) {
      auto i = c * world + r;
      if (on_disk[i] && disk_get(st, refs[i], &shards[r])) {
        ++st.fetched_disk;
        rank0_on_disk[c] = rank0_on_disk[c] || r == 0;
        continue;
      }
      auto& v = remote[i];
      if (remote_hit[i] && redis_value_ok(st, refs[i], v, &skip[r])) {
        give_spare(st, std::move(shards[r]));
        shards[r] = std::move(v);
        ++st.fetched_redis;
        continue;
      }
      if (remote_hit[i])
        ++st.redis_rejected;
      complete = false;
    }
    if (!complete) {
      for (auto& s : shards)
        give_spare(st, std::move(s));
      break;
    }
    for (size_t r = 0; r < world; ++r) {
      out.bytes.push_back(std::move(shards[r]));
      out.skip.push_back(skip[r]);
    }
    ++out.chunks;
  }
  for (auto& v : remote) // values past the prefix, misses
    give_spare(st, std::move(v));
  announce_found(self, f, out.chunks, rank0_on_disk, refs, world);
  announce_disk_removals(self); // a rejected file is dropped from the disk
  return out;
}

/// The figures both disk tiers keep (disk_tier_stats, lmcache_dir_stats).
template <class DiskStats>
stats_snapshot& disk_figures(stats_snapshot& s, const DiskStats& d) {
  return s.gauge("disk_objects", "kvsidecar_l2_objects", static_cast<double>(d.objects), "tier", "disk")
    .gauge("disk_bytes", "kvsidecar_l2_bytes", static_cast<double>(d.bytes), "tier", "disk")
    .counter("disk_puts", "kvsidecar_l2_puts_total", static_cast<double>(d.puts), "tier", "disk")
    .counter("disk_hits", "kvsidecar_l2_hits_total", static_cast<double>(d.hits), "tier", "disk")
    .counter("disk_misses", "kvsidecar_l2_misses_total", static_cast<double>(d.misses), "tier",
             "disk")
    .counter("disk_evictions", "kvsidecar_l2_evictions_total", static_cast<double>(d.evictions),
             "tier", "disk")
    .counter("disk_no_space", "kvsidecar_l2_errors_total", static_cast<double>(d.no_space),
             "kind", "disk_no_space")
    .counter("disk_io_errors", "kvsidecar_l2_errors_total", static_cast<double>(d.io_errors),
             "kind", "disk_io");
}

} // namespace

stats_snapshot snapshot(const l2_state& st) {
  stats_snapshot s;
  s.actor = st.label;
  s.counter("written", "kvsidecar_l2_written_chunks_total", static_cast<double>(st.written_chunks))
    .counter("fetched_disk", "kvsidecar_l2_fetched_chunks_total",
             static_cast<double>(st.fetched_disk), "tier", "disk")
    .counter("fetched_redis", "kvsidecar_l2_fetched_chunks_total",
             static_cast<double>(st.fetched_redis), "tier", "redis")
    .gauge("queued_bytes", "", static_cast<double>(st.p.queue->in_flight()))
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
    .gauge("disk_quiet", "", static_cast<double>(st.disk_quiet.size()))
    .counter("found_announced", "", static_cast<double>(st.found_announced));
  if (st.p.disk) {
    auto& d = st.p.disk->stats();
    disk_figures(s, d).counter("disk_rejected", "kvsidecar_l2_errors_total",
                               static_cast<double>(d.rejected), "kind", "disk_rejected");
  }
  if (st.p.lmcache_dir) {
    // l2.format = "lmcache": the folder in LMCache's fs adapter layout.
    auto& d = st.p.lmcache_dir->stats();
    disk_figures(s, d)
      .counter("disk_put_exists", "", static_cast<double>(d.put_exists))
      .counter("disk_adopted", "kvsidecar_l2_adopted_objects_total",
               static_cast<double>(d.adopted))
      .counter("disk_wrong_size", "kvsidecar_l2_errors_total", static_cast<double>(d.wrong_size),
               "kind", "disk_wrong_size");
  }
  if (st.redis) {
    auto& r = st.redis->stats();
    s.counter("redis_sets", "kvsidecar_l2_puts_total", static_cast<double>(r.set_ok), "tier",
              "redis")
      .counter("redis_gets", "", static_cast<double>(r.gets))
      .counter("redis_hits", "kvsidecar_l2_hits_total", static_cast<double>(r.get_hits), "tier",
               "redis")
      .counter("redis_errors", "kvsidecar_l2_errors_total", static_cast<double>(r.errors), "kind",
               "redis")
      .counter("redis_unreachable", "kvsidecar_l2_errors_total",
               static_cast<double>(r.unreachable), "kind", "redis_unreachable")
      .counter("redis_rejected", "kvsidecar_l2_errors_total", static_cast<double>(st.redis_rejected),
               "kind", "redis_rejected")
      .counter("redis_moved", "", static_cast<double>(r.moved))
      .counter("redis_asked", "", static_cast<double>(r.asked))
      .counter("redis_refreshes", "", static_cast<double>(r.slot_refreshes))
      .counter("redis_connects", "", static_cast<double>(r.connects))
      .counter("redis_connect_failures", "kvsidecar_l2_errors_total",
               static_cast<double>(r.connect_failures), "kind", "redis_connect");
  }
  return s;
}

l2_actor::behavior_type l2_tier(l2_actor::stateful_pointer<l2_state> self, l2_params params) {
  auto& st = self->state;
  st.p = std::move(params);
  st.label = log::label(l2_state::name, "", self->id());
  if (st.p.redis)
    st.redis = std::make_unique<redis_client>(*st.p.redis);
  if (st.p.disk)
    st.p.disk->on_removed = [self](uint64_t hash, int32_t rank) {
      if (rank == 0 && self->state.disk_quiet.erase(hash) == 0)
        self->state.disk_removed.push_back(hash);
    };
  if (st.p.lmcache_dir) // only files this actor announced are announced gone
    st.p.lmcache_dir->on_removed = [self](const std::string& name) {
      auto& st = self->state;
      if (auto it = st.dir_announced.find(name); it != st.dir_announced.end()) {
        st.disk_removed.push_back(it->second);
        st.dir_announced.erase(it);
      }
    };
  std::string what;
  if (st.p.disk)
    what += fmt::format("disk {} ({} MiB, {} chunks found)", st.p.disk->options().path,
                        st.p.disk->options().size >> 20, st.p.disk->stats().recovered);
  if (st.p.lmcache_dir)
    what += fmt::format("disk {} in LMCache's fs layout ({} MiB, {} objects found)",
                        st.p.lmcache_dir->options().path, st.p.lmcache_dir->options().size >> 20,
                        st.p.lmcache_dir->stats().recovered);
  if (st.p.lmcache_format)
    what += ", LMCache object format (l2.format = \"lmcache\")";
  if (st.redis)
    what += fmt::format("{}redis {}{}", what.empty() ? "" : ", ",
                        fmt::join(st.p.redis->endpoints, ","), st.p.redis->cluster ? " (cluster)" : "");
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
      // Only the node-local tier: a Redis every node shares is not one
      // node's to empty (its keys stay; the HTTP answer says so).
      auto& st = self->state;
      uint64_t n = 0;
      if (st.p.disk)
        n += st.p.disk->clear();
      if (st.p.lmcache_dir)
        n += st.p.lmcache_dir->clear();
      announce_disk_removals(self); // BlockRemoved "DISK" for what routers were told
      KVS_INFO(st.label, "clear (HTTP control plane): {} objects removed from the disk tier{}", n,
               st.redis ? "; the Redis tier, shared by every node, is left as it is" : "");
      return n;
    },
  };
}

} // namespace kvs
