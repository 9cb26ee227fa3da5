// LMCache multi-process (MP) protocol, as LMCache 0.5.6 speaks it over ZeroMQ
// (lmcache/v1/multiprocess/transport/zmq_impl/{mq,wire}.py), decoded into
// typed requests and encoded back into response bodies. The facts and the
// differences from older releases are in docs/lmcache-mp-compat.md.
//
// A request as the ROUTER receives it is `identity · uid · op · arg_0 …`;
// decode_mp_request() takes the frames after the identity. Each argument is
// its own msgpack frame. The reply is `identity · uid · op` (echoed byte for
// byte) plus at most one body frame, built with the encode_reply_* functions; no
// body frame means None.
//
// Naming: `mp_` here (mp_op, mp_request) always means LMCache's
// multi-process protocol; reply bodies are encode_reply_*; the msgpack reader and writer are
// msgpack_io::reader / msgpack_io::writer (msgpack_reader.hpp,
// msgpack_writer.hpp). Each op is one row of the op table
// (lmcache_ops.hpp); decoding is lmcache_decode.cpp (frames) over
// lmcache_body_decode.cpp (arguments), reply bodies
// lmcache_encode.cpp, the register_kv_cache tensor wrappers
// tensor_wrappers.hpp.
//
// No msgpack and no CAF in this header: actors include it freely.
#pragma once

#include "core/engine_type.hpp"
#include "core/error.hpp"
#include "core/layout_hints.hpp"
#include "core/tensor_desc.hpp"
#include "lmcache_wire/wire_fields.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <variant>
#include <vector>

