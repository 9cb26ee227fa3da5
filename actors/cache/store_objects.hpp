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

store_objects_page list_objects(store_self self, const store_list_objects& q);
store_deleted delete_objects(store_self self, const store_delete_objects& q);
store_locked_chunks lock_chunks(store_self self, const store_lock_chunks& q);
void unlock_chunks(store_self self, const store_unlock_chunks& q);

} // namespace kvs
