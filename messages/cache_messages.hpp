// Messages of the cache server.
//
// mp_call / mp_reply travel between the engine bridge and the actors that
// handle LMCache MP requests; the store_* / gpu_* structs are the typed
// requests of the store and GPU-transfer actors (see actors/interfaces.hpp).
// Replies carry only what a success needs: a request that fails is answered
// with a caf::error made by to_caf_error (actors/caf_error.hpp), so the
// requester's error branch gets the kind and the detail (the text logged).
#pragma once

#include "core/engine_type.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvs {

struct mp_request;   // lmcache_wire/lmcache_protocol.hpp
struct kv_layout;    // gpu/kv_layout.hpp
struct tensor_desc;  // core/tensor_desc.hpp

/// One request from an engine connector, with what is needed to answer it.
struct mp_call {
  std::string identity; ///< ROUTER identity of the connector's DEALER
  std::shared_ptr<const mp_request> request;
  /// register_kv_cache over ipc://: the peer process's uid (SO_PEERCRED,
  /// as libzmq reports it); nullopt over tcp://, where the registry holds
  /// objects to the sidecar's own uid instead.
  std::optional<uint32_t> peer_uid;
  std::chrono::steady_clock::time_point received{}; ///< for the latency histograms
  /// register_kv_cache: the process at the other end of the connection, in
  /// the sidecar's PID namespace (ipc://: SO_PEERCRED; loopback tcp://: the
  /// owner of the peer's socket), when it can be told; 0 = unknown. The
  /// registry maps only shared memory that process has open or mapped.
  int32_t peer_pid = 0;
  /// The connection showed an LMCache client older than 0.5.6 (0.5.3-0.5.5):
  /// it decodes every echoed op as its own enum, and a str op (the failure
  /// reply) kills 0.5.3/0.5.4's polling thread. Failures echo the op then.
  bool legacy_client = false;
};

/// The answer: uid and op frames echoed byte for byte, then one body frame
/// (msgpack) or none (None).
struct mp_reply {
  std::string identity;
  std::string uid_frame;
  std::string op_frame;
  std::optional<std::string> body;
  std::chrono::steady_clock::time_point received{}; ///< the call's, copied by make_reply
  uint8_t op = 0;                                   ///< the call's mp_op
};

/// An LMCache request or stream control that came over gRPC (actors/
/// grpc_bridge.hpp), as the frames a ZeroMQ client of the same release
/// sends after its identity (uid · op · args, or uid · "" · ack|cancel):
/// the engine bridge serves it on the path every ZeroMQ request takes, so no
/// op is implemented twice. Its replies go back to the gRPC bridge.
struct lmcache_frames {
  std::string identity; ///< grpc_identity(client id): never a ZeroMQ identity
  std::vector<std::string> frames;
  std::chrono::steady_clock::time_point received{};
  /// The call's peer as gRPC names it ("ipv4:127.0.0.1:40123", "unix:...");
  /// the engine bridge checks whether that connection still exists.
  std::string peer{};
};

/// The engine bridge's identity of a gRPC client: a 0 byte, "grpc", then
/// the client's id (LMCache's lmcache-client-id-bin, or its peer address).
/// ZeroMQ ROUTER identities never start with a 0 byte except its own
/// 5-byte ones, so the two can never collide.
inline std::string grpc_identity(std::string_view client) {
  std::string id{"\0grpc", 5};
  id.append(client);
  return id;
}
inline bool is_grpc_identity(std::string_view identity) {
  return identity.size() > 5 && identity.substr(0, 5) == std::string_view{"\0grpc", 5};
}

/// Where the engine bridge hands the replies of gRPC requests: the gRPC
/// server (lmcache_grpc/grpc_server.hpp), whose deliver() is thread-safe
/// and posts the write on the caller's thread, so a reply takes no further
/// actor or thread hop. Shared: deliver() after the server stopped is a no-op.
class lmcache_reply_sink {
public:
  virtual ~lmcache_reply_sink() = default;
  virtual void deliver(mp_reply r) = 0;
};
using lmcache_reply_sink_ptr = std::shared_ptr<lmcache_reply_sink>;

/// Builds the reply to `call` with `body` (nullopt = None).
mp_reply make_reply(const mp_call& call, std::optional<std::string> body);
/// The reply that makes the client's call fail at once with `why` (for a
/// request that cannot be served and has no failure value of its own; see
/// lmcache_wire/lmcache_failure.hpp).
mp_reply make_failure_reply(const mp_call& call, std::string_view why);

// -- store ---------------------------------------------------------------------

