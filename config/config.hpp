// The typed configuration of kvsidecar and its loader.
//
// One TOML document: the compiled-in default (config/default.toml), then an
// optional file over it, then `--set section.key=value` overrides. Every key
// is validated; the first problem becomes one kvs::error naming the source,
// the key, the line and what was expected.
#pragma once

#include "core/error.hpp"
#include "core/event_dialect.hpp"
#include "log/log.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvs {

using duration = std::chrono::nanoseconds;

struct sidecar_config {
  std::string name;
  log::level log_level = log::level::info;   // trace|debug|info|warn|error
  log::format log_format = log::format::text; // text|json
  duration stats_interval{};
  /// An unchanged stats line is written again at most this often (0 = every
  /// stats_interval): log/stats_repeat.hpp.
  duration stats_repeat{};
  duration shutdown_timeout{};
  int64_t worker_threads = 0; ///< CAF scheduler threads; 0 = auto (see scheduler_threads())
  int64_t io_nice = 0;        ///< nice value of the live ZeroMQ context's I/O thread; 0 = leave it
};

struct events_config {
  bool enabled = true;
  event_dialect format = event_dialect::vllm; // vllm|tokenspeed
  /// events.seq_start: "zero" (as vLLM's publisher) or "clock" (microseconds
  /// since the epoch at start: a restarted sidecar's seq is above every seq
  /// its predecessor published, for routers that drop a seq that went back).
  bool seq_start_clock = false;
  /// events.published_dp_rank: "engine" (each batch says the rank it came
  /// from) or "zero" (every rank's endpoint says 0: for a router that takes
  /// one worker URL per rank and reads only rank 0 from each, vllm-router).
  bool published_dp_rank_zero = false;
  /// events.keepalive_interval: an empty batch from a rank quiet this long
  /// (0 = off).
  duration keepalive_interval{};
  int64_t dp_size = 1;
  std::string ingest_endpoint;
  std::string ingest_replay_endpoint;
  duration ingest_gap_timeout{};
  /// events.restart_min_interval: an engine-stream fence at most this often
  /// per rank (relay/engine_stream.hpp); 0 = every new stream.
  duration restart_min_interval{};
  std::string endpoint;
  std::string replay_endpoint;
  /// events.join_endpoint: a PUB for one router that only replays on a gap
  /// (smg's relay): the rank's state first, then live ("" = off).
  std::string join_endpoint;
  int64_t buffer_steps = 0;
  uint64_t buffer_bytes = 0;
  int64_t replay_rate = 0;
  int64_t replay_nice = 0; ///< nice value of the replay/snapshot streaming threads
  int64_t index_max_blocks = 0;
  int64_t hwm = 0;
  int64_t ingest_hwm = 0;              ///< SUB and engine-replay DEALER receive HWM
  uint64_t ingest_max_message_size = 0; ///< bigger engine frames are refused (then re-dialled)
  int64_t replay_hwm = 0;              ///< replay ROUTER, per client
  int64_t replay_max_streams = 0;      ///< replays + snapshots streaming at once, per rank
  int64_t replay_max_waiting = 0;      ///< valid requests waiting for a stream, per rank
  int64_t max_connections = 0;         ///< peers each bound events socket holds at once
  int64_t max_queue_size = 0;
  uint64_t max_queue_bytes = 0; ///< what batches the indexer has not applied may hold
  std::string topic;
};

/// cache.l1_prefault: when the L1 pool's pages are faulted in. "off": on
/// first use (a first store into fresh memory pays the page faults); "start":
/// before the cache serves (slower start; a shortage fails the start);
/// "background": all of it by a low-priority thread after start; "ahead": by
/// that thread, cache.l1_prefault_ahead bytes ahead of the highest slot
/// handed out, so RSS grows with use (actors/cache/l1_prefault.hpp).
enum class l1_prefault_mode { off, start, background, ahead };
/// The config spelling ("off", "start", "background", "ahead"), for logs.
const char* to_string(l1_prefault_mode p);