namespace kvs {

// ---------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------

/// The operations kvsidecar serves, numbered with LMCache's frozen legacy ids
/// (wire.py LEGACY_OPERATION_IDS). 11 is retired in 0.5.6 but older clients
/// (the SGLang seed's era) still send it.
enum class mp_op : uint8_t {
  register_kv_cache = 1,
  unregister_kv_cache = 2,
  store = 6,
  retrieve = 7,
  lookup = 8,
  query_prefetch_status = 9,
  wait_prefetch_status = 10,
  query_prefetch_lookup_hits = 11,
  free_lookup_locks = 12,
  end_session = 13,
  // Engine-driven transfer (LMCache's EngineDrivenTransferModule): the engine
  // copies its own pages into / out of buffers the server hands out.
  register_kv_cache_engine_driven_context = 14,
  unregister_kv_cache_engine_driven_context = 15,
  prepare_store = 16,
  commit_store = 17,
  prepare_retrieve = 18,
  commit_retrieve = 19,
  clear = 20,
  get_chunk_size = 21,
  ping = 22,
  /// The scheduler reports each scheduled request's new blocks (LMCache's
  /// blend / p2p bookkeeping); vLLM's adapter sends it every step and
  /// expects None. Acknowledged, not used.
  report_block_allocation = 23,
  noop = 24,
  /// 0.5.6's vLLM adapter asks for it at start-up and waits up to its RPC
  /// timeout (300 s) for the answer, so a drop-in must reply (an empty list).
  /// 0.5.3 / 0.5.4 send it as id 40 (their table differs from 25 on).
  get_experimental = 32,
  // Ops newer than the frozen legacy table travel by name only; their enum
  // values are not ids (mp_op_from_id never returns them).
  /// 0.5.7: the vLLM adapter's first request; answers the chunk size if it
  /// is a multiple of the alignment.
  negotiate_chunk_size = 200,
  /// 0.5.6+: a server module method; 0.5.7 adds the affinity variant.
  server_module_call = 201,
  server_module_affinity_call = 202,
  /// 0.5.6+ (advertised as "kv_event_stream"): a stream of KVEventBatch
  /// frames, not a request and reply; its row is `streamed` and the engine
  /// bridge serves it (lmcache_kv_events.hpp).
  subscribe_kv_events = 203,
};

/// The LMCache client release a request shows itself to come from, read
/// from what it carries (never configured): docs/lmcache-mp-compat.md,
/// "Releases served".
enum class client_release : uint8_t {
  unknown, ///< nothing in this request tells
  legacy,  ///< 0.5.3-0.5.5: int ops only, pickled wrappers, no str failure replies
  v0_5_6,  ///< token_ids keys, 2-argument free_lookup_locks / prepare_store
  v0_5_7,  ///< token_bytes keys, 3-argument free_lookup_locks / prepare_store, new ops
};
const char* to_string(client_release r);

/// snake_case name, as LMCache routes operations ("get_chunk_size").
const char* to_string(mp_op op);
/// The op for a snake_case name, or nullopt (also for LMCache ops we do not serve).
std::optional<mp_op> mp_op_from_name(std::string_view name);
/// The op for a legacy id, or nullopt.
std::optional<mp_op> mp_op_from_id(int64_t id);

// ---------------------------------------------------------------------------
// Argument types
// ---------------------------------------------------------------------------


/// `IPCCacheServerKey` (custom_types.py, 0.5.6): a msgpack map keyed by field
/// name; unknown keys are ignored, missing defaulted fields take the default,
/// a missing required field is an error.
struct cache_key {
  std::string model_name;
  int64_t world_size = 0;
  std::optional<int64_t> worker_id; ///< nil for scheduler-side LOOKUP / FREE_LOOKUP_LOCKS
  /// Token ids. LMCache hashes them as big-endian uint32 (token_hasher.py),
  /// so a value outside [0, 2^32) is rejected here.
  std::vector<uint32_t> token_ids;
  int64_t start = 0; ///< chunk-aligned token offsets, not checked here
  int64_t end = 0;
  std::string request_id;  ///< session id, not part of the cache identity
  std::string cache_salt;  ///< part of the identity; default ""; LMCache's rules enforced
  /// `request_configs` (dict[str, Any] | None) kept verbatim as the raw msgpack
  /// of the map; empty when nil or absent.
  std::string request_configs_msgpack;
  /// Readers that will RETRIEVE this key (0 = not sent; pre-0.5.6 clients,
  /// the SGLang seed included, never send it).
  int64_t num_kv_readers = 0;
  /// v0_5_7 when the tokens came as `token_bytes` (packed big-endian uint32),
  /// v0_5_6 for `token_ids`, legacy when num_kv_readers is absent (0.5.3/0.5.4).
  client_release release = client_release::unknown;
};

/// `LayoutHints` (a TypedDict, total=False): every key optional; unknown keys
/// ignored; the Literal-typed keys are checked.
struct layout_hints {
  std::optional<vllm_kv_layout> kv_layout;           ///< "NHD" | "HND" | "BLHNC" | "BLNHC"
  std::optional<int64_t> num_kv_heads;
  std::optional<int64_t> tokens_per_block;
  std::optional<sglang_kv_list_layout> kv_list_layout; ///< "k_v" | "unified"
  std::optional<int64_t> head_dim;
};

/// `EngineGroupInfo` (group_view.py, a msgspec Struct encoded as a map).
struct engine_group_info {
  int64_t engine_group_id = 0; ///< required
  std::vector<int64_t> layer_indices;
  int64_t tokens_per_block = 0;
  int64_t sw_size_tokens = -1;
  int64_t extra_object_group_tag = 0;
  bool recurrent_state = false;
  static constexpr const char* wire_name = "EngineGroupInfo";
  static constexpr auto wire_fields() {
    using T = engine_group_info;
    return std::make_tuple(wire::arg("engine_group_id", &T::engine_group_id).needed(),
                           wire::arg("layer_indices", &T::layer_indices),
                           wire::arg("tokens_per_block", &T::tokens_per_block),
                           wire::arg("sw_size_tokens", &T::sw_size_tokens),
                           wire::arg("extra_object_group_tag", &T::extra_object_group_tag),
                           wire::arg("recurrent_state", &T::recurrent_state));
  }
};

// ---------------------------------------------------------------------------
// Requests: one struct per op, fields in LMCache's argument order. Each
// declares its arguments' wire names and members (`wire_args()`; a struct
// sent as a msgpack map its `wire_fields()` and `wire_name`: wire_fields.hpp),
// which is all the body decoder and the op table need of it.
// ---------------------------------------------------------------------------

struct register_kv_cache_req {
  int64_t instance_id = 0; ///< the worker's pid
  std::vector<tensor_desc> kv_caches;
  std::string model_name;
  int64_t world_size = 0;
  engine_type engine = engine_type::vllm;
  layout_hints hints;
  std::vector<engine_group_info> groups; ///< empty = one group over all layers
  static constexpr auto wire_args() {
    using T = register_kv_cache_req;
    return std::make_tuple(wire::arg("instance_id", &T::instance_id), wire::arg("kv_cache", &T::kv_caches),
                           wire::arg("model_name", &T::model_name), wire::arg("world_size", &T::world_size),
                           wire::arg("engine_type", &T::engine), wire::arg("layout_hints", &T::hints),
                           wire::arg("engine_group_infos", &T::groups));
  }
};
struct unregister_kv_cache_req {
  int64_t instance_id = 0;
  static constexpr auto wire_args() { return std::make_tuple(wire::arg("instance_id", &unregister_kv_cache_req::instance_id)); }
};
/// `RegisterEngineDrivenContextPayload` (custom_types.py, a msgspec Struct
/// encoded as a map): the chunk the engine gathers its pages into is
/// [2, num_layers, num_physical_slots, hidden_dim_size] (use_mla false) or
/// [num_layers, num_physical_slots, hidden_dim_size] (use_mla true: MLA and
/// fused-K/V formats, one plane) of dtype_str.
/// 0.5.7's `GroupLayout` (custom_types.py): one LMCache group of a
/// multi-group (hybrid-KV) worker. Defaults are msgspec's.
struct group_layout_desc {
  int64_t num_layers = 0;
  int64_t hidden_dim_size = 0;
  std::string dtype_str;
  int64_t tokens_per_block = 0;
  int64_t window_tokens = 0; ///< tokens stored per chunk; 0: the whole chunk
  int64_t kv_size = 0;       ///< planes: 2 K/V, 1 single plane, 0: the payload's use_mla
  int64_t window_chunks = 0; ///< trailing chunks a hit needs; 0: the whole prefix
  bool recurrent = false;    ///< recurrent-state snapshots (Mamba/GDN)
  static constexpr const char* wire_name = "GroupLayout";
  static constexpr auto wire_fields() {
    using T = group_layout_desc;
    return std::make_tuple(wire::arg("num_layers", &T::num_layers).needed(),
                           wire::arg("hidden_dim_size", &T::hidden_dim_size).needed(),
                           wire::arg("dtype_str", &T::dtype_str).needed(),
                           wire::arg("tokens_per_block", &T::tokens_per_block).needed(),
                           wire::arg("window_tokens", &T::window_tokens), wire::arg("kv_size", &T::kv_size),
                           wire::arg("window_chunks", &T::window_chunks), wire::arg("recurrent", &T::recurrent));
  }
};
struct register_engine_driven_req {
  int64_t instance_id = 0;
  std::string model_name;
  int64_t world_size = 0;
  int64_t block_size = 0;
  int64_t num_layers = 0;
  int64_t hidden_dim_size = 0;
  std::string dtype_str;  ///< a torch dtype attribute name ("bfloat16")
  bool use_mla = false;
  std::optional<int64_t> num_physical_slots; ///< nil/absent: one per token of a chunk
  /// 0.5.7's `group_layouts`: absent in 0.5.6 (nullopt), [] for
  /// single-group workers, one entry per group for hybrid models.
  std::optional<std::vector<group_layout_desc>> group_layouts;
  /// One argument, the payload: this struct as a map.
  static constexpr auto wire_args() {
    return std::make_tuple(wire::as_map<register_engine_driven_req>{"payload"});
  }
  static constexpr const char* wire_name = "RegisterEngineDrivenContextPayload";
  static constexpr auto wire_fields() {
    using T = register_engine_driven_req;
    return std::make_tuple(wire::arg("instance_id", &T::instance_id).needed(),
                           wire::arg("model_name", &T::model_name).needed(),
                           wire::arg("world_size", &T::world_size).needed(),
                           wire::arg("block_size", &T::block_size).needed(),
                           wire::arg("num_layers", &T::num_layers).needed(),
                           wire::arg("hidden_dim_size", &T::hidden_dim_size).needed(),
                           wire::arg("dtype_str", &T::dtype_str).needed(),
                           wire::arg("use_mla", &T::use_mla).needed(),
                           wire::arg("num_physical_slots", &T::num_physical_slots),
                           // LMCache's own bound on groups (tensor_wire.py _MAX_GROUP_COUNT).
                           wire::arg("group_layouts", &T::group_layouts).at_most(64, "groups"));
  }
};
struct unregister_engine_driven_req {
  int64_t instance_id = 0;
  static constexpr auto wire_args() { return std::make_tuple(wire::arg("instance_id", &unregister_engine_driven_req::instance_id)); }
};
/// prepare_store / prepare_retrieve / commit_retrieve: (key, instance_id).
struct prepare_store_req {
  cache_key key;
  int64_t instance_id = 0;
  /// 0.5.7: per engine group, chunk positions whose blocks are all the null
  /// block (multi-group workers only; single-group ones send []).
  std::vector<std::vector<int64_t>> skipped_chunks;
  static constexpr auto wire_args() {
    using T = prepare_store_req;
    return std::make_tuple(wire::arg("key", &T::key), wire::arg("instance_id", &T::instance_id),
                           wire::arg("skipped_chunks", &T::skipped_chunks, wire::form::nonneg));
  }
};
struct commit_store_req {
  cache_key key;
  int64_t instance_id = 0;
  /// b"" when the engine wrote the handed-out buffers; otherwise a pickled
  /// list of torch tensors (LMCache's pickle strategy), which is not served.
  std::string cpu_data;
  static constexpr auto wire_args() {
    using T = commit_store_req;
    return std::make_tuple(wire::arg("key", &T::key), wire::arg("instance_id", &T::instance_id),
                           wire::arg("data", &T::cpu_data, wire::form::bin));
  }
};
struct prepare_retrieve_req {
  cache_key key;
  int64_t instance_id = 0;
  static constexpr auto wire_args() {
    return std::make_tuple(wire::arg("key", &prepare_retrieve_req::key), wire::arg("instance_id", &prepare_retrieve_req::instance_id));
  }
};
struct commit_retrieve_req {
  cache_key key;
  int64_t instance_id = 0;
  static constexpr auto wire_args() {
    return std::make_tuple(wire::arg("key", &commit_retrieve_req::key), wire::arg("instance_id", &commit_retrieve_req::instance_id));
  }
};
struct store_req {
  cache_key key;
  int64_t instance_id = 0;
  std::vector<std::vector<int64_t>> block_ids; ///< one list per KV group
  std::string event_ipc_handle;                ///< cudaIpcEventHandle_t bytes (not length-checked)
  static constexpr auto wire_args() {
    using T = store_req;
    return std::make_tuple(wire::arg("key", &T::key), wire::arg("instance_id", &T::instance_id),
                           wire::arg("block_ids", &T::block_ids),
                           wire::arg("event_ipc_handle", &T::event_ipc_handle, wire::form::bin));
  }
};
struct retrieve_req {
  cache_key key;
  int64_t instance_id = 0;
  std::vector<std::vector<int64_t>> block_ids;
  std::string event_ipc_handle;
  /// 0.5.6 names it skip_first_n_tokens and counts tokens (block-aligned);
  /// the SGLang seed sends a count of pages here (skip_prefix_n_blocks). The
  /// decoder carries the number; see docs/lmcache-mp-compat.md.
  int64_t skip_first_n = 0;
  static constexpr auto wire_args() {
    using T = retrieve_req;
    return std::make_tuple(wire::arg("key", &T::key), wire::arg("instance_id", &T::instance_id),
                           wire::arg("block_ids", &T::block_ids),
                           wire::arg("event_ipc_handle", &T::event_ipc_handle, wire::form::bin),
                           wire::arg("skip_first_n_tokens", &T::skip_first_n));
  }
};
struct lookup_req {
  cache_key key;
  int64_t tp_size = 0; ///< ignored by LMCache
  static constexpr auto wire_args() {
    return std::make_tuple(wire::arg("key", &lookup_req::key), wire::arg("tp_size", &lookup_req::tp_size));
  }
};
struct query_prefetch_status_req {
  std::string request_id;
  static constexpr auto wire_args() { return std::make_tuple(wire::arg("request_id", &query_prefetch_status_req::request_id)); }
};
struct wait_prefetch_status_req {
  std::string request_id;
  double timeout_s = 0; ///< finite and >= 0 (int accepted, as msgspec does)
  static constexpr auto wire_args() {
    using T = wait_prefetch_status_req;
    return std::make_tuple(wire::arg("request_id", &T::request_id), wire::arg("timeout", &T::timeout_s));
  }
};
struct query_prefetch_lookup_hits_req {
  std::string request_id;
  static constexpr auto wire_args() { return std::make_tuple(wire::arg("request_id", &query_prefetch_lookup_hits_req::request_id)); }
};
struct free_lookup_locks_req {
  cache_key key;
  int64_t tp_size = 0;
  /// 0.5.7: more [start, end) token ranges of abandoned lookups to free.
  std::vector<std::pair<int64_t, int64_t>> extra_ranges;
  static constexpr auto wire_args() {
    using T = free_lookup_locks_req;
    return std::make_tuple(wire::arg("key", &T::key), wire::arg("tp_size", &T::tp_size),
                           wire::arg("extra_ranges", &T::extra_ranges));
  }
};
struct negotiate_chunk_size_req {
  int64_t required_chunk_alignment = 0;
  static constexpr auto wire_args() {
    return std::make_tuple(wire::arg("required_chunk_alignment", &negotiate_chunk_size_req::required_chunk_alignment));
  }
};
/// `ServerModuleCallRequest{method: str, payload: bytes}`.
struct server_module_call_req {
  std::string method;
  size_t payload_bytes = 0;
  /// One argument, the request: this struct as a map.
  static constexpr auto wire_args() { return std::make_tuple(wire::as_map<server_module_call_req>{"request"}); }
  static constexpr const char* wire_name = "ServerModuleCallRequest";
  static constexpr auto wire_fields() {
    using T = server_module_call_req;
    return std::make_tuple(wire::arg("method", &T::method).needed(),
                           wire::arg("payload", &T::payload_bytes, wire::form::bin_size).needed());
  }
};
struct end_session_req {
  std::string request_id;
  static constexpr auto wire_args() { return std::make_tuple(wire::arg("request_id", &end_session_req::request_id)); }
};
struct clear_req {
  bool force = false; ///< 0.5.6 always sends it; older clients send no argument
  static constexpr auto wire_args() { return std::make_tuple(wire::arg("force", &clear_req::force)); }
};
struct get_chunk_size_req {
  static constexpr auto wire_args() { return std::tuple<>{}; }
};
struct ping_req {
  std::optional<int64_t> instance_id; ///< nil from the scheduler's untracked prober
  static constexpr auto wire_args() { return std::make_tuple(wire::arg("instance_id", &ping_req::instance_id)); }
};
struct noop_req {
  static constexpr auto wire_args() { return std::tuple<>{}; }
};
/// report_block_allocation(instance_id, model_name, records): the records
/// (BlockAllocationRecord maps) are checked to be an array and not kept.
struct report_block_allocation_req {
  int64_t instance_id = 0; ///< EngineCore's pid, not a worker instance
  std::string model_name;
  uint32_t records = 0;
  static constexpr auto wire_args() {
    using T = report_block_allocation_req;
    return std::make_tuple(wire::arg("instance_id", &T::instance_id), wire::arg("model_name", &T::model_name),
                           wire::arg("records", &T::records, wire::form::count));
  }
};
struct get_experimental_req {
  static constexpr auto wire_args() { return std::tuple<>{}; }
};

using mp_request_body =
    std::variant<register_kv_cache_req, unregister_kv_cache_req, store_req, retrieve_req,
                 lookup_req, query_prefetch_status_req, wait_prefetch_status_req,
                 query_prefetch_lookup_hits_req, free_lookup_locks_req, end_session_req,
                 clear_req, get_chunk_size_req, ping_req, noop_req, get_experimental_req,
                 register_engine_driven_req, unregister_engine_driven_req, prepare_store_req,
                 commit_store_req, prepare_retrieve_req, commit_retrieve_req,
                 report_block_allocation_req, negotiate_chunk_size_req, server_module_call_req>;

struct mp_request {
  std::string uid_frame; ///< echoed byte for byte in the reply
  std::string op_frame;  ///< echoed byte for byte in the reply
  int64_t uid = 0;       ///< the decoded uid, for logs (-1: not one msgpack int; still echoed)
  mp_op op = mp_op::noop;
  mp_request_body body;
  client_release release = client_release::unknown; ///< what this request showed
};

/// Where an op is served: its op-table row's `route` (lmcache_ops.hpp), which
/// the engine bridge and the session router route by.
enum class mp_route : uint8_t {
  bridge,      ///< answered by the engine bridge at once (no state, or the heartbeat)
  registry,    ///< (un)registrations
  store_clear, ///< the store's on_clear: empties L1 (clear)
  new_session, ///< the request's session, spawned on demand (lookup, copies)
  session,     ///< the request's session if it exists; LMCache's unknown-job answer if not
  end_session, ///< ends the request's session
};

// The questions below are answered from the op's row (lmcache_ops.cpp).

/// The request id (session) a request belongs to, or nullptr for the ops
/// that have none (registration, ping, clear, ...).
const std::string* request_id_of(const mp_request& r);
/// The worker instance a request names, or nullopt (ping may send nil).
std::optional<int64_t> instance_of(const mp_request& r);
/// The reply body LMCache's client reads as "this failed" for `op`:
/// (b"", False) for store/retrieve, False for the commits, a failed
/// PrepareRetrieveResponse; nullopt for the ops that have no failure value
/// (they get the failure reply of lmcache_failure.hpp instead).
std::optional<std::string> failure_body(mp_op op);

/// Decodes the frames after the ROUTER identity: uid, op, then one frame per
/// argument. Never throws. Error kinds:
///   "bad_frames"     fewer than two frames
///   "unknown_op"     op frame is not a known id/name (or not an int/str)
///   "unsupported_op" a real LMCache op that kvsidecar does not serve (named)
///   "arity"          wrong number of argument frames
///   "bad_arg"        an argument failed to decode; detail names the argument
///                    and the place ("arg 0 'key': field 'token_ids'[2]: ...")
expected<mp_request>
decode_mp_request(const std::vector<std::string_view>& frames_after_identity);

// ---------------------------------------------------------------------------
// Response bodies, encoded exactly as msgspec encodes them
// ---------------------------------------------------------------------------

std::string encode_reply_int(int64_t v);          ///< get_chunk_size, prefetch counts
std::string encode_reply_bool(bool v);            ///< ping
std::string encode_reply_str(std::string_view v); ///< noop ("OK")
/// store / retrieve: tuple[bytes, bool] -> [bin, bool].
std::string encode_reply_event_ok(std::string_view event_handle, bool ok);
/// get_experimental: list[str].
std::string encode_reply_str_list(const std::vector<std::string>& v);

/// One buffer of an engine-driven transfer (LMCache's ShmSlotDescriptor):
/// `length` bytes at `offset` of the instance's shared-memory pool, viewed
/// as `shape` of `dtype`.
struct shm_slot_desc {
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<int64_t> shape;
  std::string dtype;
};
/// register_kv_cache_engine_driven_context: RegisterEngineDrivenContextResponse
/// {"shm_name": str, "pool_size": int} (0.5.6), with "null_block_id": int
/// after them when `null_block_id` is given (0.5.7's field; 0.5.6 clients
/// ignore it, but its absence keeps 0.5.6 replies byte-identical).
std::string encode_reply_engine_driven_context(std::string_view shm_name, uint64_t pool_size,
                                               std::optional<int64_t> null_block_id = std::nullopt);
/// server_module_call / server_module_affinity_call: ServerModuleCallResponse
/// {"success": bool, "payload": bytes, "error": str}.
std::string encode_reply_server_module_call(bool success, std::string_view payload,
                                            std::string_view error);
/// prepare_store: PrepareStoreResponse {"context": {"slots": [...],
/// "chunk_indices": [...]}}; no slots = every chunk is already stored.
std::string encode_reply_prepare_store(const std::vector<shm_slot_desc>& slots,
                                       const std::vector<uint64_t>& chunk_indices);
/// prepare_retrieve: PrepareRetrieveResponse {"success": bool, "data": b"",
/// "context": {"slots": [...]}} (no "slots" key when it failed).
std::string encode_reply_prepare_retrieve(bool success, const std::vector<shm_slot_desc>& slots);
/// prepare_retrieve of an inline instance (LMCache 0.5.7): {"success":
/// true, "data": bin(TensorEnvelope of the chunks), "context": {}}.
std::string encode_reply_prepare_retrieve_inline(std::string_view data);
/// The slots of a multi-group (hybrid-KV) instance, as LMCache 0.5.7's
/// ShmTransferStrategy answers: prepare_store {"context": {"slots",
/// "chunk_indices", "group_ids"}}; prepare_retrieve {"success": True,
/// "data": b"", "context": {"slots", "group_ids", "chunk_indices"}}, the
/// three lists parallel (chunk indices within the key's range).
std::string encode_reply_prepare_store_groups(const std::vector<shm_slot_desc>& slots,
                                              const std::vector<uint64_t>& chunk_indices,
                                              const std::vector<uint64_t>& group_ids);
std::string encode_reply_prepare_retrieve_groups(const std::vector<shm_slot_desc>& slots,
                                                 const std::vector<uint64_t>& group_ids,
                                                 const std::vector<uint64_t>& chunk_indices);

} // namespace kvs