/// LOOKUP: lock the prefix of `hashes` (chunk 0..n) present on every rank.
struct store_lookup {
  std::string session;
  std::vector<uint64_t> hashes;
  int32_t world_size = 1;
  uint32_t readers_per_key = 1;
  std::string model; ///< names L2 objects (l2/object_header.hpp)
  std::string salt;
  /// LMCache 0.5.7's key.start in chunks: chunks [0, begin) are the
  /// engine's own (its prefix cache). They are touched (LRU), never locked
  /// or fetched from L2, and counted in the hit, which stays absolute.
  size_t begin = 0;
  /// l2.format = "lmcache": LMCache's chunk hash of each of `hashes` (32
  /// bytes each; may be shorter: see l2_write::names). Empty otherwise.
  std::vector<std::string> l2_names{};
  /// With l2_names: the key's tokens of chunks 0..hashes.size(), for the
  /// BlockStored of chunks found in L2 that another writer (an LMCache
  /// node) put there.
  std::shared_ptr<const std::vector<uint32_t>> tokens{};
};

/// FREE_LOOKUP_LOCKS: release the session's locks on chunks [begin, end):
/// every rank's (scheduler key, worker_id nil) or one rank's.
struct store_release_range {
  std::string session;
  size_t begin = 0;
  size_t end = 0;
  std::optional<int32_t> rank;
};

/// END_SESSION / TTL: release everything the session holds.
struct store_end_session {
  std::string session;
};

/// How a chunk's bytes are laid out in its L1 slot. Chunks of one format
/// are never handed to a reader of another (chunk_index entry_info::format).
enum chunk_format : uint8_t {
  /// LMCache's KV_2LTD [2, layers, tokens, heads*head_dim]: every layout the
  /// block copy serves, and engine-driven registrations with two planes.
  chunk_format_kv_2ltd = 0,
  /// Engine-driven use_mla=true: [layers, tokens, hidden] as the engine's
  /// LMCache gathered it (MLA, or fused K/V rows such as vLLM CPU's), opaque
  /// to the sidecar.
  chunk_format_single_plane = 1,
};

/// One LMCache group of a multi-group (hybrid-KV) engine-driven
/// registration (LMCache 0.5.7's GroupLayout): its chunks are stored under
/// their own keys (group_hash in cache/chunk_hash.hpp) in their own layout.
struct stage_group {
  std::vector<int64_t> chunk_shape; ///< as the engine views one chunk of the group
  std::string dtype;
  uint8_t format = chunk_format_kv_2ltd;
  uint64_t slot_bytes = 0;
  /// Trailing chunks a prefix hit needs from this group (a sliding window
  /// or a recurrent state); -1: the whole prefix (full attention).
  int32_t window = -1;
};
using stage_groups = std::shared_ptr<const std::vector<stage_group>>;

/// STORE step 1: a slot for each chunk of `hashes` on `rank`, each as long
/// as one chunk of the instance's registered layout.
struct store_reserve {
  int64_t instance_id = 0;
  int32_t rank = 0;
  std::vector<uint64_t> hashes; ///< the chunks to store, in order
  uint8_t format = chunk_format_kv_2ltd;
  /// At most this many chunks are reserved (the first ones not present);
  /// the rest are left out (an engine-driven store limited by its staging
  /// slots). 0: no limit.
  size_t max_chunks = 0;
  /// A multi-group instance's group (`hashes` are that group's keys): the
  /// slots are as long as one of its chunks.
  uint32_t group = 0;
};
struct reserved_chunk {
  size_t position = 0;      ///< index into store_reserve::hashes
  uint8_t* slot = nullptr;  ///< where the copy writes
  uint64_t offset = 0;      ///< the slot's L1 offset: its offset in the instance's arena
};
/// Refused (unregistered instance, no space in L1): a caf::error instead.
struct store_reserve_reply {
  std::vector<reserved_chunk> chunks; ///< to copy (chunks already present are left out)
  size_t slot_bytes = 0; ///< usable bytes of every reserved slot
  /// The slots are in the instance's L1 arena (an engine-driven instance
  /// writing in place): the engine writes them at their offsets, no copy.
  bool in_place = false;
};