struct cache_config {
  bool enabled = true;
  std::string endpoint;
  int64_t chunk_size = 0;
  uint64_t l1_size = 0;
  l1_prefault_mode l1_prefault = l1_prefault_mode::background;
  uint64_t l1_prefault_ahead = 0; ///< cache.l1_prefault_ahead: the "ahead" window
  double evict_high = 0;
  double evict_low = 0;
  duration session_ttl{};
  int64_t max_sessions = 0;
  duration lock_ttl{};
  duration heartbeat_timeout{};  ///< a pinging instance silent this long is reaped (0 = never)
  duration registration_grace{}; ///< ... one that never pinged: this long (>= heartbeat_timeout)
  int64_t kv_event_log_size = 0; ///< subscribe_kv_events replay log (records); 0 = off
  int64_t events_rank = 0;
  std::vector<std::string> shm_allow_prefixes; ///< host_shm names a client may register
  int64_t hwm = 0; ///< cache ROUTER send/receive HWM per client
  int64_t max_connections = 0; ///< peers the cache ROUTER holds at once
  /// Chunks each engine-driven instance's staging pool holds (gpu/staging_pool.hpp).
  int64_t engine_driven_slots = 0;
  /// cache.engine_driven_transfer = "inline": engine-driven registrations
  /// name no pool, so LMCache 0.5.7 workers send and get the chunks in the
  /// messages (its inline transfer context); "shm" (default): a staging pool.
  bool engine_driven_inline = false;
  /// cache.engine_driven_in_place: engine-driven instances write and read
  /// L1 slots in their own arena (cache/slot_pool.hpp) instead of staging.
  bool engine_driven_in_place = true;
  /// cache.l1_arena_extent: the unit arenas take L1 in (clipped at start).
  uint64_t l1_arena_extent = 0;
  /// cache.l1_arena_ahead: each arena keeps its next extent claimed and
  /// faulted in ahead of need (actors/cache/arena_prefault.hpp).
  bool l1_arena_ahead = false;
  /// LMCache's gRPC transport (actors/cache/grpc_bridge.hpp): "" = off,
  /// grpc://host:port or grpc+unix:///abs/path.
  std::string grpc_endpoint;
  std::string grpc_tls_cert_file;      ///< PEM; with the key: TLS on grpc://
  std::string grpc_tls_key_file;
  std::string grpc_tls_client_ca_file; ///< PEM; clients must present a certificate it signed
  /// The three files' contents, read when the config is loaded (as the
  /// CURVE keys), so a missing file is a config error naming its key.
  std::string grpc_tls_cert_pem, grpc_tls_key_pem, grpc_tls_client_ca_pem;
  /// cache.quota_mode = "isolated": per-cache_salt limits are enforced
  /// (LMCache's IsolatedLRU rules, cache/salt_quota.hpp); "off": recorded
  /// and reported only.
  bool quota_isolated = false;
  /// [cache.quotas]: salt ("_default" = the empty salt) -> byte limit.
  std::vector<std::pair<std::string, uint64_t>> quotas;
};

/// L2 tiers behind the L1 pool (l2/, actors/cache/l2_tier.hpp).
struct l2_disk_config {
  bool enabled = false;
  std::string path;
  uint64_t size = 0;
};

struct l2_redis_config {
  bool enabled = false;
  std::vector<std::string> endpoints; // "host:port"
  bool cluster = false;
  std::string password;
  std::string key_prefix;
  duration ttl{}; // 0 = no expiry
  int64_t connections = 1;
  duration timeout{};
};

/// How L2 objects are named and laid out (README, "One L2 with LMCache
/// nodes"): kvsidecar's own (a header, its chunk hash) or LMCache's (its
/// ObjectKey names, BLAKE3 chunk hash, raw bytes), to share one Redis or
/// folder with LMCache servers.
enum class l2_format { kvsidecar, lmcache };

struct l2_config {
  uint64_t queue_bytes = 0;
  l2_format format = l2_format::kvsidecar;
  /// l2.quota_mode = "isolated": LMCache's L2 quotas (l2/l2_quota.hpp).
  bool quota_isolated = false;
  double quota_watermark = 0.8;
  double quota_eviction_ratio = 0.2;
  duration quota_interval{};
  l2_disk_config disk;
  l2_redis_config redis;
  bool enabled() const { return disk.enabled || redis.enabled; }
};

/// gpu.backend: "auto" (CUDA when a GPU is usable, else host), "cuda", "host".
enum class gpu_backend { automatic, cuda, host };
/// The config spelling ("auto", "cuda", "host"), for logs.
const char* to_string(gpu_backend b);

struct gpu_config {
  gpu_backend backend = gpu_backend::automatic;
  /// Host backend: fault each registered pool's mapping in after
  /// registration, in the background (host_backend_options::prefault).
  bool host_prefault = true;
  /// Host backend: threads a copy of 8 MiB or more is split over, the
  /// transfer actor's included (host_backend_options::copy_threads).
  int64_t host_copy_threads = 2;
};

/// CURVE on the router-facing PUB / replay sockets and the cache socket.
/// Both empty = off; both set = on (validated at load).
struct security_config {
  std::string curve_secret_key_file; ///< the server's secret key (Z85)
  std::string curve_allowed_clients_dir; ///< one public key (Z85) per file
  std::string curve_secret_key;                ///< loaded: 32 bytes
  std::vector<std::string> curve_allowed_keys; ///< loaded: 32 bytes each
  bool curve_enabled() const { return !curve_secret_key_file.empty(); }
};

