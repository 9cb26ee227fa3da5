#include "actors/cache/event_announce.hpp"

#include <fmt/format.h>

#include <ctime>

namespace kvs {

double wall_seconds() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

kv_event chunk_stored(uint64_t hash, std::optional<uint64_t> parent, std::vector<int64_t> tokens,
                      int64_t block_size, const char* medium) {
  block_stored e;
  e.block_hashes.push_back(hash);
  e.parent_block_hash = parent;
  e.token_ids = std::move(tokens);
  e.block_size = block_size;
  e.medium = medium;
  return e;
}

std::string dropped_suffix(uint64_t before, uint64_t dropped) {
  return dropped > before ? fmt::format(" ({} batches dropped: relay queue full)", dropped - before)
                          : std::string{};
}

} // namespace kvs
