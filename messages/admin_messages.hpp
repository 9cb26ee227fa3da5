// The control plane's requests to the store (GET /status, POST
// /cache/clear, /quota, /cache/objects, /cache/checksums:
// admin/admin_routes.hpp, admin/admin_actor.cpp), one message per
// operation, each with its own reply. Answered on the store's own thread,
// between its other messages.
#pragma once

#include "cache/chunk_index.hpp"
#include "cache/salt_quota.hpp"

#include <cstddef>

#include <cstdint>
#include <string>
#include <vector>

namespace kvs {

/// One L1 chunk as GET /cache/objects shows it (and as store_lock_chunks hands it).
struct stored_object {
  chunk_key key;
  uint64_t bytes = 0;
  std::string model; ///< "" when not known (the rank-0 chunk of its hash left L1)
  std::string salt;
  bool locked = false;
  bool found = false;            ///< store_lock_chunks: the chunk is in L1 and now read-locked
  const std::byte* data = nullptr; ///< store_lock_chunks: its bytes, valid while locked
};

/// GET /status: L1's figures.
struct store_status_query {};
struct store_status {
  uint64_t chunks = 0, reserved = 0, locked_chunks = 0, locks = 0;
  uint64_t used_bytes = 0, capacity_bytes = 0;
  uint64_t sessions = 0, instances = 0;
  uint64_t stored = 0, evicted = 0, lookups = 0, hit_chunks = 0;
  uint64_t events_dropped = 0, reannounced = 0, quota_evicted = 0;
  bool l2 = false; ///< an L2 tier is configured: the figures below mean something
  uint64_t l2_prefetches = 0, l2_prefetched_chunks = 0, l2_prefetch_failures = 0;
  uint64_t l2_write_skipped = 0, l2_queued_bytes = 0;
  bool quota_isolated = false;
};

/// POST /cache/clear of L1: drop every unlocked chunk (BlockRemoved, records
/// as CLEAR). Answered with the count dropped.
struct store_clear_l1 {};

/// GET /quota: every salt with a limit, with its usage.
struct store_quota_list {};
/// GET /quota/{salt}
struct store_quota_get {
  std::string salt;
};
/// PUT /quota/{salt}: set its limit (then enforce it).
struct store_quota_set {
  std::string salt;
  uint64_t limit_bytes = 0;
};
/// DELETE /quota/{salt}: remove its limit (then enforce the allowlist rule).
struct store_quota_delete {
  std::string salt;
};
/// The answer to every quota message.
struct store_quota_reply {
  /// The salts asked about (list: every limited one; the others: the one).
  std::vector<salt_usage> salts;
  /// get: the salt has a limit; delete: it had one; set: false when
  /// salt_quota_max_limits salts have one already; list: true.
  bool ok = false;
  uint64_t evicted = 0; ///< set / delete: chunks evicted by the quota
};

/// /cache/objects' filter on L1 (unset: any).
struct store_objects_filter {
  bool by_model = false, by_salt = false;
  std::string model; ///< with by_model
  std::string salt;  ///< with by_salt
};
/// GET /cache/objects tier l1: a page of committed chunks matching the
/// filter (actors/cache/store_objects.cpp).
struct store_list_objects {
  store_objects_filter filter;
  uint64_t cursor = 0;
  uint32_t limit = 0;
};
struct store_objects_page {
  std::vector<stored_object> objects;
  uint64_t next_cursor = 0;
  bool done = true; ///< no next page
};
/// DELETE /cache/objects tier l1: drop the unlocked chunks matching the
/// filter, or the ones named (LMCache's keys: key, model and salt of each);
/// announce them.
struct store_delete_objects {
  store_objects_filter filter;
  bool by_keys = false;
  std::vector<stored_object> named;
};
struct store_deleted {
  uint64_t removed = 0;
  uint64_t locked = 0; ///< matching chunks kept because a reader holds them
};
/// POST /cache/checksums: read-lock `keys` while the admin actor hashes
/// them (store_unlock_chunks gives them back).
struct store_lock_chunks {
  std::vector<chunk_key> keys;
};
struct store_locked_chunks {
  std::vector<stored_object> objects; ///< one per key asked, found or not
  std::vector<lock_token> tokens;
};
struct store_unlock_chunks {
  std::vector<lock_token> tokens;
};

} // namespace kvs
