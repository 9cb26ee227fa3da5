// store: see actors/interfaces.hpp.
#pragma once

#include "actors/interfaces.hpp"
#include "relay/relay_queue.hpp"
#include "actors/cache/store_coordinator.hpp"
#include "actors/cache/store_l2.hpp"
#include "cache/chunk_index.hpp"
#include "cache/lock_ledger.hpp"
#include "cache/salt_quota.hpp"
#include "cache/slot_pool.hpp"

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvs {

/// Filled from the config (app/cache_tree.cpp): no defaults of its own.
struct store_params {
  std::shared_ptr<slot_pool> pool; ///< allocated (and pinned) before spawning
  int64_t chunk_size = 0;  ///< cache.chunk_size (BlockStored's block_size)
  double evict_high = 0;   ///< cache.evict_high
  double evict_low = 0;    ///< cache.evict_low
  std::chrono::nanoseconds lock_ttl{};
  publisher_actor events;   ///< may be null: announce nothing
  relay_queue_ptr events_queue;
  std::chrono::nanoseconds stats_interval{};
  store_l2_link l2;         ///< L2 tiers (actor null: none)
  bool quota_isolated = false; ///< cache.quota_mode = "isolated"
  std::vector<std::pair<std::string, uint64_t>> quotas; ///< [cache.quotas]: salt, bytes
  /// The L1 fault-ahead (actors/cache/l1_prefault.hpp; null: none): the
  /// store links to it and nudges it as slots are handed out.
  caf::actor l1_prefault;
  /// Faults in the extents engine-driven arenas claim ahead of need
  /// (actors/cache/arena_prefault.hpp; null: arenas are not claimed ahead).
  caf::actor arena_prefault;
  /// [coordinator] event_reporting: L1 placements and reads in LMCache's
  /// key form (store_coordinator.hpp); null: not reported.
  std::shared_ptr<cache_event_sink> coordinator;
};

struct store_state {
  static inline const char* name = "store";

  /// What a RETRIEVE pinned, until its copy is over.
  struct read_ticket {
    std::string session;
    int32_t rank = 0;
    size_t begin = 0;
    size_t end = 0;
    std::vector<lock_token> locks;
  };

  store_params p;
  std::string label;
  std::unique_ptr<chunk_index> index;
  std::unique_ptr<lock_ledger> ledger;
  std::unordered_map<uint64_t, read_ticket> tickets;
  /// Registered instance -> bytes per chunk per rank (its slot size).
  std::unordered_map<int64_t, size_t> chunk_bytes;
  /// Engine-driven instances writing L1 in place -> their L1 arena
  /// (cache/slot_pool.hpp): their stores reserve slots there, their
  /// retrieves read their own chunks there without a copy.
  std::unordered_map<int64_t, arena_id> arenas;
  /// Registered instance -> the (model, world_size) it registered: an L2
  /// prefetch expects the chunk size of the model's own instances.
  std::unordered_map<int64_t, std::pair<std::string, int64_t>> instance_model;
  /// Multi-group (hybrid-KV) instances: every group's chunk bytes, and the
  /// (model, world_size) they registered; LOOKUPs of such a model use its
  /// groups' windows (cache/group_lookup.hpp) while an instance of it is
  /// registered; sessions that looked up more than one group hold their
  /// other groups' locks under group_session names.
  struct group_model {
    model_groups groups;
    std::set<int64_t> instances;
  };
  std::unordered_map<int64_t, std::vector<size_t>> group_bytes;
  std::unordered_map<int64_t, std::pair<std::string, int64_t>> group_instance_model;
  std::map<std::pair<std::string, int64_t>, group_model> group_models;
  std::unordered_map<std::string, uint32_t> session_groups;
  /// subscribe_kv_events: where records go (null: nowhere), and the model of
  /// each committed rank-0 chunk (an eviction's record names it).
  engine_bridge_actor records_sink;
  /// Where CLEAR's reply goes (the router passes it on from the bridge).
  engine_bridge_actor bridge;
  std::vector<std::string> models;
  std::unordered_map<std::string, uint32_t> model_ids;
  std::unordered_map<uint64_t, uint32_t> chunk_model;
  uint64_t next_ticket = 1;

  /// What each rank-0 chunk in L1 was announced with (kept only with a
  /// publisher), to announce it again after the rank's AllBlocksCleared:
  /// its place in commit order (a parent was committed before its child),
  /// its parent and its token ids (8 bytes a token: 2 KiB for a 256-token
  /// chunk, beside the chunk's own hundreds of KiB).
  struct announced_chunk {
    uint64_t order = 0;
    std::optional<uint64_t> parent;
    std::vector<int64_t> tokens;
  };
  std::unordered_map<uint64_t, announced_chunk> announced;
  std::map<uint64_t, uint64_t> announce_order; ///< order -> hash, oldest first
  uint64_t next_order = 0;
  uint64_t reannounced = 0; ///< chunks announced again after an AllBlocksCleared

  /// L1 bytes per cache_salt and the per-salt limits (store_quota.cpp).
  salt_quota quota;
  /// LMCache's keys of the chunks reported to the coordinator.
  store_l1_keys l1_keys{nullptr};
  uint64_t quota_evicted = 0; ///< chunks evicted to keep a salt within its limit

  size_t prefault_nudged = 0; ///< the pool's high water at the last nudge

  uint64_t stored = 0;
  uint64_t evicted = 0;
  uint64_t refused = 0;
  uint64_t events_dropped = 0;
};

/// The stats line's and /metrics' view of the store.
stats_snapshot snapshot(const store_state& st);

store_actor::behavior_type store(store_actor::stateful_pointer<store_state> self,
                                 store_params params);

/// Counts evicted chunks and announces BlockRemoved "CPU" for rank 0's
/// (also used by the L2 prefetch, actors/cache/store_l2.cpp).
void announce_evicted(store_actor::stateful_pointer<store_state> self,
                      const std::vector<chunk_key>& keys);

} // namespace kvs
