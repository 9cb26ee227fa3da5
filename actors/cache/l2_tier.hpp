// l2: see actors/interfaces.hpp. The tiers themselves are l2/disk_tier and
// l2/redis_client; this actor owns them on its own thread and speaks to the
// store by messages.
#pragma once

#include "actors/interfaces.hpp"
#include "core/admit_budget.hpp"
#include "l2/disk_tier.hpp"
#include "l2/lmcache_dir_tier.hpp"
#include "l2/redis_client.hpp"
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

/// Media announced for chunks held in L2 (see README, "L2 tiers").
inline constexpr const char* l2_disk_medium = "DISK";
inline constexpr const char* l2_redis_medium = "SHARED";

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

/// One L2 object (a chunk's shard on one rank) as each tier names it, in
/// the configured format (l2_params::lmcache_format).
struct l2_ref {
  l2_object_id id;       ///< kvsidecar's format: the disk tier's key and header
  std::string file;      ///< LMCache's format: the file in the folder
  std::string redis_key;
  bool named = true;     ///< LMCache's format: false when the chunk has no LMCache hash
};

/// One remembered chunk: what its BlockStored said, and where it went.
struct l2_announced {
  uint64_t hash = 0;
  std::optional<uint64_t> parent;
  std::vector<int64_t> tokens;
  l2_ref disk_ref; ///< as written to disk (rank 0)
  bool on_disk = false;
  std::string redis_key; ///< empty: not in Redis
};

struct l2_params {
  /// l2.format = "lmcache": objects named, hashed and laid out as LMCache's
  /// (l2/lmcache_object_name.hpp); the disk tier is then `lmcache_dir`.
  bool lmcache_format = false;
  std::shared_ptr<disk_tier> disk;    ///< opened before spawning (null: no disk tier)
  std::shared_ptr<lmcache_dir_tier> lmcache_dir; ///< the same, in LMCache's fs layout
  std::optional<redis_options> redis; ///< nullopt: no Redis tier
  std::string key_prefix;
  std::shared_ptr<admit_budget> queue; ///< the store admits, this actor releases (store_l2.hpp)
  int64_t chunk_size = 0;             ///< cache.chunk_size (BlockStored's block_size)
  publisher_actor events;             ///< may be null
  relay_queue_ptr events_queue;
  std::chrono::nanoseconds stats_interval{};
};

struct l2_state {
  static inline const char* name = "l2";
  l2_params p;
  std::string label;
  std::unique_ptr<redis_client> redis;
  uint64_t written_chunks = 0;
  uint64_t fetched_disk = 0;
  uint64_t fetched_redis = 0;
  uint64_t redis_rejected = 0; ///< values that failed their header (or, LMCache's format, length) check
  uint64_t events_dropped = 0;
  std::vector<uint64_t> disk_removed; ///< rank-0 hashes evicted from disk, to announce
  /// Rank-0 hashes on disk that routers were never told of (a hybrid
  /// model's groups above 0, l2_write::quiet): their eviction is not
  /// announced. As many as such objects on disk; gone with each one.
  std::unordered_set<uint64_t> disk_quiet;
  /// LMCache's format: rank-0 files this actor announced, by name, with the
  /// chunk hash their eviction is announced under (files another writer
  /// put there were never announced).
  std::unordered_map<std::string, uint64_t> dir_announced;
  /// LMCache's format: chunks found in L2 that nobody here announced (an
  /// LMCache node wrote them), announced when fetched.
  uint64_t found_announced = 0;
  std::string last_redis_error;       ///< logged once per distinct error
  std::vector<std::string> spare;     ///< fetch buffers handed back (l2_spare_max_bytes)
  uint64_t spare_bytes = 0;           ///< their capacity, summed
  uint64_t buffers_reused = 0;        ///< fetch reads that went into a spare buffer
  uint64_t seen_no_space = 0, seen_io_errors = 0, seen_rejected = 0; ///< disk faults logged once
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

/// Spawned detached by app/cache_tree.cpp (spawn_l2), which opens the tiers.
/// The L2 actor's stats line and /metrics (kvsidecar_l2_*), from one place.
stats_snapshot snapshot(const l2_state& st);

l2_actor::behavior_type l2_tier(l2_actor::stateful_pointer<l2_state> self, l2_params params);

} // namespace kvs
