// l2: see actors/interfaces.hpp. The backends themselves are l2/ (one
// l2_backend each: l2/lru_folder, l2/redis_backend); this actor owns them on
// its own thread, loops over them, and speaks to the store by messages.
#pragma once

#include "actors/interfaces.hpp"
#include "core/admit_budget.hpp"
#include "core/cache_event_sink.hpp"
#include "l2/l2_backend.hpp"
#include "l2/l2_quota.hpp"
#include "relay/relay_queue.hpp"

#include <chrono>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace kvs {

/// Fetch buffers the store hands back after copying them into L1 are kept
/// for the next fetch (a GET or file read into mapped memory instead of a
/// fresh allocation that page-faults per 4 KiB). Up to this many bytes: an
/// 8-chunk prompt of 4 MiB chunks on two ranks; beyond, they are freed.
inline constexpr uint64_t l2_spare_max_bytes = uint64_t{64} << 20;
/// Smaller buffers are not worth keeping (malloc reuses them anyway).
inline constexpr uint64_t l2_spare_min_bytes = uint64_t{64} << 10;

/// Rank-0 chunks the L2 actor remembers having announced, to announce them
/// again after an AllBlocksCleared (their tokens and parent are not in the
/// tiers' objects). Past it the oldest are forgotten (counted): ~1.1 KiB
/// each at 256-token chunks, ~70 MiB at most.
inline constexpr size_t l2_reannounce_max_chunks = 65536;

/// One remembered chunk: what its BlockStored said, and where it went.
struct l2_announced {
  uint64_t hash = 0;
  std::optional<uint64_t> parent;
  std::vector<int64_t> tokens;
  /// Its rank-0 object's name in each backend (by index); empty: not there.
  std::vector<std::string> names;
};

struct l2_params {
  /// Opened before spawning (app/l2_backends.cpp), in lookup order: a fetch
  /// takes each shard from the first backend holding it.
  std::vector<std::shared_ptr<l2_backend>> backends;
  /// l2.format = "lmcache": chunks found in L2 that nobody here announced
  /// (an LMCache node wrote them) are announced when fetched.
  bool announce_found = false;
  /// l2.quota_mode = "isolated": a quota pass over every backend each
  /// quota_interval (l2/l2_quota.hpp), limits from [cache.quotas] at first.
  bool quota_isolated = false;
  l2_quota_rule quota_rule;
  std::chrono::nanoseconds quota_interval{};
  l2_quota_limits quota_limits;
  std::shared_ptr<admit_budget> queue; ///< the store admits, this actor releases (store_l2.hpp)
  int64_t chunk_size = 0;             ///< cache.chunk_size (BlockStored's block_size)
  publisher_actor events;             ///< may be null
  relay_queue_ptr events_queue;
  std::chrono::nanoseconds stats_interval{};
  /// [coordinator] event_reporting: every object written or dropped, in
  /// LMCache's key form (app/coordinator_events); null: not reported.
  std::shared_ptr<cache_event_sink> coordinator;
};

/// What the actor keeps per backend.
struct l2_backend_state {
  uint64_t fetched = 0; ///< shards a fetch took from it
  /// Rank-0 objects this actor announced, by name, with the chunk hash
  /// their removal is announced under.
  std::unordered_map<std::string, uint64_t> announced;
  /// Rank-0 objects routers were never told of (a hybrid model's groups
  /// above 0, l2_write::quiet): their removal is not announced.
  std::unordered_set<std::string> quiet;
  std::vector<uint64_t> removed; ///< announced rank-0 hashes it dropped, to announce gone
};

struct l2_state {
  static inline const char* name = "l2";
  l2_params p;
  std::string label;
  std::vector<l2_backend_state> at; ///< per backend, as p.backends
  uint64_t written_chunks = 0;
  uint64_t events_dropped = 0;
  /// LMCache's format: chunks found in L2 that nobody here announced (an
  /// LMCache node wrote them), announced when fetched.
  uint64_t found_announced = 0;
  uint64_t quota_evicted = 0; ///< objects the quota passes erased
  uint64_t quota_passes = 0;
  std::vector<std::string> spare;     ///< fetch buffers handed back (l2_spare_max_bytes)
  uint64_t spare_bytes = 0;           ///< their capacity, summed
  uint64_t buffers_reused = 0;        ///< fetch reads that went into a spare buffer
  /// Announced chunks, oldest first (a parent before its child), and where
  /// each is in that list: announced again after an AllBlocksCleared.
  std::list<l2_announced> announced;
  std::unordered_map<uint64_t, std::list<l2_announced>::iterator> announced_at;
  uint64_t reannounced = 0; ///< BlockStored events sent again after AllBlocksCleared (one per medium)
  uint64_t forgotten = 0;   ///< remembered chunks dropped past l2_reannounce_max_chunks
  bool reannounce_queued = false; ///< a reannounce is in the mailbox: later clears join it
  uint64_t clears = 0;            ///< AllBlocksCleared the publisher told of
  uint64_t reannounce_rounds = 0; ///< announcements again (clears queued together share one)
};

/// Spawned detached by app/cache_tree.cpp (spawn_l2); app/l2_backends.cpp opens the backends.
/// The L2 actor's stats line and /metrics (kvsidecar_l2_*), from one place.
stats_snapshot snapshot(const l2_state& st);

l2_actor::behavior_type l2_tier(l2_actor::stateful_pointer<l2_state> self, l2_params params);

} // namespace kvs