/// STORE step 2: the copy finished (commit) or failed (abort). Committed
/// chunks are announced as BlockStored: `tokens` are the chunk tokens of
/// hashes[positions[i]], `parents` the hash of the chunk before (0 = none).
struct store_finish {
  bool commit = false;
  int32_t rank = 0;
  std::vector<uint64_t> hashes;   ///< reserved chunks only
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::optional<uint64_t>> parents;
  std::string model; ///< the key's model_name: kv_event_stream records, L2 objects
  std::string salt;  ///< names L2 objects (l2/object_header.hpp)
  /// A multi-group instance's group above 0: committed only, never
  /// announced (routers know the token prefix, which group 0 names).
  uint32_t group = 0;
  /// A multi-group (hybrid-KV) instance's chunk, of any group: written to
  /// L2 under its group's key in its group's format (a one-plane group too),
  /// as the model's lookups fetch every group's chunks back
  /// (actors/cache/store_l2.hpp); only group 0's are announced.
  bool grouped = false;
  /// l2.format = "lmcache": LMCache's chunk hash of each of `hashes` (see
  /// l2_write::names), and the key's world size. Empty otherwise.
  std::vector<std::string> l2_names{};
  int32_t world_size = 1;
};

/// RETRIEVE step 1: pin chunks [begin, end) of `hashes` on `rank` for
/// reading (the session's lookup locks, or fresh ones).
struct store_acquire {
  std::string session;
  int32_t rank = 0;
  size_t begin = 0; ///< absolute chunk index of hashes[0]
  std::vector<uint64_t> hashes;
  uint8_t format = chunk_format_kv_2ltd; ///< a chunk stored in another format is refused
  /// The engine-driven instance reading (-1: none): the reply says which
  /// chunks are in its L1 arena, to be read in place.
  int64_t instance_id = -1;
};
/// Refused (not found by the request's lookup, not in L1): a caf::error
/// instead, and nothing stays pinned.
struct store_acquire_reply {
  uint64_t ticket = 0;           ///< give back with store_release
  std::vector<uint8_t*> slots;   ///< one per hash
  size_t slot_bytes = 0;         ///< the smallest of their usable sizes
  /// With store_acquire::instance_id: per hash, 1 when the chunk is in that
  /// instance's arena, and its L1 offset (the offset in the arena object).
  std::vector<uint8_t> in_place{};
  std::vector<uint64_t> offsets{};
};
/// RETRIEVE step 2: the copy is over; release what acquire pinned.
struct store_release {
  uint64_t ticket = 0;
};

/// An instance's chunk byte size (bytes per chunk per rank of its layout):
/// its STOREs reserve slots this long. 0 forgets the instance.
struct store_configure {
  int64_t instance_id = 0;
  size_t slot_bytes = 0;
  /// A multi-group (hybrid) registration: every group's chunk size (group
  /// 0's is slot_bytes) and window (stage_group::window). The store answers
  /// LOOKUPs of (model, world_size) by these windows while an instance of
  /// it is registered. Empty: one group.
  std::vector<uint64_t> group_slot_bytes{};
  std::vector<int32_t> group_windows{};
  std::vector<uint8_t> group_formats{}; ///< chunk_format of each group's L1 entries
  std::string model{};
  int64_t world_size = 0;
  /// An engine-driven instance that writes and reads L1 in place
  /// (cache.engine_driven_in_place): the store opens an L1 arena for it
  /// (cache/slot_pool.hpp), owned by `owner_uid` when known, with
  /// `arena_extra_bytes` after the L1 offsets for its staging slots.
  bool arena = false;
  std::optional<uint32_t> owner_uid{};
  uint64_t arena_extra_bytes = 0;
};
/// Refused (a chunk does not fit in L1): a caf::error instead.
struct store_configure_reply {
  size_t slot_bytes = 0; ///< the instance's slot size after the call
  /// With store_configure::arena: the arena object's name and size, and
  /// where its extra bytes (the staging slots) start.
  std::string arena_name{};
  uint64_t arena_size = 0;
  uint64_t arena_origin = 0;
};

// -- gpu transfer --------------------------------------------------------------

