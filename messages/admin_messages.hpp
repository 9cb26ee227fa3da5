// The control plane's requests to the store (GET /status, POST
// /cache/clear, /quota...: admin/admin_routes.hpp, admin/admin_actor.cpp).
// Answered on the store's own thread, between its other messages.
#pragma once

#include "cache/chunk_index.hpp"
#include "cache/salt_quota.hpp"

#include <cstddef>

#include <cstdint>
#include <string>
#include <vector>

namespace kvs {

/// One L1 chunk as GET /cache/objects shows it (and as lock_chunks hands it).
struct stored_object {
  chunk_key key;
  uint64_t bytes = 0;
  std::string model; ///< "" when not known (the rank-0 chunk of its hash left L1)
  std::string salt;
  bool locked = false;
  bool found = false;            ///< lock_chunks: the chunk is in L1 and now read-locked
  const std::byte* data = nullptr; ///< lock_chunks: its bytes, valid while locked
};

struct store_admin {
  enum class op : uint8_t {
    status,       ///< L1 figures for /status
    clear_l1,     ///< drop every unlocked chunk (BlockRemoved / records as CLEAR)
    quota_list,   ///< every salt with a limit, with its usage
    quota_get,    ///< one salt
    quota_set,    ///< set `salt`'s limit to limit_bytes (then enforce it)
    quota_delete, ///< remove `salt`'s limit (then enforce the allowlist rule)
    list_objects,   ///< a page of committed L1 chunks matching the filter (store_objects.cpp)
    delete_objects, ///< drop the unlocked chunks matching the filter; announce them
    lock_chunks,    ///< read-lock `keys` for a checksum (unlock_chunks gives them back)
    unlock_chunks,  ///< release `tokens`
  };
  op what = op::status;
  std::string salt;
  uint64_t limit_bytes = 0;
  // list_objects / delete_objects: the filter (unset: any), and the page.
  bool by_model = false, by_salt = false;
  std::string model; ///< with by_model (`salt` above with by_salt)
  uint64_t cursor = 0;
  uint32_t limit = 0;
  /// delete_objects by key (LMCache's body): key, model and salt of each.
  bool by_keys = false;
  std::vector<stored_object> named;
  /// lock_chunks: the chunks asked for; unlock_chunks: their locks.
  std::vector<chunk_key> keys;
  std::vector<lock_token> tokens;
};

struct store_admin_reply {
  // status
  uint64_t chunks = 0, reserved = 0, locked_chunks = 0, locks = 0;
  uint64_t used_bytes = 0, capacity_bytes = 0;
  uint64_t sessions = 0, instances = 0;
  uint64_t stored = 0, evicted = 0, lookups = 0, hit_chunks = 0;
  uint64_t events_dropped = 0, reannounced = 0, quota_evicted = 0;
  bool l2 = false; ///< an L2 tier is configured: the figures below mean something
  uint64_t l2_prefetches = 0, l2_prefetched_chunks = 0, l2_prefetch_failures = 0;
  uint64_t l2_write_skipped = 0, l2_queued_bytes = 0;
  bool quota_isolated = false;
  // list_objects: the page, and where the next starts (done: no next).
  std::vector<stored_object> objects;
  uint64_t next_cursor = 0;
  bool done = true;
  /// delete_objects: matching chunks kept because a reader holds them.
  uint64_t locked = 0;
  std::vector<lock_token> tokens; ///< lock_chunks
  // clear_l1, delete_objects: chunks dropped; quota_set/delete: chunks evicted by the quota
  uint64_t removed = 0;
  // quota_*: the salts asked about
  std::vector<salt_usage> salts;
  /// quota_get: the salt has a limit; quota_delete: it had one;
  /// quota_set: false when salt_quota_max_limits salts have one already.
  bool ok = false;
};

} // namespace kvs
