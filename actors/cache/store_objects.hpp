// The store's side of GET/DELETE /cache/objects and POST /cache/checksums
// (admin/admin_routes.hpp): pages of L1 chunks with what the store knows
// of each (model, cache_salt, size, lock), removal by model/salt filter
// (announced as evictions: BlockRemoved for routers), and read locks that
// keep a chunk's bytes in place while the HTTP side hashes them off the
// store's thread.
#pragma once

#include "actors/cache/store_admin.hpp"

namespace kvs {

/// At most this many entries are looked at per listing page, so one page
/// never holds the store for long whatever the filter matches.
inline constexpr size_t objects_scan_budget = 1u << 20;

void list_objects(store_self self, const store_admin& q, store_admin_reply& out);
void delete_objects(store_self self, const store_admin& q, store_admin_reply& out);
void lock_chunks(store_self self, const store_admin& q, store_admin_reply& out);
void unlock_chunks(store_self self, const store_admin& q);

} // namespace kvs
