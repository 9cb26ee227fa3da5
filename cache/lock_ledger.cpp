#include "cache/lock_ledger.hpp"

#include <algorithm>

namespace kvs {

lock_ledger::lock_ledger(chunk_index& index, ledger_options opts)
    : index_(index), opts_(opts) {}

size_t lock_ledger::lookup(const std::string& session, const uint64_t* hashes,
                           size_t n, int world_size, uint32_t readers_per_key,
                           cache_clock::time_point now, size_t base) {
  session_locks& s = sessions_[session];
  // A repeated lookup replaces the earlier one: its locks must not leak.
  release_all(s);
  s.hashes.clear();
  s.holds.clear();
  s.base = base;
  s.world_size = std::max(world_size, 0);
  s.last_active = now;
  if (world_size < 1 || readers_per_key == 0) return 0;

  const size_t hit = index_.lookup_prefix(hashes, n, world_size);
  const size_t ws = static_cast<size_t>(world_size);
  s.hashes.assign(hashes, hashes + hit);
  s.holds.resize(hit * ws);
  size_t locked = 0;
  for (; locked < hit; ++locked) {
    bool all = true;
    for (int r = 0; r < world_size; ++r) {
      auto t = index_.lock(chunk_key{hashes[locked], r}, readers_per_key, now);
      if (!t) {
        all = false;
        break;
      }
      s.holds[locked * ws + r] = hold{t->epoch, readers_per_key};
      held_readers_ += readers_per_key;
    }
    if (!all) break;
  }
  if (locked < hit) {
    // Cannot happen single-threaded right after lookup_prefix; if it ever
    // does, keep the invariant: hand back the partial chunk, shorten the hit.
    for (int r = 0; r < world_size; ++r) release(s, base + locked, r, UINT32_MAX);
    s.hashes.resize(locked);
    s.holds.resize(locked * ws);
  }
  return locked;
}

size_t lock_ledger::release(session_locks& s, size_t chunk, int rank,
                            uint32_t readers) {
  if (chunk < s.base || chunk - s.base >= s.hashes.size()) return 0;
  chunk -= s.base;
  hold& h = s.holds[chunk * static_cast<size_t>(s.world_size) + rank];
  const uint32_t n = std::min(readers, h.remaining);
  if (n == 0) return 0;
  h.remaining -= n;
  held_readers_ -= n;
  // A stale token (the index expired the lock) releases nothing there, and
  // that is right: the readers are gone already.
  index_.unlock(lock_token{chunk_key{s.hashes[chunk], rank}, h.epoch}, n);
  return n;
}

size_t lock_ledger::release_all(session_locks& s) {
  size_t n = 0;
  for (size_t c = s.base; c < s.base + s.hashes.size(); ++c)
    for (int r = 0; r < s.world_size; ++r) n += release(s, c, r, UINT32_MAX);
  return n;
}

size_t lock_ledger::release_rank(const std::string& session, int rank,
                                 size_t chunk_begin, size_t chunk_end,
                                 cache_clock::time_point now, uint32_t readers) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return 0;
  session_locks& s = it->second;
  s.last_active = now;
  if (rank < 0 || rank >= s.world_size) return 0;
  chunk_begin = std::max(chunk_begin, s.base);
  chunk_end = std::min(chunk_end, s.base + s.hashes.size());
  size_t n = 0;
  for (size_t c = chunk_begin; c < chunk_end; ++c) n += release(s, c, rank, readers);
  return n;
}

size_t lock_ledger::release_range(const std::string& session, size_t chunk_begin,
                                  size_t chunk_end, cache_clock::time_point now) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return 0;
  session_locks& s = it->second;
  s.last_active = now;
  chunk_begin = std::max(chunk_begin, s.base);
  chunk_end = std::min(chunk_end, s.base + s.hashes.size());
  size_t n = 0;
  for (size_t c = chunk_begin; c < chunk_end; ++c)
    for (int r = 0; r < s.world_size; ++r) n += release(s, c, r, UINT32_MAX);
  return n;
}

size_t lock_ledger::end_session(const std::string& session) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return 0;
  const size_t n = release_all(it->second);
  sessions_.erase(it);
  return n;
}

size_t lock_ledger::expire_sessions(cache_clock::time_point now) {
  size_t ended = 0;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->second.last_active + opts_.session_ttl <= now) {
      release_all(it->second);
      it = sessions_.erase(it);
      ++ended;
    } else {
      ++it;
    }
  }
  return ended;
}

bool lock_ledger::has_session(const std::string& session) const {
  return sessions_.count(session) != 0;
}

size_t lock_ledger::locked_end(const std::string& session) const {
  auto it = sessions_.find(session);
  return it == sessions_.end() ? 0 : it->second.base + it->second.hashes.size();
}

void lock_ledger::for_each_held(
    const std::function<void(const std::string&, const lock_token&, uint32_t)>&
        fn) const {
  for (const auto& [name, s] : sessions_) {
    for (size_t c = 0; c < s.hashes.size(); ++c) {
      for (int r = 0; r < s.world_size; ++r) {
        const hold& h = s.holds[c * static_cast<size_t>(s.world_size) + r];
        if (h.remaining)
          fn(name, lock_token{chunk_key{s.hashes[c], r}, h.epoch}, h.remaining);
      }
    }
  }
}

} // namespace kvs
