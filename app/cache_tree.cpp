#include "app/cache_tree.hpp"

#include "actors/cache/engine_bridge.hpp"
#include "actors/cache/grpc_bridge.hpp"
#include "actors/cache/gpu_transfer.hpp"
#include "actors/cache/arena_prefault.hpp"
#include "actors/cache/l1_prefault.hpp"
#include "actors/cache/l2_tier.hpp"
#include "actors/cache/registry.hpp"
#include "actors/cache/session_router.hpp"
#include "actors/cache/store.hpp"
#include "actors/cache/store_l2.hpp"
#include "app/l2_backends.hpp"
#include "log/log.hpp"

#include <caf/send.hpp>

#include <algorithm>

namespace kvs {

namespace {

/// The transfer backend `gpu.backend` asks for, or why there is none.
std::shared_ptr<transfer_backend> pick_backend(const gpu_config& gpu, std::string& error) {
  const gpu_backend wanted = gpu.backend;
  const std::string who = log::label("cache_server", "", 0);
  host_backend_options host;
  host.prefault = gpu.host_prefault;
  host.copy_threads = static_cast<size_t>(gpu.host_copy_threads);
  if (wanted == gpu_backend::host) {
    KVS_INFO(who, "gpu.backend = \"host\": engine KV pools are host shared memory");
    return make_host_backend(host);
  }
  auto cuda = make_cuda_backend();
  const std::string why = cuda ? std::string() : cuda.error_value().detail;
  if (cuda) {
    KVS_INFO(who, "gpu.backend = \"{}\": CUDA backend ({})", to_string(wanted), why);
    return std::move(*cuda);
  }
  if (wanted == gpu_backend::cuda) {
    error = "gpu.backend = \"cuda\" but the CUDA backend cannot run: " + why;
    return nullptr;
  }
  KVS_INFO(who, "gpu.backend = \"auto\": no usable GPU ({}), using the host backend", why);
  return make_host_backend(host);
}

/// Opens the backends `cfg.l2` enables and spawns the L2 actor (detached): an
/// empty link when no tier is enabled, an error naming the key when a tier
/// cannot start (the disk path is unusable).
expected<store_l2_link> spawn_l2(caf::actor_system& sys, const config& cfg,
                                 publisher_actor events, relay_queue_ptr events_queue,
                                 std::shared_ptr<cache_event_sink> coordinator) {
  store_l2_link link;
  auto& c = cfg.l2;
  if (!c.enabled())
    return link;
  auto backends = open_l2_backends(c);
  if (!backends)
    return backends.error_value();
  l2_params p;
  p.backends = std::move(*backends);
  p.announce_found = c.format == l2_format::lmcache;
  p.quota_isolated = c.quota_isolated;
  p.quota_rule = l2_quota_rule{c.quota_watermark, c.quota_eviction_ratio};
  p.quota_interval = c.quota_interval;
  for (auto& [salt, bytes] : cfg.cache.quotas)
    p.quota_limits[salt] = bytes;
  link.queue = std::make_shared<admit_budget>(static_cast<int64_t>(c.queue_bytes));
  p.queue = link.queue;
  p.chunk_size = cfg.cache.chunk_size;
  p.events = std::move(events);
  p.events_queue = std::move(events_queue);
  p.stats_interval = cfg.sidecar.stats_interval;
  p.coordinator = std::move(coordinator);
  link.actor = sys.spawn<caf::detached>(l2_tier, std::move(p));
  return link;
}

} // namespace

cache_tree spawn_cache_tree(caf::actor_system& sys, zmq::context_t& ctx,
                                       const config& cfg, caf::actor supervisor,
                                       publisher_actor events, relay_queue_ptr events_queue,
                                       std::shared_ptr<cache_event_sink> coordinator) {
  cache_tree out;
  auto& c = cfg.cache;
  auto interval = cfg.sidecar.stats_interval;
  auto backend = pick_backend(cfg.gpu, out.error);
  if (!backend)
    return out;
  pool_options po;
  po.capacity_bytes = c.l1_size;
  po.populate = c.l1_prefault == l1_prefault_mode::start;
  // Arena extents: at most an eighth of L1, so a few in-place instances
  // and the copy-driven clients share it (slot_pool rounds it to 2 MiB).
  po.extent_bytes = std::max<uint64_t>(std::min<uint64_t>(c.l1_arena_extent, c.l1_size / 8),
                                       uint64_t{2} << 20);
  auto created = slot_pool::create(po);
  if (!created) {
    out.error = "cache.l1_size = " + std::to_string(c.l1_size) + " bytes: " + created.error_value().detail;
    return out;
  }
  std::shared_ptr<slot_pool> pool{std::move(*created)};
  if (auto pinned = backend->pin_host_memory(pool->base(), pool->mapped_bytes()); !pinned) {
    out.error = "pinning L1 (cache.l1_size) for the " + std::string{backend->name()}
                + " backend: " + pinned.error_value().detail;
    return out;
  }

  // The transfer actor shares L1's ownership with the store: a copy never
  // writes into memory the store's exit has unmapped.
  out.refuse_copies = std::make_shared<std::atomic<bool>>(false);
  auto gpu = sys.spawn<caf::detached>(
    gpu_transfer, gpu_transfer_params{backend, pool, out.refuse_copies, interval, c.l1_size});
  out.gpu = gpu;

  store_params sp;
  sp.pool = pool;
  sp.chunk_size = c.chunk_size;
  sp.evict_high = c.evict_high;
  sp.evict_low = c.evict_low;
  sp.lock_ttl = c.lock_ttl;
  sp.events = events;
  sp.events_queue = events_queue;
  sp.stats_interval = interval;
  sp.quota_isolated = c.quota_isolated;
  sp.quotas = c.quotas;
  sp.coordinator = coordinator;
  auto l2 = spawn_l2(sys, cfg, events, events_queue, std::move(coordinator)); // L2 tiers (none by default)
  if (!l2) {
    out.error = l2.error_value().detail;
    caf::anon_send_exit(gpu, caf::exit_reason::user_shutdown);
    return out;
  }
  sp.l2 = std::move(*l2);
  if (c.l1_prefault == l1_prefault_mode::background || c.l1_prefault == l1_prefault_mode::ahead) {
    // Spawned first so the store can nudge it; the store links to it.
    l1_prefault_params pp{pool, c.l1_prefault == l1_prefault_mode::ahead
                                  ? static_cast<size_t>(c.l1_prefault_ahead) : 0};
    sp.l1_prefault = sys.spawn<caf::detached>(l1_prefault, std::move(pp));
  }
  // cache.l1_arena_ahead: engine-driven arenas (L1 written in place) get
  // their next extent claimed and faulted in ahead of need.
  if (c.l1_arena_ahead && c.engine_driven_in_place && std::string{backend->name()} == "host")
    sp.arena_prefault = sys.spawn<caf::detached>(arena_prefault, pool);
  auto st = sys.spawn(store, sp);
  out.store = st;
  out.l2 = sp.l2.actor;
  // After each AllBlocksCleared of its rank, the store announces L1 again,
  // the L2 actor what its tiers hold.
  if (events) {
    caf::anon_send(events, cleared_atom_v, clear_listener_actor{st});
    if (sp.l2.actor)
      caf::anon_send(events, cleared_atom_v, clear_listener_actor{sp.l2.actor});
  }

  registry_params rp;
  rp.chunk_size = c.chunk_size;
  rp.heartbeat_timeout = c.heartbeat_timeout;
  rp.registration_grace = c.registration_grace;
  rp.gpu = gpu;
  rp.store = st;
  rp.stats_interval = interval;
  rp.shm_allow_prefixes = c.shm_allow_prefixes;
  rp.engine_driven_slots = static_cast<uint32_t>(c.engine_driven_slots);
  rp.engine_driven_inline = c.engine_driven_inline;
  // The CUDA backend pins L1 (cudaHostRegister): extents remapped under a
  // pinned range would leave the GPU copying to pages no longer L1's.
  rp.engine_driven_in_place = c.engine_driven_in_place && std::string{backend->name()} == "host";
  auto reg = sys.spawn(registry, rp);

  session_router_params rtp;
  rtp.chunk_size = c.chunk_size;
  rtp.l2_lmcache_names = cfg.l2.enabled() && cfg.l2.format == l2_format::lmcache;
  rtp.session_ttl = c.session_ttl;
  rtp.max_sessions = static_cast<size_t>(c.max_sessions);
  rtp.registry = reg;
  rtp.store = st;
  rtp.gpu = gpu;
  rtp.stats_interval = interval;
  auto router = sys.spawn(session_router, rtp);

  engine_bridge_params ep;
  ep.endpoint = c.endpoint;
  ep.chunk_size = c.chunk_size;
  ep.hwm = c.hwm;
  ep.kv_event_log_size = static_cast<size_t>(c.kv_event_log_size);
  ep.heartbeat_timeout = c.heartbeat_timeout;
  ep.router = router;
  ep.store = st;
  ep.curve_secret_key = cfg.security.curve_secret_key;
  ep.max_connections = cfg.cache.max_connections;
  auto engine = spawn_bridge<engine_bridge>(sys, ctx, supervisor, interval, ep);
  out.input_bridges.push_back(engine);
  if (!c.grpc_endpoint.empty()) {
    grpc_bridge_params gp;
    gp.server.endpoint = c.grpc_endpoint;
    gp.server.max_inflight = c.hwm;
    gp.server.tls_cert_pem = c.grpc_tls_cert_pem;
    gp.server.tls_key_pem = c.grpc_tls_key_pem;
    gp.server.tls_client_ca_pem = c.grpc_tls_client_ca_pem;
    gp.engine = engine;
    out.input_bridges.push_back(
      spawn_bridge<grpc_bridge>(sys, ctx, supervisor, interval, gp));
  }
  out.workers.insert(out.workers.end(), {router, reg, st, gpu});
  if (sp.l2.actor)
    out.workers.push_back(sp.l2.actor);
  out.summary.push_back(fmt::format("engine_bridge {} -> session_router -> registry, "
                                    "session[rid] (on demand), store (L1 {} MiB, chunk {} tokens)",
                                    c.endpoint, c.l1_size >> 20, c.chunk_size));
  if (!c.grpc_endpoint.empty())
    out.summary.push_back(fmt::format("grpc_bridge {} -> engine_bridge (LMCache's gRPC transport)",
                                      c.grpc_endpoint));
  out.summary.push_back(fmt::format("gpu_transfer ({} backend){}", backend->name(),
                                    events ? fmt::format(" ; store events -> publisher[dp={}]",
                                                         c.events_rank)
                                           : ""));
  return out;
}

} // namespace kvs
