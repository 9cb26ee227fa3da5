// The store's side of the L2 tiers: write-through of committed chunks and
// prefetch on LOOKUP. Kept out of actors/cache/store.cpp, which calls these from
// a few marked hooks.
#pragma once

#include "actors/interfaces.hpp"
#include "cache/group_lookup.hpp"
#include "core/admit_budget.hpp"

#include <caf/typed_response_promise.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

namespace kvs {

struct store_state;
using store_self = store_actor::stateful_pointer<store_state>;

/// What the store keeps for L2 (empty actor: no L2 configured).
struct store_l2_link {
  l2_actor actor;
  /// Bytes of chunk copies on their way to L2: admitted by l2_stage before
  /// the l2_write, released by the L2 actor once written. Past
  /// l2.queue_bytes a chunk is skipped (queued_skipped), never waited for.
  std::shared_ptr<admit_budget> queue;
  l2_write pending;           ///< chunks of the current store_finish, sent by l2_flush
  uint64_t queued_skipped = 0;   ///< chunks not written through: queue full
  uint64_t prefetches = 0;
  uint64_t prefetched_chunks = 0; ///< chunks loaded from L2 into L1
  uint64_t prefetch_failures = 0; ///< L2 actor errors/timeouts (served from L1 only)
  uint64_t next_fetch = 1;
  /// Session -> its prefetch in flight; END_SESSION erases it so a late reply
  /// takes no locks for a session that is gone.
  std::unordered_map<std::string, uint64_t> fetches;
};

/// STORE: chunk f.hashes[i] of rank f.rank was just committed: copy it for
/// the L2 write (skipped and counted when l2.queue_bytes is full).
void l2_stage(store_self self, const store_finish& f, size_t i);
/// One stats line (nothing without L2).
void l2_log_stats(store_self self);
/// Sends what l2_stage collected.
void l2_flush(store_self self);

/// LOOKUP found `l1_hits` chunks in L1 (locked). True when L2 should be
/// asked for the rest.
bool l2_wants_prefetch(store_self self, const store_lookup& q, uint64_t l1_hits);
/// Asks L2 for hashes[l1_hits..], loads the hit prefix into L1, relocks the
/// whole prefix for the session and delivers the total then.
caf::typed_response_promise<uint64_t> l2_prefetch(store_self self, store_lookup q,
                                                  uint64_t l1_hits);

/// A hybrid model's LOOKUP hit `l1_hit` chunks over L1 (every group's
/// windows locked). True when L2 should be asked for more.
bool l2_wants_group_prefetch(store_self self, const store_lookup& q, uint64_t l1_hit,
                             const model_groups& gm);
/// Asks L2 for each group's chunks a longer hit needs -- the full-attention
/// groups' after their L1 runs, then each windowed group's window ending
/// where those now end -- loads them into L1 in the group's format, looks
/// the model up again over L1 (cache/group_lookup.hpp: relocking every
/// group's in-window chunks) and delivers that hit.
caf::typed_response_promise<uint64_t> l2_prefetch_groups(store_self self, store_lookup q,
                                                         const model_groups& gm);

} // namespace kvs
