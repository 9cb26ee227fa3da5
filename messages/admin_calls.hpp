// admin_calls: one typed call per operation of LMCache's HTTP control
// plane, as admin_routes makes them from a request and the admin actor answers
// them. Each carries only its own operation's parameters, already checked;
// the type itself names the operation.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace kvs {

/// GET /cache/objects' page size: default, and the most one page holds.
inline constexpr uint32_t objects_default_page = 500; ///< LMCache's _DEFAULT_PAGE_SIZE
inline constexpr uint32_t objects_max_page = 5000;    ///< LMCache's _MAX_PAGE_SIZE

/// One of LMCache's EncodedObjectKeys (DELETE /cache/objects' "keys").
struct admin_object_key {
  uint64_t hash = 0;  ///< chunk_hash_hex: kvsidecar's 64-bit chunk hashes (L1)
  std::string hash_hex; ///< chunk_hash_hex as given, lower case (L2: LMCache's 32-byte hashes too)
  int32_t rank = 0;   ///< kv_rank
  uint32_t group = 0; ///< object_group_id (L2; L1 keeps one group)
  std::string model;  ///< model_name
  std::string salt;   ///< cache_salt
};

namespace admin_req {

struct root {};            ///< GET /
struct healthcheck {};     ///< GET /healthcheck
struct status {};          ///< GET /status
struct config {};          ///< GET /config
struct config_adapters {}; ///< GET /config/adapters
/// GET /version, /lmc_version, /commit_id
struct version {
  std::string path; ///< which of the three
};

/// POST /cache/clear (force=true is refused by the route: 501).
struct cache_clear {
  std::string tier = "l1"; ///< "l1", "l2" or "all"
};

/// GET /quota
struct quota_list {};
/// GET /quota/{salt}
struct quota_get {
  std::string salt; ///< the cache_salt ("_default" already mapped to "")
};
/// PUT /quota/{salt}
struct quota_set {
  std::string salt;
  double limit_gb = 0;      ///< as given
  uint64_t limit_bytes = 0; ///< limit_gb * 2^30
};
/// DELETE /quota/{salt}
struct quota_delete {
  std::string salt;
};

/// Chunks named by their tokens: LMCache's PrefetchRequest fields.
struct token_chunks {
  std::string model;
  int64_t world_size = 0;
  std::vector<int64_t> tokens;
  std::string salt;
};

/// POST /cache/prefetches (L2 -> L1 by token ids)
struct prefetch_submit : token_chunks {};
/// GET /cache/prefetches/{request_id}
struct prefetch_status {
  std::string request_id;
};

/// /cache/objects' filter (unset: any).
struct objects_filter {
  bool by_model = false, by_salt = false;
  std::string model; ///< with by_model
  std::string salt;  ///< with by_salt
};

/// GET /cache/objects: an L2 adapter's objects, or L1's chunks, paged.
struct objects_list : objects_filter {
  std::string tier = "l2"; ///< "l2" (LMCache's default) or "l1"
  std::string adapter;     ///< the L2 backend by type name ("": the first)
  uint32_t page_size = objects_default_page;
  uint64_t cursor = 0; ///< page_token
};
/// DELETE /cache/objects: L2 by LMCache's keys; L1 by keys or filter.
struct objects_delete : objects_filter {
  std::string tier = "l2"; ///< "l2", "l1" or "all"
  std::string adapter;
  bool by_keys = false; ///< by `keys` instead of by the filter
  std::vector<admin_object_key> keys;
};

/// POST /cache/checksums by token ids: MD5 of each L1 chunk.
struct chunk_checksums : token_chunks {
  int64_t kv_rank = 0; ///< whose chunks
};
/// POST /cache/checksums in LMCache's block-id form: the registered
/// instance, its block ids, blocks per chunk, one digest per layer or chunk.
struct block_checksums {
  std::vector<int64_t> block_ids;
  int64_t chunk_blocks = 0;
  int64_t instance_id = 0;
  bool layerwise = false;
};

} // namespace admin_req

/// A checked control-plane call: exactly one operation.
using admin_call
  = std::variant<admin_req::root, admin_req::healthcheck, admin_req::status, admin_req::config,
                 admin_req::config_adapters, admin_req::version, admin_req::cache_clear,
                 admin_req::quota_list, admin_req::quota_get, admin_req::quota_set,
                 admin_req::quota_delete, admin_req::prefetch_submit, admin_req::prefetch_status,
                 admin_req::objects_list, admin_req::objects_delete, admin_req::chunk_checksums,
                 admin_req::block_checksums>;

} // namespace kvs
