// Messages between the store and the L2 actor (actors/cache/l2_tier.hpp).
#pragma once

#include "core/object_key.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvs {

/// Write-through of committed L1 chunks of one rank. `bytes[i]` is a copy of
/// hashes[i]'s slot (the L1 slot may be evicted before the write happens);
/// `tokens`/`parents` are filled for rank 0 only, for BlockStored events.
struct l2_write {
  std::string model;
  std::string salt;
  uint64_t layout = 0; ///< slot size: what the bytes mean
  int32_t rank = 0;
  std::vector<uint64_t> hashes;
  std::vector<std::string> bytes;
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::optional<uint64_t>> parents;
  /// l2.format = "lmcache": LMCache's chunk hash of hashes[i] (32 bytes;
  /// cache/lmcache_token_hash.hpp), its object group and the key's world
  /// size (LMCache's kv_rank packs it). A chunk past names.size() has no
  /// LMCache name (a token outside uint32) and is not written.
  std::vector<std::string> names;
  uint32_t group = 0;
  int32_t world_size = 1;
  uint64_t queued_bytes = 0; ///< given back to the queue once written
  /// A hybrid model's group above 0: routers know none of these hashes, so
  /// neither the write nor the disk's later eviction of them is announced.
  bool quiet = false;
};

/// Prefetch: the longest prefix of `hashes` held in L2 for every rank
/// 0..world_size-1 (disk first, then Redis).
struct l2_fetch {
  std::string model;
  std::string salt;
  uint64_t layout = 0;
  int32_t world_size = 1;
  std::vector<uint64_t> hashes;
  /// l2.format = "lmcache": as l2_write::names / group; the fetch ends
  /// where names end.
  std::vector<std::string> names;
  uint32_t group = 0;
  /// LMCache's format, one-group models: the key's tokens from chunk 0
  /// (hashes[i] is chunk first_chunk + i) and the hash before hashes[0], so
  /// a chunk found in L2 that nobody announced (an LMCache node wrote it)
  /// is announced as DISK or SHARED. Null: nothing is announced.
  std::shared_ptr<const std::vector<uint32_t>> tokens;
  size_t first_chunk = 0;
  std::optional<uint64_t> parent;
};
struct l2_fetch_reply {
  size_t chunks = 0;              ///< length of the prefix found
  std::vector<std::string> bytes; ///< [chunk * world_size + rank], chunks of them
  /// Where each shard's payload starts in bytes[i] (a Redis value keeps its
  /// header: dropping it would copy the chunk once more).
  std::vector<uint32_t> skip;
};

/// PUT|DELETE /quota/{salt} with l2.quota_mode = "isolated": the salt's L2
/// limit from now on (nullopt: none, so limit 0: LMCache's allowlist rule).
struct l2_quota_limit {
  std::string salt;
  std::optional<uint64_t> bytes;
};

/// The bytes each cache_salt holds in L2, summed over the backends
/// (LMCache's StorageManager.get_usage_bytes_by_cache_salt), and the
/// objects the quota passes erased.
struct l2_usage {
  std::map<std::string, uint64_t> bytes_by_salt;
  uint64_t quota_evicted = 0;
};

/// GET /cache/objects (tier l2): one page of an L2 backend's objects.
struct l2_list_objects {
  std::string adapter; ///< the backend's type name ("disk", "redis"); "": the first
  std::optional<std::string> model, salt; ///< filters
  uint64_t offset = 0; ///< page_token: where in the backend's listing to go on
  uint32_t limit = 500;
};
struct l2_object_entry {
  object_key_fields key;
  uint64_t bytes = 0;
};
struct l2_objects_page {
  int status = 200;  ///< 404: no such adapter
  std::string error;
  std::string adapter;
  bool shared = false;
  std::vector<l2_object_entry> entries;
  std::optional<uint64_t> next; ///< the next page's page_token; none: the last page
};

/// DELETE /cache/objects (tier l2 or all): LMCache's keys, from one backend.
struct l2_delete_objects {
  std::string adapter; ///< as l2_list_objects::adapter
  std::vector<object_key_fields> keys;
};
struct l2_deleted {
  int status = 200; ///< 400: a key this L2's format cannot name; 404: no such adapter
  std::string error;
  uint64_t deleted = 0; ///< as LMCache counts it: the keys of the batch
};

} // namespace kvs