struct http_config {
  bool enabled = true;
  std::string listen; // "127.0.0.1:9090", "0.0.0.0:9090", "[::]:9090"
  /// http.admin_token: the bearer token of state-changing control-plane
  /// calls when `listen` is not loopback ("" = none: such calls refused).
  std::string admin_token;
  /// http.api_key_files: LMCache 0.5.7's --api-key-file, repeatable: each
  /// file holds one accepted API key; with LMCACHE_API_KEY(_FILE) and
  /// LMCACHE_HTTP_API_KEY(_FILE) (app/api_keys.hpp). Any key configured:
  /// every HTTP path but /, /healthcheck, /healthz and /readyz needs one.
  std::vector<std::string> api_key_files;
};

/// [coordinator]: membership in an LMCache fleet coordinator (`lmcache
/// coordinator`, lmcache.v1.mp_coordinator): register, heartbeat,
/// re-register when it forgot us, deregister at shutdown (app/coordinator_member).
struct coordinator_config {
  std::string url;               ///< "http://host:port"; "" = no coordinator
  std::string advertise_address; ///< the IP it reaches our HTTP port at; "" = the outbound one
  std::string instance_id;       ///< "" = the coordinator assigns one
  duration heartbeat_interval{};
  /// Report L1 chunks and L2 objects placed, dropped and read as LMCache's
  /// CacheEventBatch (POST /events; app/coordinator_events). Needs l2.format = "lmcache":
  /// the coordinator keys on LMCache's ObjectKey.
  bool event_reporting = false;
  duration event_flush_interval{}; ///< LMCache's --coordinator-event-flush-interval
  uint64_t event_queue_max = 0;    ///< events waiting for a POST; more are dropped (counted)
};

struct config {
  sidecar_config sidecar;
  events_config events;
  cache_config cache;
  gpu_config gpu;
  security_config security;
  http_config http;
  l2_config l2;
  coordinator_config coordinator;
  /// The effective configuration as JSON, secrets redacted (GET /config).
  std::string effective_json;
};

/// The compiled-in default TOML text (config/default.toml).
extern const std::string_view default_config_toml;

/// Loads the default, then `file` (if not empty), then each `key=value` in
/// `overrides`. Returns the config or the first error: kind "io" (the file
/// cannot be read) or "config", its detail one line for stderr naming the
/// source, the line and the key ("config error: kvs.toml:3: key
/// 'events.fromat': unknown key").
expected<config> load_config(const std::string& file, const std::vector<std::string>& overrides);

/// Same, from TOML text (tests; `source` names it in errors).
expected<config> load_config_text(std::string_view toml_text, const std::string& source,
                                  const std::vector<std::string>& overrides = {});

/// "512MiB" -> bytes; nullopt when malformed.
std::optional<uint64_t> parse_size(std::string_view text);
/// "250ms" -> nanoseconds; nullopt when malformed.
std::optional<duration> parse_duration(std::string_view text);

/// vLLM/tokenspeed endpoint offset for DP rank r: tcp port + r, inproc/ipc
/// suffix `_dp{r}`, rank 0 unchanged. Error kind "bad_value" when the
/// endpoint can't be offset (the detail says why).
expected<std::string> offset_endpoint(const std::string& endpoint, int64_t rank);

/// Checks an HTTP listen address: an IPv4 address or an IPv6 address in
/// brackets, a colon and a port in 1..65535. Error kind "bad_value" saying why not.
status check_listen_address(const std::string& listen);

/// vLLM's bind-or-connect rule: bind when the endpoint has `*` or `::` or is
/// ipc:// or inproc://.
bool endpoint_binds(const std::string& endpoint);

/// cache.grpc_endpoint: "" (off), grpc://host:port (port 0-65535; 0 picks
/// one) or grpc+unix:///absolute/path. Error kind "bad_value".
status check_grpc_endpoint(const std::string& endpoint);

/// True when only this machine can reach `endpoint`: ipc://, inproc://, or
/// tcp:// on a loopback host (127.x.x.x, localhost, ::1).
bool endpoint_is_local(const std::string& endpoint);

/// The CAF scheduler's thread count: sidecar.worker_threads, or when 0 (auto)
/// 1, and 2 with the cache server and an L2 tier. The scheduled actors
/// (publisher and replay per rank; session router, sessions, store,
/// registry) are light and hand each request on to each other: on one
/// thread that costs no wake-up of a second one (BENCHMARKS.md, "One
/// scheduler thread for the relay alone" and "... for the cache server");
/// the chunk copies run on the transfer actor's own thread. Only the store's
/// copies of L2 fetches into L1 run on a scheduler thread: with an L2 a
/// second one keeps the other sessions moving meanwhile.
int64_t scheduler_threads(const config& c);

/// Human form of a duration for logs ("10s", "250ms").
std::string to_string(duration d);

} // namespace kvs
