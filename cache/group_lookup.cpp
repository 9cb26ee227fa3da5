#include "cache/group_lookup.hpp"

#include "cache/chunk_hash.hpp"

#include <algorithm>

namespace kvs {

std::string group_session(const std::string& session, uint32_t g) {
  if (g == 0)
    return session;
  // LMCache request ids are printable: the 0x1f separator keeps a group's
  // name apart from every request's own.
  return session + '\x1f' + std::to_string(g);
}

namespace {

/// Group g's part of chunk c is committed in L1 on every rank (or c < base).
bool part_present(const chunk_index& index, const std::vector<uint64_t>& hashes, uint32_t g, size_t c,
             int world_size, size_t base) {
  if (c < base)
    return true;
  const uint64_t h = group_hash(hashes[c], g);
  for (int r = 0; r < std::max(world_size, 1); ++r) {
    auto e = index.find(chunk_key{h, r});
    if (!e || e->state != entry_state::committed)
      return false;
  }
  return true;
}

} // namespace

size_t group_run_end(const chunk_index& index, const std::vector<uint64_t>& hashes, uint32_t g,
                     int world_size, size_t base) {
  size_t c = 0;
  while (c < hashes.size() && part_present(index, hashes, g, c, world_size, base))
    ++c;
  return c;
}

std::vector<size_t> group_chunks_missing(const chunk_index& index, const std::vector<uint64_t>& hashes,
                                         uint32_t g, size_t from, size_t to, int world_size,
                                         size_t base) {
  std::vector<size_t> out;
  for (size_t c = from; c < std::min(to, hashes.size()); ++c)
    if (!part_present(index, hashes, g, c, world_size, base))
      out.push_back(c);
  return out;
}

size_t lookup_groups(chunk_index& index, lock_ledger& ledger, const std::string& session,
                     const std::vector<uint64_t>& hashes, const std::vector<int32_t>& windows,
                     int world_size, uint32_t readers_per_key, cache_clock::time_point now,
                     size_t base) {
  const size_t n = hashes.size();
  base = std::min(base, n);
  auto present = [&](uint32_t g, size_t c) {
    return part_present(index, hashes, g, c, world_size, base);
  };
  // Full-attention groups bound the hit by their leading run.
  size_t bound = n;
  for (uint32_t g = 0; g < windows.size(); ++g)
    if (windows[g] < 0) {
      size_t c = 0;
      while (c < bound && present(g, c))
        ++c;
      bound = c;
    }
  // Windowed groups: the run of present chunks ending at each chunk.
  std::vector<std::vector<uint32_t>> runs(windows.size());
  for (uint32_t g = 0; g < windows.size(); ++g)
    if (windows[g] >= 0) {
      runs[g].resize(bound);
      uint32_t run = 0;
      for (size_t c = 0; c < bound; ++c) {
        run = present(g, c) ? run + 1 : 0;
        runs[g][c] = run;
      }
    }
  size_t hit = 0;
  for (size_t len = bound; len > 0 && hit == 0; --len) {
    bool ok = true;
    for (uint32_t g = 0; g < windows.size() && ok; ++g)
      if (windows[g] >= 0)
        ok = runs[g][len - 1] >= std::min<size_t>(static_cast<size_t>(windows[g]), len);
    if (ok)
      hit = len;
  }
  // Every group's session is looked up again (releasing what an earlier
  // lookup of the request held), locking exactly its in-window chunks.
  std::vector<uint64_t> group_hashes;
  size_t locked_hit = hit;
  for (uint32_t g = 0; g < windows.size(); ++g) {
    size_t lo = windows[g] < 0 ? 0 : hit - std::min<size_t>(static_cast<size_t>(windows[g]), hit);
    lo = std::max(lo, std::min(base, hit));
    group_hashes.clear();
    for (size_t c = lo; c < hit; ++c)
      group_hashes.push_back(group_hash(hashes[c], g));
    const size_t got = ledger.lookup(group_session(session, g), group_hashes.data(),
                                     group_hashes.size(), world_size, readers_per_key, now, lo);
    // All present a moment ago in this same turn: a shortfall cannot happen
    // single-threaded; if it ever did, the hit ends where the locks do.
    if (lo + got < hit)
      locked_hit = std::min(locked_hit, lo + got);
  }
  return locked_hit;
}

} // namespace kvs
