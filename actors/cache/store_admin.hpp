// The store's side of the HTTP control plane: /status figures, the clear
// of L1 (LMCache's CLEAR op's too), and the per-cache_salt quotas (cache/salt_quota.hpp) it keeps -- counted
// on every commit and removal, enforced after each store when
// cache.quota_mode = "isolated".
#pragma once

#include "actors/cache/store.hpp"
#include "messages/admin_messages.hpp"

#include <string>
#include <vector>

namespace kvs {

using store_self = store_actor::stateful_pointer<store_state>;

/// Fills the quota table from [cache.quotas] (at spawn).
void quota_init(store_state& st);

/// A chunk entered L1 under `salt` (its bytes read from the index).
void quota_committed(store_state& st, chunk_key k, const std::string& salt);

/// Evicts what each of `salts` holds beyond its enforced limit (its own
/// least recently used unlocked chunks), announcing them as any eviction.
/// Returns the number evicted.
uint64_t quota_enforce(store_self self, const std::vector<std::string>& salts);

/// Drops every unlocked chunk of L1; announces them (BlockRemoved, records
/// as CLEAR) and logs the count with `who` asked. Returns the count. The one
/// L1 clear: the HTTP control plane's and LMCache's CLEAR op alike.
uint64_t clear_l1(store_self self, const char* who);

/// GET /status: L1's figures.
store_status status_of(const store_state& st);

/// The /quota calls.
store_quota_reply on_quota(store_self self, const store_quota_list& q);
store_quota_reply on_quota(store_self self, const store_quota_get& q);
store_quota_reply on_quota(store_self self, const store_quota_set& q);
store_quota_reply on_quota(store_self self, const store_quota_delete& q);

/// Per-salt gauges for /metrics: the quota_metric_salts largest salts by
/// bytes, the rest summed under salt="_other" (a bounded label set).
void quota_snapshot(const store_state& st, stats_snapshot& s);
inline constexpr size_t quota_metric_salts = 16;

} // namespace kvs