struct gpu_open {
  int64_t instance_id = 0;
  engine_type engine; ///< how RETRIEVE's skip counts (sglang vs the others)
  std::shared_ptr<const std::vector<tensor_desc>> tensors;
  std::shared_ptr<const kv_layout> layout;
};
struct gpu_close {
  int64_t instance_id = 0;
};
struct gpu_copy {
  int64_t instance_id = 0;
  bool to_l1 = true; ///< STORE; false = RETRIEVE
  std::vector<std::vector<int64_t>> block_ids;
  std::vector<uint64_t> chunk_positions; ///< chunk index within the request
  std::vector<uint8_t*> slots;
  uint64_t chunk_tokens = 0;
  uint64_t slot_bytes = 0;
  /// RETRIEVE: the connector's skip argument as sent. SGLang's connector
  /// counts pages, LMCache 0.5.6's vLLM adapter counts tokens; the transfer
  /// actor knows the instance's engine and converts.
  uint64_t skip_first_n = 0;
  std::string engine_event_handle;
};
/// Sent at once: the event to answer the engine with, and a ticket to
/// await the completion with. A copy that cannot start: a caf::error.
struct gpu_copy_started {
  std::string event_handle;
  uint64_t ticket = 0;
  /// The copy already finished (host backend): no gpu_await needed, and the
  /// session commits/releases before it answers (read-your-writes).
  bool complete = false;
  /// STORE with more than one engine group (a hybrid model's sliding-window
  /// or recurrent groups): the chunks (indices into gpu_copy::slots) whose
  /// block ids in some group are all the null block 0. Their pages hold no
  /// KV (a window group's out-of-window blocks), so they were not copied,
  /// and their reservations are aborted: a later, shorter prefix hit would
  /// read garbage (LMCache's all_null_chunk_masks).
  std::vector<uint32_t> null_chunks{};
};
struct gpu_await {
  uint64_t ticket = 0;
};
/// The copy completed; one that failed is answered with a caf::error.
struct gpu_copy_done {};
/// The pools are open; pools that cannot be opened: a caf::error.
struct gpu_status_reply {};

// -- engine-driven staging (gpu/staging_pool.hpp) -------------------------------

/// register_kv_cache_engine_driven_context: create the instance's staging
/// pool of `slots` chunk slots (replacing an older one of the instance).
struct gpu_stage_open {
  int64_t instance_id = 0;
  uint64_t slot_bytes = 0;
  uint32_t slots = 0;
  std::vector<int64_t> chunk_shape; ///< as the engine views one slot
  std::string dtype;                ///< torch dtype name, for the descriptors
  uint8_t format = chunk_format_kv_2ltd;
  /// The peer's uid (ipc:// endpoints), to own the object; unknown over tcp://.
  std::optional<uint32_t> owner_uid;
  /// cache.engine_driven_transfer = "inline": no pool; the chunks travel
  /// in commit_store's and prepare_retrieve's data (LMCache 0.5.7).
  bool inline_data = false;
  /// A multi-group (hybrid) registration (always inline); empty: one group.
  stage_groups groups{};
  /// The instance's L1 arena (store_configure_reply): the staging slots go
  /// inside its object from arena_origin, and the engine maps the arena.
  std::string arena_name{};
  uint64_t arena_origin = 0;
  uint64_t arena_size = 0;
};
struct gpu_stage_opened {
  std::string shm_name;
  uint64_t pool_size = 0;
};
/// prepare_*: up to `count` free slots of the instance's pool (fewer when
/// fewer are free). Unknown instance: a caf::error. A hybrid instance's
/// slots are handed out only with `group_slots` (the session counts one per
/// group's chunk once it knows the groups); without, the reply carries its
/// groups and no slot.
struct gpu_stage_take {
  int64_t instance_id = 0;
  uint32_t count = 0;
  bool group_slots = false;
};
struct gpu_stage_taken {
  std::vector<uint64_t> offsets;
  uint64_t slot_bytes = 0;
  std::vector<int64_t> chunk_shape;
  std::string dtype;
  uint8_t format = chunk_format_kv_2ltd;
  /// An inline instance: no slots (offsets empty); the session copies the
  /// chunks from and into the request's and reply's data.
  bool inline_data = false;
  stage_groups groups{}; ///< a multi-group instance's groups; null: one group
  /// The instance writes and reads its L1 arena in place: stores need no
  /// slot; retrieves need one only for chunks outside its arena.
  bool in_place = false;
};
/// Copies slot_bytes between staging slot offsets[i] and L1 slot l1[i]
/// (to_l1: staging -> L1, commit_store; else L1 -> staging,
/// prepare_retrieve), then gives the slots back when `release`. A slot not
/// taken, or an unknown instance: a caf::error, nothing copied.
struct gpu_stage_copy {
  int64_t instance_id = 0;
  bool to_l1 = true;
  std::vector<uint64_t> offsets;
  std::vector<uint8_t*> l1;
  bool release = false;
  /// A hybrid instance: bytes per slot (its group's chunk); empty: the
  /// instance's slot size each.
  std::vector<uint64_t> lengths{};
};
/// Gives slots back without copying (commit_retrieve, an abandoned prepare).
struct gpu_stage_give {
  int64_t instance_id = 0;
  std::vector<uint64_t> offsets;
};

} // namespace kvs
