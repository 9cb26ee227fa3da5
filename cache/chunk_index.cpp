#include "cache/chunk_index.hpp"

#include <algorithm>
#include <cmath>

namespace kvs {

const char* to_string(no_space_reason r) {
  switch (r) {
    case no_space_reason::none: return "none";
    case no_space_reason::invalid_size: return "invalid_size";
    case no_space_reason::chunk_too_large: return "chunk_too_large";
    case no_space_reason::all_pinned: return "all_pinned";
  }
  return "unknown";
}

namespace {

// Bytes (or slots) at a fill fraction. The epsilon keeps 0.29 * 100 at 29,
// not 28.
size_t slots_at(double fraction, size_t total) {
  return static_cast<size_t>(std::floor(fraction * static_cast<double>(total) + 1e-9));
}

} // namespace

chunk_index::chunk_index(slot_pool& pool, index_options opts)
    : pool_(pool), opts_(opts) {
  opts_.evict_high = std::clamp(opts_.evict_high, 0.0, 1.0);
  opts_.evict_low = std::clamp(opts_.evict_low, 0.0, opts_.evict_high);
  table_.assign(16, bucket{0, 0, npos});
  mask_ = table_.size() - 1;
  const size_t expect = opts_.expected_entries
                            ? opts_.expected_entries
                            : std::min<size_t>(pool_.capacity_bytes() >> 16, size_t{1} << 20);
  map_grow(expect);
  entries_.reserve(expect);
}

// --- hash table ---------------------------------------------------------------

size_t chunk_index::home(uint64_t hash, int32_t rank) const {
  // The chunk hash is already XXH3 output; the mix only guards against
  // callers with weak hashes. Ranks of one chunk sit next to each other.
  uint64_t h = hash;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return (static_cast<size_t>(h) + static_cast<uint32_t>(rank)) & mask_;
}

size_t chunk_index::find_bucket(uint64_t hash, int32_t rank) const {
  for (size_t i = home(hash, rank);; i = (i + 1) & mask_) {
    const bucket& b = table_[i];
    if (b.ref == npos) return SIZE_MAX;
    if (b.hash == hash && b.rank == rank) return i;
  }
}

uint32_t chunk_index::find_idx(uint64_t hash, int32_t rank) const {
  const size_t b = find_bucket(hash, rank);
  return b == SIZE_MAX ? npos : (table_[b].ref & k_idx_mask);
}

void chunk_index::map_insert(uint64_t hash, int32_t rank, uint32_t idx) {
  if ((live_ + 1) * 2 > table_.size()) map_grow(live_ + 1);
  size_t i = home(hash, rank);
  while (table_[i].ref != npos) i = (i + 1) & mask_;
  table_[i] = bucket{hash, rank, idx};
}

void chunk_index::map_erase(uint64_t hash, int32_t rank) {
  size_t i = find_bucket(hash, rank);
  if (i == SIZE_MAX) return;
  table_[i].ref = npos;
  // Backward-shift deletion: pull later members of the probe run into the
  // hole unless their home lies cyclically in (hole, position].
  for (size_t j = (i + 1) & mask_; table_[j].ref != npos; j = (j + 1) & mask_) {
    const size_t k = home(table_[j].hash, table_[j].rank);
    if (((j - k) & mask_) >= ((j - i) & mask_)) {
      table_[i] = table_[j];
      table_[j].ref = npos;
      i = j;
    }
  }
}

void chunk_index::map_grow(size_t min_entries) {
  // Load factor <= 1/2 keeps linear-probe runs short for misses too.
  size_t cap = table_.size();
  while (cap < min_entries * 2) cap *= 2;
  if (cap == table_.size()) return;
  std::vector<bucket> old;
  old.swap(table_);
  table_.assign(cap, bucket{0, 0, npos});
  mask_ = cap - 1;
  for (const bucket& b : old) {
    if (b.ref == npos) continue;
    size_t i = home(b.hash, b.rank);
    while (table_[i].ref != npos) i = (i + 1) & mask_;
    table_[i] = b;
  }
}

// --- entries and lists ----------------------------------------------------------

uint32_t chunk_index::new_entry() {
  if (free_head_ != npos) {
    const uint32_t idx = free_head_;
    free_head_ = entries_[idx].next;
    entries_[idx] = entry{};
    return idx;
  }
  // Indexes fit in 31 bits (the bucket's top bit is the committed flag):
  // entries never outnumber slots in use, and the pool caps those below 2^31.
  entries_.emplace_back();
  return static_cast<uint32_t>(entries_.size() - 1);
}

void chunk_index::remove_entry(uint32_t idx) {
  entry& e = entries_[idx];
  switch (e.at) {
    case where::lru: lru_unlink(idx); break;
    case where::reserved: list_remove(reserved_, idx); break;
    case where::locked:
      outstanding_readers_ -= e.readers;
      list_remove(locked_, idx);
      break;
    case where::free: return;
  }
  pool_.free(e.slot);
  bytes_used_ -= e.bytes;
  map_erase(e.hash, e.rank);
  e = entry{};
  e.next = free_head_;
  free_head_ = idx;
  --live_;
}

void chunk_index::lru_push_back(uint32_t idx) {
  entry& e = entries_[idx];
  e.at = where::lru;
  e.prev = lru_tail_;
  e.next = npos;
  if (lru_tail_ != npos) entries_[lru_tail_].next = idx;
  else lru_head_ = idx;
  lru_tail_ = idx;
  ++lru_size_;
}

void chunk_index::lru_unlink(uint32_t idx) {
  entry& e = entries_[idx];
  if (e.prev != npos) entries_[e.prev].next = e.next;
  else lru_head_ = e.next;
  if (e.next != npos) entries_[e.next].prev = e.prev;
  else lru_tail_ = e.prev;
  e.prev = e.next = npos;
  --lru_size_;
}

void chunk_index::list_push(std::vector<uint32_t>& list, uint32_t idx) {
  entries_[idx].list_pos = static_cast<uint32_t>(list.size());
  list.push_back(idx);
}

void chunk_index::list_remove(std::vector<uint32_t>& list, uint32_t idx) {
  const uint32_t pos = entries_[idx].list_pos;
  const uint32_t last = list.back();
  list[pos] = last;
  entries_[last].list_pos = pos;
  list.pop_back();
  entries_[idx].list_pos = npos;
}

void chunk_index::end_lock_lifetime(uint32_t idx) {
  entry& e = entries_[idx];
  outstanding_readers_ -= e.readers;
  e.readers = 0;
  e.stamp = {};
  list_remove(locked_, idx);
  lru_push_back(idx);
  // A new epoch makes every token of the ended lifetime stale.
  e.epoch = next_epoch_++;
  if (next_epoch_ == 0) next_epoch_ = 1;
}

entry_info chunk_index::info(const entry& e) const {
  entry_info i;
  i.state = e.at == where::reserved ? entry_state::reserved : entry_state::committed;
  i.slot = e.slot;
  i.offset = pool_.offset(e.slot);
  i.data = pool_.data(e.slot);
  i.arena = pool_.arena_of(e.slot);
  i.bytes = e.bytes;
  i.format = e.format;
  i.readers = e.readers;
  i.lock_epoch = e.epoch;
  i.lock_expiry = e.at == where::locked ? e.stamp : cache_clock::time_point{};
  return i;
}

bool chunk_index::committed(uint64_t hash, int32_t rank) const {
  const size_t b = find_bucket(hash, rank);
  return b != SIZE_MAX && (table_[b].ref & k_visible) != 0;
}

// --- lookups -------------------------------------------------------------------

size_t chunk_index::lookup_prefix(const uint64_t* hashes, size_t n,
                                  int world_size) {
  ++lookups_;
  size_t hit = 0;
  if (world_size >= 1) {
    for (; hit < n; ++hit) {
      bool all = true;
      for (int r = 0; r < world_size && all; ++r) all = committed(hashes[hit], r);
      if (!all) break;
    }
  }
  hit_chunks_ += hit;
  miss_chunks_ += n - hit;
  return hit;
}

size_t chunk_index::lookup_prefix_rank(const uint64_t* hashes, size_t n,
                                       int rank) {
  ++lookups_;
  size_t hit = 0;
  while (hit < n && committed(hashes[hit], rank)) ++hit;
  hit_chunks_ += hit;
  miss_chunks_ += n - hit;
  return hit;
}

std::optional<entry_info> chunk_index::find(chunk_key k) const {
  const uint32_t idx = find_idx(k.hash, k.rank);
  if (idx == npos) return std::nullopt;
  return info(entries_[idx]);
}

bool chunk_index::touch(chunk_key k) {
  const uint32_t idx = find_idx(k.hash, k.rank);
  if (idx == npos || entries_[idx].at != where::lru) return false;
  lru_unlink(idx);
  lru_push_back(idx);
  return true;
}

// --- read locks ------------------------------------------------------------------

std::optional<lock_token> chunk_index::lock(chunk_key k, uint32_t readers,
                                            cache_clock::time_point now) {
  if (readers == 0) return std::nullopt;
  const uint32_t idx = find_idx(k.hash, k.rank);
  if (idx == npos) return std::nullopt;
  entry& e = entries_[idx];
  if (e.at != where::lru && e.at != where::locked) return std::nullopt;
  if (e.readers > UINT32_MAX - readers) return std::nullopt;
  const auto expiry = now + opts_.lock_ttl;
  if (e.at == where::lru) {
    lru_unlink(idx);
    e.at = where::locked;
    list_push(locked_, idx);
    e.stamp = expiry;
  } else {
    e.stamp = std::max(e.stamp, expiry);
  }
  e.readers += readers;
  outstanding_readers_ += readers;
  return lock_token{k, e.epoch};
}

uint32_t chunk_index::unlock(const lock_token& t, uint32_t readers) {
  if (readers == 0) return 0;
  const uint32_t idx = find_idx(t.key.hash, t.key.rank);
  if (idx == npos || entries_[idx].at != where::locked ||
      entries_[idx].epoch != t.epoch) {
    ++stale_unlocks_;
    return 0;
  }
  entry& e = entries_[idx];
  const uint32_t n = std::min(readers, e.readers);
  if (n == e.readers) {
    end_lock_lifetime(idx);
  } else {
    e.readers -= n;
    outstanding_readers_ -= n;
  }
  return n;
}

size_t chunk_index::expire_locks(cache_clock::time_point now) {
  size_t n = 0;
  // Backwards, so the swap-remove in end_lock_lifetime only moves entries
  // already visited.
  for (size_t i = locked_.size(); i-- > 0;) {
    const uint32_t idx = locked_[i];
    if (entries_[idx].stamp <= now) {
      end_lock_lifetime(idx);
      ++n;
    }
  }
  expired_locks_ += n;
  return n;
}

bool chunk_index::lock_alive(const lock_token& t) const {
  const uint32_t idx = find_idx(t.key.hash, t.key.rank);
  return idx != npos && entries_[idx].at == where::locked &&
         entries_[idx].epoch == t.epoch;
}

// --- write path ------------------------------------------------------------------

void chunk_index::evict(uint32_t idx, reserve_result& r) {
  r.evicted.push_back(chunk_key{entries_[idx].hash, entries_[idx].rank});
  remove_entry(idx);
  ++evictions_;
}

// The eviction rules of the header comment, steps 1-3.
slot_id chunk_index::make_room(size_t bytes, size_t stride, arena_id arena,
                               reserve_result& r) {
  const size_t cap = pool_.capacity_bytes();
  if (pool_.bytes_used() + stride > slots_at(opts_.evict_high, cap)) {
    const size_t low = slots_at(opts_.evict_low, cap);
    while (pool_.bytes_used() + stride > low && lru_head_ != npos) evict(lru_head_, r);
  }
  slot_id s = pool_.alloc(bytes, arena);
  if (s != invalid_slot || lru_head_ == npos) return s;
  for (uint32_t cur = lru_head_; cur != npos; cur = entries_[cur].next) {
    if (pool_.run_if_freed(entries_[cur].slot, arena) >= stride) {
      evict(cur, r);
      return pool_.alloc(bytes, arena);
    }
  }
  if (arena != anonymous_arena)
    return evict_for_extent(bytes, stride, arena, r);
  while (s == invalid_slot && lru_head_ != npos) {
    evict(lru_head_, r);
    s = pool_.alloc(bytes, arena);
  }
  return s;
}

// Step 3 for an arena: its slots never leave one extent, so what it needs
// is a whole extent (or its own run) freed, and evicting oldest first
// could flush every unlocked chunk without freeing one (each extent
// holding a locked or reserved chunk). So: an extent none of whose chunks
// is pinned, the one holding the oldest chunk that lies in such an
// extent, has all its chunks evicted; no such extent, nothing is evicted.
slot_id chunk_index::evict_for_extent(size_t bytes, size_t stride, arena_id arena,
                                      reserve_result& r) {
  const size_t ext = pool_.extent_bytes();
  const size_t n = pool_.extent_count();
  if (ext == 0 || n == 0)
    return invalid_slot;
  auto extents_of = [&](uint32_t idx) {
    const size_t off = pool_.offset(entries_[idx].slot);
    return std::make_pair(off / ext, (off + pool_.slot_stride(entries_[idx].slot) - 1) / ext);
  };
  std::vector<bool> pinned(n, false);
  for (uint32_t i = 0; i < entries_.size(); ++i) {
    const entry& e = entries_[i];
    if (e.at == where::free || e.at == where::lru || e.slot == invalid_slot)
      continue;
    const auto [lo, hi] = extents_of(i);
    for (size_t x = lo; x <= hi && x < n; ++x)
      pinned[x] = true;
  }
  for (uint32_t cur = lru_head_; cur != npos; cur = entries_[cur].next) {
    const auto [lo, hi] = extents_of(cur);
    for (size_t x = lo; x <= hi && x < n; ++x) {
      if (pinned[x] || pool_.extent_length(x) < stride)
        continue;
      // Every chunk in extent x is unlocked and committed: all of them go.
      std::vector<uint32_t> in_x;
      for (uint32_t j = lru_head_; j != npos; j = entries_[j].next) {
        const auto [a, b] = extents_of(j);
        if (a <= x && x <= b)
          in_x.push_back(j);
      }
      for (uint32_t j : in_x)
        evict(j, r);
      // Extent x is free now: the arena takes it (or grows its own run).
      return pool_.alloc(bytes, arena);
    }
  }
  return invalid_slot;
}

reserve_result chunk_index::reserve(chunk_key k, size_t bytes,
                                    cache_clock::time_point now, uint8_t format,
                                    arena_id arena) {
  reserve_result r;
  const uint32_t found = find_idx(k.hash, k.rank);
  if (found != npos) {
    r.status = reserve_status::already_present;
    r.existing = entries_[found].at == where::reserved ? entry_state::reserved
                                                       : entry_state::committed;
    return r;
  }
  auto no_space = [&](no_space_reason why, std::string detail) {
    ++reserve_no_space_;
    r.status = reserve_status::no_space;
    r.reason = why;
    r.detail = std::move(detail);
    return std::move(r);
  };
  if (bytes == 0)
    return no_space(no_space_reason::invalid_size, "chunk of 0 bytes");
  const size_t stride = pool_.stride_for(bytes);
  if (stride == 0 || stride > pool_.capacity_bytes() / pool_.slot_align() * pool_.slot_align())
    return no_space(no_space_reason::chunk_too_large,
                    "chunk of " + std::to_string(bytes) +
                        " bytes is larger than the whole L1 region of " +
                        std::to_string(pool_.capacity_bytes()) + " bytes (cache.l1_size)");
  if (arena != anonymous_arena && (!pool_.arena_open(arena) || stride > pool_.extent_bytes()))
    return no_space(no_space_reason::chunk_too_large,
                    "chunk of " + std::to_string(bytes) + " bytes for L1 arena " +
                        std::to_string(arena) + ": " +
                        (pool_.arena_open(arena) ? "larger than an arena extent of " +
                                                      std::to_string(pool_.extent_bytes()) +
                                                      " bytes"
                                                 : std::string("no such arena open")));
  const slot_id s = make_room(bytes, stride, arena, r);
  if (s == invalid_slot && arena != anonymous_arena)
    return no_space(no_space_reason::all_pinned,
                    "no L1 extent for arena " + std::to_string(arena) + ": every extent holds "
                        "a read-locked or reserved chunk (" + std::to_string(locked_.size()) +
                        " read-locked, " + std::to_string(reserved_.size()) +
                        " reserved), so evicting would free none");
  if (s == invalid_slot)
    return no_space(no_space_reason::all_pinned,
                    "no free run of " + std::to_string(stride) + " bytes in L1: " +
                        std::to_string(pool_.bytes_used()) + " of " +
                        std::to_string(pool_.capacity_bytes()) + " bytes held by " +
                        std::to_string(locked_.size()) + " read-locked and " +
                        std::to_string(reserved_.size()) +
                        " reserved chunks, nothing unlocked left to evict");

  const uint32_t idx = new_entry();
  entry& e = entries_[idx];
  e.hash = k.hash;
  e.rank = k.rank;
  e.slot = s;
  e.bytes = bytes;
  e.format = format;
  e.stamp = now;
  e.epoch = next_epoch_++;
  if (next_epoch_ == 0) next_epoch_ = 1;
  e.at = where::reserved;
  list_push(reserved_, idx);
  map_insert(k.hash, k.rank, idx);
  ++live_;
  bytes_used_ += bytes;

  r.status = reserve_status::reserved;
  r.slot = s;
  r.offset = pool_.offset(s);
  r.data = pool_.data(s);
  r.arena = arena;
  return r;
}

bool chunk_index::commit(chunk_key k) {
  const uint32_t idx = find_idx(k.hash, k.rank);
  if (idx == npos || entries_[idx].at != where::reserved) return false;
  list_remove(reserved_, idx);
  entries_[idx].stamp = {};
  lru_push_back(idx);
  table_[find_bucket(k.hash, k.rank)].ref |= k_visible;
  return true;
}

bool chunk_index::abort(chunk_key k) {
  const uint32_t idx = find_idx(k.hash, k.rank);
  if (idx == npos || entries_[idx].at != where::reserved) return false;
  remove_entry(idx);
  return true;
}

std::vector<chunk_key> chunk_index::expire_reservations(
    cache_clock::time_point now) {
  std::vector<chunk_key> out;
  for (size_t i = reserved_.size(); i-- > 0;) {
    const uint32_t idx = reserved_[i];
    const entry& e = entries_[idx];
    if (e.stamp + opts_.reserve_ttl <= now) {
      out.push_back(chunk_key{e.hash, e.rank});
      remove_entry(idx);
    }
  }
  expired_reservations_ += out.size();
  return out;
}

// --- removal -----------------------------------------------------------------------

bool chunk_index::erase(chunk_key k) {
  const uint32_t idx = find_idx(k.hash, k.rank);
  if (idx == npos || entries_[idx].at != where::lru) return false;
  remove_entry(idx);
  return true;
}

std::vector<chunk_key> chunk_index::clear() {
  std::vector<chunk_key> out;
  out.reserve(lru_size_);
  while (lru_head_ != npos) {
    out.push_back(chunk_key{entries_[lru_head_].hash, entries_[lru_head_].rank});
    remove_entry(lru_head_);
  }
  return out;
}

std::vector<chunk_key> chunk_index::erase_rank(int rank) {
  std::vector<chunk_key> out;
  for (uint32_t cur = lru_head_; cur != npos;) {
    const uint32_t nxt = entries_[cur].next;
    if (entries_[cur].rank == rank) {
      out.push_back(chunk_key{entries_[cur].hash, entries_[cur].rank});
      remove_entry(cur);
    }
    cur = nxt;
  }
  return out;
}

// --- observation -------------------------------------------------------------------

size_t chunk_index::scan(size_t from, size_t budget,
                         const std::function<bool(chunk_key, const entry_info&)>& visit) const {
  size_t i = from;
  for (; i < entries_.size() && budget > 0; ++i, --budget) {
    const entry& e = entries_[i];
    if (e.at != where::lru && e.at != where::locked)
      continue;
    if (!visit(chunk_key{e.hash, e.rank}, info(e)))
      return i + 1 < entries_.size() ? i + 1 : SIZE_MAX;
  }
  return i >= entries_.size() ? SIZE_MAX : i;
}

index_stats chunk_index::stats() const {
  index_stats s;
  s.chunks = lru_size_ + locked_.size();
  s.reserved = reserved_.size();
  s.locked_entries = locked_.size();
  s.outstanding_readers = outstanding_readers_;
  s.bytes_used = bytes_used_;
  s.slot_bytes_used = pool_.bytes_used();
  s.capacity_bytes = pool_.capacity_bytes();
  s.slots_used = pool_.slots_used();
  s.largest_free_run = pool_.largest_free_run();
  s.evictions = evictions_;
  s.lookups = lookups_;
  s.hit_chunks = hit_chunks_;
  s.miss_chunks = miss_chunks_;
  s.reserve_no_space = reserve_no_space_;
  s.expired_locks = expired_locks_;
  s.expired_reservations = expired_reservations_;
  s.stale_unlocks = stale_unlocks_;
  return s;
}

status chunk_index::check_invariants() const {
  auto fail = [](std::string w) -> status { return make_error("invariant", std::move(w)); };
  // Map <-> entries.
  size_t occupied = 0;
  for (size_t i = 0; i < table_.size(); ++i) {
    const bucket& b = table_[i];
    if (b.ref == npos) continue;
    ++occupied;
    const uint32_t idx = b.ref & k_idx_mask;
    if (idx >= entries_.size()) return fail("bucket points past the entries");
    const entry& e = entries_[idx];
    if (e.at == where::free) return fail("bucket points at a free entry");
    if (((b.ref & k_visible) != 0) != (e.at == where::lru || e.at == where::locked))
      return fail("bucket committed bit != entry state");
    if (e.hash != b.hash || e.rank != b.rank) return fail("bucket key != entry key");
    if (find_bucket(b.hash, b.rank) != i) return fail("probe run broken");
  }
  if (occupied != live_) return fail("map size != live entries");
  // Every entry is in exactly the structure its state names.
  size_t seen_lru = 0;
  uint32_t prev = npos;
  for (uint32_t cur = lru_head_; cur != npos; cur = entries_[cur].next) {
    const entry& e = entries_[cur];
    if (e.at != where::lru) return fail("non-LRU entry on the LRU list");
    if (e.readers != 0) return fail("locked entry on the LRU list");
    if (e.prev != prev) return fail("LRU back link broken");
    prev = cur;
    if (++seen_lru > entries_.size()) return fail("LRU cycle");
  }
  if (prev != lru_tail_) return fail("LRU tail wrong");
  if (seen_lru != lru_size_) return fail("LRU size wrong");
  uint64_t readers = 0;
  for (size_t i = 0; i < locked_.size(); ++i) {
    const entry& e = entries_[locked_[i]];
    if (e.at != where::locked || e.list_pos != i) return fail("locked list broken");
    if (e.readers == 0) return fail("locked entry without readers");
    readers += e.readers;
  }
  if (readers != outstanding_readers_) return fail("reader count drifted");
  for (size_t i = 0; i < reserved_.size(); ++i) {
    const entry& e = entries_[reserved_[i]];
    if (e.at != where::reserved || e.list_pos != i) return fail("reserved list broken");
    if (e.readers != 0) return fail("reserved entry with readers");
  }
  if (seen_lru + locked_.size() + reserved_.size() != live_)
    return fail("entries not accounted for by the lists");
  // Entries <-> pool.
  if (pool_.slots_used() != live_) return fail("pool slots in use != live entries");
  std::vector<uint8_t> slot_seen(pool_.slot_ids(), 0);
  uint64_t bytes = 0;
  size_t live = 0;
  for (const entry& e : entries_) {
    if (e.at == where::free) continue;
    ++live;
    if (!pool_.in_use(e.slot)) return fail("entry slot not in use in the pool");
    if (slot_seen[e.slot]++) return fail("two entries share a slot");
    if (e.bytes == 0 || e.bytes != pool_.slot_bytes(e.slot)) return fail("entry size != slot size");
    bytes += e.bytes;
  }
  if (live != live_) return fail("live count wrong");
  if (bytes != bytes_used_) return fail("bytes_used drifted");
  return {};
}

} // namespace kvs
