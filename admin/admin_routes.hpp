// admin_routes: LMCache's HTTP control plane (the routers of its MP
// http_server, lmcache/v1/multiprocess/http_apis/ in 0.5.6 and 0.5.7), as
// the paths and bodies kvsidecar's HTTP server accepts. Pure: a request
// (method, path, query, body, Authorization) becomes either an admin_call
// for the backend (admin/admin_api.cpp asks the actors) or a finished
// answer -- a 400 naming the bad parameter, a 401, a 404/405, or a 501 for
// what kvsidecar does not have (DAX reconfiguration, run_script, Python
// thread dumps...). Fuzzed with the JSON body reader (tests/fuzz/fuzz_http_admin).
//
// Answers use LMCache's JSON shapes: FastAPI's {"detail": ...} for unknown
// paths and methods, the routers' own {"error": ...} elsewhere (our errors
// carry both keys, so the `lmcache` CLI, which prints "message" or
// "error", shows the reason).
//
// Authorization: when the listener is not loopback, every request that is
// not GET or HEAD (clear, quota changes, deletes, prefetches, metrics
// reset: everything that changes state) needs "Authorization: Bearer
// <http.admin_token>" (or one of the API keys); without a configured token
// or key such calls are refused. With API keys configured (LMCache 0.5.7's
// --api-key-file), every path but the public ones needs a key first
// (check_api_key, which the HTTP server applies to /metrics as well).
#pragma once

#include "http/http_answer.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace kvs {

enum class admin_op {
  root,            ///< GET /
  healthcheck,     ///< GET /healthcheck
  status,          ///< GET /status
  config,          ///< GET /config
  config_adapters, ///< GET /config/adapters
  version,         ///< GET /version, /lmc_version, /commit_id
  cache_clear,     ///< POST /cache/clear
  quota_list,      ///< GET /quota
  quota_get,       ///< GET /quota/{salt}
  quota_set,       ///< PUT /quota/{salt}
  quota_delete,    ///< DELETE /quota/{salt}
  prefetch_submit, ///< POST /cache/prefetches (L2 -> L1 by token ids)
  prefetch_status, ///< GET /cache/prefetches/{request_id}
  objects_list,    ///< GET /cache/objects (an L2 adapter's objects, or L1's chunks, paged)
  objects_delete,  ///< DELETE /cache/objects (L2 by LMCache's keys; L1 by keys or filter)
  checksums,       ///< POST /cache/checksums (by block ids: the engine's KV blocks, as
                   ///< LMCache; or by token ids: MD5 of each L1 chunk)
};

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

struct admin_call {
  admin_op op = admin_op::root;
  std::string path; ///< as requested (version: which of the three)
  std::string salt; ///< quota_*: the cache_salt ("_default" already mapped to "")
  double limit_gb = 0;      ///< quota_set, as given
  uint64_t limit_bytes = 0; ///< quota_set: limit_gb * 2^30
  /// cache_clear: "l1" (the only tier cleared); objects_*: "l2" (LMCache's
  /// default), "l1" (kvsidecar's L1 chunks) or, for a delete, "all".
  std::string tier = "l1";
  std::string adapter; ///< objects_*: the L2 backend by type name ("": the first)
  bool force = false;       ///< cache_clear: also locked chunks (refused: 501)
  // prefetch_submit: LMCache's PrefetchRequest (salt above)
  std::string model;
  int64_t world_size = 0;
  std::vector<int64_t> tokens;
  std::string request_id; ///< prefetch_status
  // objects_list / objects_delete: the filter (salt above with by_salt)
  bool by_model = false, by_salt = false;
  uint32_t page_size = objects_default_page; ///< objects_list
  uint64_t cursor = 0;                       ///< objects_list: page_token
  int64_t kv_rank = 0;                       ///< checksums: whose chunks
  /// checksums in LMCache's block-id form: the registered instance, its
  /// block ids, blocks per chunk, and one digest per layer or per chunk.
  bool by_blocks = false;
  std::vector<int64_t> block_ids;
  int64_t chunk_blocks = 0;
  int64_t instance_id = 0;
  bool layerwise = false;
  /// objects_delete by key (LMCache's body) instead of by filter.
  bool by_keys = false;
  std::vector<admin_object_key> keys;
};

struct admin_policy {
  /// The listener is a loopback address: no token is asked.
  bool loopback = true;
  /// http.admin_token (or KVSIDECAR_ADMIN_TOKEN); "" = none configured.
  std::string token;
  /// LMCache 0.5.7's API keys (http.api_key_files, LMCACHE_API_KEY...:
  /// app/api_keys.hpp). Any: every path but the public ones needs one of
  /// them (or the admin token), as a bearer token or X-LMCache-API-Key; a
  /// key also opens the state changes the admin token opens.
  std::vector<std::string> api_keys;
};

/// Paths open without a key when API keys are configured: LMCache's
/// public ones (/, /healthcheck) and kvsidecar's probes (/healthz, /readyz).
bool public_path(std::string_view path);

/// nullopt when the request may proceed; else LMCache's 401
/// ({"detail": "Invalid or missing API key"}). Every path, /metrics
/// included, when `policy` has API keys; nothing is asked otherwise.
std::optional<http_answer> check_api_key(std::string_view path, std::string_view authorization,
                                         std::string_view api_key, const admin_policy& policy);

/// A call for the backend, or the answer already.
using admin_route = std::variant<admin_call, http_answer>;

/// Routes one request. `path` is the target up to '?', `query` the rest.
admin_route route_admin(std::string_view method, std::string_view path, std::string_view query,
                        std::string_view body, std::string_view authorization,
                        const admin_policy& policy);

/// Answers admin calls (admin/admin_api.cpp); called on the HTTP server's
/// admin thread, one call at a time; may block up to its own deadline.
class admin_backend {
public:
  virtual ~admin_backend() = default;
  virtual http_answer serve(const admin_call& call) = 0;
};

} // namespace kvs
