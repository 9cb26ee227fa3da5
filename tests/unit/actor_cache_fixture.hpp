// Shared by the deterministic cache-actor tests (test_actor_cache_*.cpp):
// CAF's test_coordinator (no threads: sched.run() delivers everything,
// sched.trigger_timeouts() fires every delayed message), the default config
// (config/default.toml: the one source of defaults), an engine's KV pools in
// POSIX shared memory for the host transfer backend, a stand-in for the
// engine bridge that records what it is sent, and a one-shot requester.
#pragma once

#include "actors/caf_error.hpp"
#include "actors/cache/gpu_transfer.hpp"
#include "actors/cache/registry.hpp"
#include "actors/cache/session_router.hpp"
#include "actors/cache/store.hpp"
#include "config/config.hpp"
#include "gpu/transfer_backend.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"
#include "caf_test_fixture.hpp"
#include "shm_object.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/send.hpp>
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvs::test {

/// An SGLang-style engine: per layer one K and one V pool of kPages pages
/// of kPage tokens, kTokenBytes per token (1 head x 4 dims, bf16).
struct engine_pools {
  static constexpr int64_t kLayers = 2, kPage = 16, kPages = 64, kHeads = 1, kDim = 4;
  static constexpr uint64_t kTokenBytes = kHeads * kDim * 2;
  static constexpr uint64_t kPoolBytes = kPages * kPage * kTokenBytes;

  std::vector<std::unique_ptr<shm_object>> objects; ///< K0, K1, V0, V1
  std::vector<tensor_desc> tensors;

  engine_pools() {
    for (uint32_t i = 0; i < 2 * kLayers; ++i) {
      objects.push_back(std::make_unique<shm_object>(kPoolBytes));
      objects.back()->fill(1 + i);
      tensor_desc t;
      t.kind = tensor_desc::memory_kind::host_shm;
      t.shm_name = objects.back()->name();
      t.dtype = "bfloat16";
      t.element_size = 2;
      t.shape = {kPages * kPage, kHeads, kDim};
      t.stride = {kHeads * kDim, kDim, 1};
      tensors.push_back(std::move(t));
    }
  }

  /// The bytes of page `page` in every pool, in pool order.
  std::vector<uint8_t> page_bytes(int64_t page) const {
    std::vector<uint8_t> out;
    const auto n = static_cast<size_t>(kPage * kTokenBytes);
    for (auto& o : objects) {
      auto* p = o->data() + static_cast<size_t>(page) * n;
      out.insert(out.end(), p, p + n);
    }
    return out;
  }

  kv_layout layout() const {
    kv_layout_hints h;
    h.engine_type = engine_type::sglang;
    h.tokens_per_block = kPage;
    auto l = detect_kv_layout(tensors, h);
    REQUIRE_MESSAGE(l.has_value(), to_string(l.error_value()));
    return l.value();
  }
};

/// What a stand-in engine bridge was sent.
struct bridge_log {
  std::vector<mp_reply> replies;
  std::vector<int64_t> reaped;
  size_t records = 0;
};

inline engine_bridge_actor::behavior_type fake_bridge(engine_bridge_actor::pointer,
                                                      bridge_log* log) {
  return {[log](mp_reply& r) { log->replies.push_back(std::move(r)); },
          [log](kv_event_records& r) { log->records += r.records.size(); },
          [log](reaped_atom, int64_t id) { log->reaped.push_back(id); },
          // The gRPC transport's messages: nothing in these tests sends them.
          [](lmcache_frames&) {}, [](grpc_atom, lmcache_reply_sink_ptr&) {}, [](sweep_atom) {},
          // The bridges' built-ins (bridge_actor): nothing here sends them.
          [](stop_atom) {}, [](stats_atom) {}, [](metrics_atom, const caf::actor&) {}};
}

/// A reply or the error a request failed with.
template <class T>
struct outcome {
  std::optional<T> value;
  std::optional<error> failure;
};

/// A state of a running stateful actor (the test coordinator runs nothing
/// concurrently, so reading it between sched.run() calls is safe).
template <class State, class Handle>
State& state_of(const Handle& h) {
  auto* self = dynamic_cast<typename Handle::template stateful_pointer<State>>(
    caf::actor_cast<caf::abstract_actor*>(h));
  REQUIRE(self != nullptr);
  return self->state;
}

struct fixture : caf_test_fixture {
  /// config/default.toml: every actor parameter below comes from it.
  const config cfg = load_config("", {}).value();
  const int64_t chunk = cfg.cache.chunk_size;
  /// Stopped at the end: their timers (sweeps) keep them alive otherwise,
  /// and the actor system waits for every actor before it goes.
  std::vector<caf::actor> spawned;

  ~fixture() {
    for (auto& a : spawned)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    sched.run();
  }

  /// Spawns and remembers an actor (stopped by the destructor).
  template <class... Ts>
  auto spawn(Ts&&... xs) {
    auto h = sys.spawn(std::forward<Ts>(xs)...);
    spawned.push_back(caf::actor_cast<caf::actor>(h));
    return h;
  }

  /// Sends `req` to `h` from a one-shot actor, runs everything, and returns
  /// the answer or the error.
  template <class T, class Handle, class Req>
  outcome<T> ask(const Handle& h, Req req) {
    auto out = std::make_shared<outcome<T>>();
    // Arguments, not captures: CAF 0.17 dereferences a null argument tuple
    // for an actor function without arguments (UBSan reports it).
    sys.spawn(
      [](caf::event_based_actor* self, Handle to, Req q, std::shared_ptr<outcome<T>> into) {
        self->request(to, caf::infinite, std::move(q))
          .then([into](T& v) { into->value = std::move(v); },
                [into](caf::error& e) { into->failure = from_caf_error(e); });
      },
      h, std::move(req), out);
    sched.run();
    return *out;
  }

  std::shared_ptr<slot_pool> make_l1(size_t bytes = size_t{4} << 20) {
    pool_options po;
    po.capacity_bytes = bytes;
    po.hugepages = false;
    auto pool = slot_pool::create(po);
    REQUIRE_MESSAGE(pool.has_value(), to_string(pool.error_value()));
    return std::shared_ptr<slot_pool>{std::move(pool.value())};
  }

  gpu_transfer_actor spawn_gpu(std::shared_ptr<slot_pool> l1) {
    gpu_transfer_params p;
    p.backend = make_host_backend();
    p.l1 = std::move(l1);
    p.refuse_copies = std::make_shared<std::atomic<bool>>(false);
    return spawn(gpu_transfer, std::move(p));
  }

  /// The store's parameters from the default config, over `l1`.
  store_params store_params_for(std::shared_ptr<slot_pool> l1) const {
    store_params p;
    p.pool = std::move(l1);
    p.chunk_size = chunk;
    p.evict_high = cfg.cache.evict_high;
    p.evict_low = cfg.cache.evict_low;
    p.lock_ttl = cfg.cache.lock_ttl;
    return p;
  }

  store_actor spawn_store(std::shared_ptr<slot_pool> l1) {
    return spawn(store, store_params_for(std::move(l1)));
  }

  registry_actor spawn_registry(gpu_transfer_actor gpu, store_actor st) {
    registry_params p;
    p.chunk_size = chunk;
    p.heartbeat_timeout = cfg.cache.heartbeat_timeout;
    p.registration_grace = cfg.cache.registration_grace;
    p.gpu = std::move(gpu);
    p.store = std::move(st);
    p.shm_allow_prefixes = cfg.cache.shm_allow_prefixes;
    return spawn(registry, std::move(p));
  }

  session_router_params router_params(registry_actor reg, store_actor st,
                                      gpu_transfer_actor gpu) {
    session_router_params p;
    p.chunk_size = chunk;
    p.session_ttl = cfg.cache.session_ttl;
    p.max_sessions = static_cast<size_t>(cfg.cache.max_sessions);
    p.registry = std::move(reg);
    p.store = std::move(st);
    p.gpu = std::move(gpu);
    return p;
  }
};

/// A request as the engine bridge hands it on: decoded, shared.
inline mp_call call_of(mp_op op, mp_request_body body, int64_t uid = 1,
                       std::string identity = "client-a") {
  auto r = std::make_shared<mp_request>();
  r->uid = uid;
  r->uid_frame = "uid-" + std::to_string(uid);
  r->op_frame = "op-" + std::to_string(static_cast<int>(op));
  r->op = op;
  r->body = std::move(body);
  return mp_call{std::move(identity), std::move(r), std::nullopt, {}};
}

/// `n_chunks` chunks of tokens (deterministic per salt) for request `rid`.
inline cache_key key_of(const std::string& rid, size_t n_tokens, uint32_t salt,
                        std::optional<int64_t> worker = 0) {
  cache_key k;
  k.model_name = "m";
  k.world_size = 1;
  k.worker_id = worker;
  for (size_t i = 0; i < n_tokens; ++i)
    k.token_ids.push_back(static_cast<uint32_t>(i * 7 + salt));
  k.start = 0;
  k.end = static_cast<int64_t>(n_tokens);
  k.request_id = rid;
  return k;
}

} // namespace kvs::test
