#include "actors/cache/registry.hpp"
#include "actors/cache/op_handlers.hpp"

#include "actors/actor_logging.hpp"
#include "actors/caf_error.hpp"
#include "actors/cache/sweep.hpp"
#include "config/config.hpp"
#include "gpu/peer_process.hpp"
#include "gpu/shm_policy.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"

#include <unistd.h>
#include <algorithm>

namespace kvs {

namespace {

using self_ptr = registry_actor::stateful_pointer<registry_state>;

kv_layout_hints to_layout_hints(const register_kv_cache_req& r) {
  kv_layout_hints h;
  h.engine_type = r.engine;
  h.tokens_per_block = r.hints.tokens_per_block.value_or(0);
  h.kv_layout = r.hints.kv_layout;
  h.kv_list_layout = r.hints.kv_list_layout;
  for (auto& g : r.groups)
    h.group_layer_indices.push_back(g.layer_indices);
  return h;
}

void forget(self_ptr self, int64_t id) {
  self->send(self->state.p.gpu, gpu_close{id});
  self->request(self->state.p.store, caf::infinite, store_configure{id, 0})
    .then([](store_configure_reply&) {}, [](caf::error&) {});
  self->state.instances.erase(id);
}

/// Why one of the registration's shared-memory objects may not be mapped
/// for this client (gpu/shm_policy.hpp), or nullopt.
std::optional<std::string> refuse_shm(const registry_state& st, const mp_call& call,
                                      const register_kv_cache_req& r) {
  // Over ipc:// the objects must belong to the connecting process's user;
  // over tcp:// the peer is unknown, so they must belong to the sidecar's.
  const uint32_t uid = call.peer_uid.value_or(static_cast<uint32_t>(geteuid()));
  for (size_t i = 0; i < r.kv_caches.size(); ++i) {
    const auto& t = r.kv_caches[i];
    if (t.kind != tensor_desc::memory_kind::host_shm)
      continue;
    auto where = [&] { return "tensor " + std::to_string(i) + " ('" + t.shm_name + "'): "; };
    if (auto ok = check_shm_name(t.shm_name, st.p.shm_allow_prefixes); !ok)
      return where() + ok.error_value().detail;
    if (auto ok = check_shm_owner(t.shm_name, uid); !ok)
      return where() + ok.error_value().detail + (call.peer_uid ? "" : " (over tcp:// the objects must belong to "
                                                    "the sidecar's user; use an ipc:// "
                                                    "cache.endpoint for other users)");
    // Proof of possession: the sidecar opens the object with its own
    // rights, so it maps only what the client's own process holds (open or
    // mapped). Where the process cannot be told (another PID namespace, a
    // grpc+unix:// peer) or its /proc is not ours to read, the owner check
    // above is what stands (README: Security).
    if (call.peer_pid > 0 && process_holds_shm(call.peer_pid, t.shm_name) == false)
      return where() + "the client's process (pid " + std::to_string(call.peer_pid)
             + ") has it neither open nor mapped: a client registers only shared memory it "
               "holds itself";
  }
  return std::nullopt;
}

void on_register(self_ptr self, const mp_call& call, const register_kv_cache_req& r) {
  auto& st = self->state;
  auto fail = [self, call, id = r.instance_id](const std::string& why) {
    auto& st = self->state;
    ++st.failed;
    // LMCache's server sends nothing when a registration fails, and the
    // connector's start-up fails on its 300 s RPC timeout. The same start-up
    // failure comes at once here, with the reason in the client's exception
    // (lmcache_wire/lmcache_failure.hpp).
    KVS_ERROR(st.label, "register_kv_cache of instance {} failed: {}", id, why);
    if (!st.bridge)
      return;
    self->send(st.bridge, make_failure_reply(call, "register_kv_cache failed: " + why));
    // No registration left: the bridge frees the id's connection binding.
    if (!st.instances.count(id))
      self->send(st.bridge, reaped_atom_v, id);
  };
  if (auto why = refuse_shm(st, call, r)) {
    fail(*why);
    return;
  }
  auto layout = detect_kv_layout(r.kv_caches, to_layout_hints(r));
  if (!layout) {
    fail(to_string(layout.error_value()));
    return;
  }
  auto lay = std::make_shared<const kv_layout>(std::move(layout.value()));
  auto slot = lay->chunk_bytes(static_cast<uint64_t>(st.p.chunk_size));
  if (slot == 0) {
    fail("chunk_size " + std::to_string(st.p.chunk_size) + " is not a multiple of the engine's "
         "block size " + std::to_string(lay->block_size));
    return;
  }
  // LMCache keeps an instance's ping-proven flag across a re-registration
  // (its re-register is a no-op that refreshes last_seen); we replace the
  // registration (the pools may be new) but keep the flag.
  bool pinged = false;
  if (auto old = st.instances.find(r.instance_id); old != st.instances.end()) {
    KVS_INFO(st.label, "instance {} registers again: replacing its registration", r.instance_id);
    pinged = old->second.pinged;
    forget(self, r.instance_id);
  }
  gpu_open op{r.instance_id, r.engine,
              std::make_shared<const std::vector<tensor_desc>>(r.kv_caches), lay};
  self->request(st.p.gpu, caf::infinite, std::move(op))
    .then([self, call, r, lay, slot, fail, pinged](gpu_status_reply&) {
      store_configure conf{r.instance_id, slot};
      conf.model = r.model_name; // the L2 prefetch's layout (store_l2.cpp)
      conf.world_size = r.world_size;
      self->request(self->state.p.store, caf::infinite, std::move(conf))
        .then([self, call, r, lay, fail, pinged](store_configure_reply&) {
          auto& st = self->state;
          registry_state::instance in;
          in.model = r.model_name;
          in.world_size = r.world_size;
          in.engine = to_string(r.engine);
          in.layout = lay;
          in.tensors = r.kv_caches.size();
          in.last_seen = registry_state::clock::now();
          in.pinged = pinged;
          st.instances[r.instance_id] = std::move(in);
          ++st.registered;
          KVS_INFO(st.label,
                   "instance {} registered: model {}, world_size {}, engine {}, layout {} "
                   "({} layers, {} blocks of {} tokens, {} B per token per layer), {} tensors{}",
                   r.instance_id, r.model_name, r.world_size, to_string(r.engine),
                   to_string(lay->kind), lay->num_layers, lay->num_blocks, lay->block_size,
                   lay->token_bytes, r.kv_caches.size(),
                   lay->note.empty() ? "" : "; note: " + lay->note);
          self->send(st.bridge, make_reply(call, std::nullopt));
        },
        [self, id = r.instance_id, fail](caf::error& err) {
          self->send(self->state.p.gpu, gpu_close{id});
          fail(from_caf_error(err).detail);
        });
    },
    [fail](caf::error& err) {
      // The transfer actor's refusal names what could not be opened.
      auto e = from_caf_error(err);
      fail(e.kind == "actor" ? e.detail : "opening its memory: " + e.detail);
    });
}

/// Bytes of one element of the torch dtype `name` (RegisterEngineDrivenContextPayload
/// dtype_str: a torch attribute name), 0 when it is none we know.
uint32_t torch_dtype_size(const std::string& name) {
  static constexpr std::pair<const char*, uint32_t> k_sizes[] = {
      {"float16", 2}, {"half", 2}, {"bfloat16", 2}, {"float32", 4}, {"float", 4},
      {"float64", 8}, {"double", 8}, {"float8_e4m3fn", 1}, {"float8_e5m2", 1},
      {"float8_e4m3fnuz", 1}, {"float8_e5m2fnuz", 1}, {"uint8", 1}, {"int8", 1},
      {"int16", 2}, {"int32", 4}, {"int64", 8}};
  for (const auto& [n, size] : k_sizes)
    if (name == n)
      return size;
  return 0;
}

/// One engine-driven chunk as the engine views it: [2, NL, T, H], or one
/// plane [NL, T, H] (MLA, fused K/V, indexers), of `dtype` (`elem` bytes an
/// element). Each factor is bounded by the caller: the product cannot overflow.
stage_group chunk_stage(int64_t planes, int64_t layers, int64_t tokens, int64_t hidden,
                        const std::string& dtype, uint32_t elem) {
  stage_group sg;
  sg.chunk_shape = planes == 1 ? std::vector<int64_t>{layers, tokens, hidden}
                               : std::vector<int64_t>{2, layers, tokens, hidden};
  sg.dtype = dtype;
  sg.format = planes == 1 ? chunk_format_single_plane : chunk_format_kv_2ltd;
  sg.slot_bytes = elem;
  for (int64_t d : sg.chunk_shape)
    sg.slot_bytes *= static_cast<uint64_t>(d);
  return sg;
}

/// A multi-group (hybrid-KV) registration's groups as the store and the
/// sessions use them, or why one is refused (naming the group and field).
/// Mirrors LMCache 0.5.7's EngineDrivenTransferModule: a group's chunk is
/// [2, NL, W, H] (or [NL, W, H] with one plane) of its own dtype, W its
/// window_tokens (0: the whole chunk); window_chunks 0 means the whole
/// prefix, else that many trailing chunks make a hit.
expected<std::vector<stage_group>> group_stages(const register_engine_driven_req& r,
                                                int64_t chunk_size) {
  std::vector<stage_group> out;
  for (size_t g = 0; g < r.group_layouts->size(); ++g) {
    const auto& gl = (*r.group_layouts)[g];
    auto bad = [&](const std::string& why) {
      return error{"bad_layout", "group_layouts[" + std::to_string(g) + "]: " + why};
    };
    const uint32_t elem = torch_dtype_size(gl.dtype_str);
    if (elem == 0)
      return bad("invalid dtype_str '" + gl.dtype_str.substr(0, 32) + "'");
    if (gl.num_layers <= 0 || gl.num_layers > 16384 || gl.hidden_dim_size <= 0
        || gl.hidden_dim_size > (int64_t{1} << 20))
      return bad("num_layers " + std::to_string(gl.num_layers) + " or hidden_dim_size "
                 + std::to_string(gl.hidden_dim_size) + " out of range");
    const int64_t tokens = gl.window_tokens == 0 ? chunk_size : gl.window_tokens;
    if (tokens < 0 || tokens > chunk_size)
      return bad("window_tokens " + std::to_string(gl.window_tokens) + " outside 0.."
                 + std::to_string(chunk_size) + " (the chunk size)");
    const int64_t planes = gl.kv_size == 0 ? (r.use_mla ? 1 : 2) : gl.kv_size;
    if (planes != 1 && planes != 2)
      return bad("kv_size " + std::to_string(gl.kv_size) + " (1 or 2 planes)");
    if (gl.window_chunks < 0 || gl.window_chunks > (int64_t{1} << 20))
      return bad("window_chunks " + std::to_string(gl.window_chunks) + " out of range");
    stage_group sg = chunk_stage(planes, gl.num_layers, tokens, gl.hidden_dim_size, gl.dtype_str,
                                 elem);
    sg.window = gl.window_chunks == 0 ? -1 : static_cast<int32_t>(gl.window_chunks);
    out.push_back(std::move(sg));
  }
  return out;
}

std::string describe_groups(const std::vector<stage_group>& groups) {
  std::string out;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& sg = groups[g];
    std::string shape;
    for (auto d : sg.chunk_shape)
      shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    out += fmt::format("{}group {}: {} [{}] {}", g ? "; " : "", g,
                       sg.window < 0 ? std::string{"whole prefix"}
                                     : fmt::format("last {} chunk(s)", sg.window),
                       shape, sg.dtype);
  }
  return out;
}

/// 0.5.7's reply names the engine block id that means "no KV" (its server's
/// --null-block-id, 0 by default); only 0.5.7 payloads (with group_layouts)
/// get the field, so 0.5.6 replies stay byte for byte LMCache 0.5.6's.
std::optional<int64_t> null_block_id_for(const register_engine_driven_req& r) {
  return r.group_layouts ? std::optional<int64_t>{0} : std::nullopt;
}

/// LMCache's engine-driven registration (EngineDrivenTransferModule): the
/// engine gathers its pages into chunk buffers itself; kvsidecar gives the
/// instance a staging pool of its own (gpu/staging_pool.hpp) and answers
/// with its name and size.
void on_register_engine_driven(self_ptr self, const mp_call& call,
                               const register_engine_driven_req& r) {
  auto& st = self->state;
  auto fail = [self, call, id = r.instance_id](const std::string& why) {
    auto& st = self->state;
    ++st.failed;
    KVS_ERROR(st.label, "register_kv_cache_engine_driven_context of instance {} failed: {}", id,
              why);
    if (!st.bridge)
      return;
    self->send(st.bridge,
               make_failure_reply(call, "register_kv_cache_engine_driven_context failed: " + why));
    if (!st.instances.count(id))
      self->send(st.bridge, reaped_atom_v, id);
  };
  // LMCache: a registered instance registering again keeps its context and
  // only refreshes its liveness (the engine may have mapped the pool).
  if (auto old = st.instances.find(r.instance_id);
      old != st.instances.end() && old->second.engine_driven && old->second.model == r.model_name
      && old->second.world_size == r.world_size) {
    old->second.last_seen = registry_state::clock::now();
    KVS_INFO(st.label, "instance {} registers again (engine-driven): keeps its staging pool {}",
             r.instance_id, old->second.shm_name);
    self->send(st.bridge, make_reply(call, encode_reply_engine_driven_context(
                                             old->second.shm_name, old->second.pool_size,
                                             null_block_id_for(r))));
    return;
  }
  // A hybrid model (sliding-window, recurrent or indexer groups beside full
  // attention): each group's chunks are objects of their own, each staged
  // in a slot of its own (or inline).
  std::shared_ptr<const std::vector<stage_group>> groups;
  if (r.group_layouts && r.group_layouts->size() > 1) {
    auto gs = group_stages(r, st.p.chunk_size);
    if (!gs) {
      fail(gs.error_value().detail);
      return;
    }
    groups = std::make_shared<const std::vector<stage_group>>(std::move(gs.value()));
  }
  const uint32_t elem = torch_dtype_size(r.dtype_str);
  if (elem == 0) {
    fail("invalid dtype_str '" + r.dtype_str.substr(0, 32) + "': not a torch dtype name "
         "(e.g. 'bfloat16', 'float16', 'float32')");
    return;
  }
  auto in_range = [](int64_t v, int64_t hi) { return v > 0 && v <= hi; };
  if (!in_range(r.num_layers, 16384) || !in_range(r.hidden_dim_size, int64_t{1} << 20)
      || !in_range(r.block_size, int64_t{1} << 20) || !in_range(r.world_size, 1 << 16)) {
    fail("num_layers " + std::to_string(r.num_layers) + ", hidden_dim_size "
         + std::to_string(r.hidden_dim_size) + ", block_size " + std::to_string(r.block_size)
         + " or world_size " + std::to_string(r.world_size) + " out of range");
    return;
  }
  const int64_t slots_per_chunk = r.num_physical_slots.value_or(st.p.chunk_size);
  if (slots_per_chunk != st.p.chunk_size) {
    fail("num_physical_slots " + std::to_string(slots_per_chunk) + " differs from the chunk size "
         + std::to_string(st.p.chunk_size) + " (compressed engine-driven chunks are not served)");
    return;
  }
  // The instance's chunk (LMCache's use_mla flag: one plane); a hybrid
  // instance's is its group 0's, the others are sized per group.
  const stage_group own = groups ? groups->front()
                                 : chunk_stage(r.use_mla ? 1 : 2, r.num_layers, slots_per_chunk,
                                               r.hidden_dim_size, r.dtype_str, elem);
  const uint64_t slot = own.slot_bytes;
  store_configure conf{r.instance_id, slot};
  conf.model = r.model_name;
  conf.world_size = r.world_size;
  if (groups) {
    for (const auto& g : *groups) {
      conf.group_slot_bytes.push_back(g.slot_bytes);
      conf.group_windows.push_back(g.window);
      conf.group_formats.push_back(g.format);
    }
  }
  bool pinged = false;
  if (auto old = st.instances.find(r.instance_id); old != st.instances.end()) {
    KVS_INFO(st.label, "instance {} registers again: replacing its registration", r.instance_id);
    pinged = old->second.pinged;
    forget(self, r.instance_id);
  }
  // A hybrid instance stages every group's chunk in a slot of its own:
  // slots as long as the largest group's chunk, engine_driven_slots per group.
  uint64_t pool_slot = slot;
  uint32_t pool_slots = st.p.engine_driven_slots;
  if (groups) {
    for (const auto& g : *groups)
      pool_slot = std::max(pool_slot, g.slot_bytes);
    pool_slots = static_cast<uint32_t>(
      std::min<uint64_t>(uint64_t{pool_slots} * groups->size(), UINT32_MAX));
  }
  // Writing L1 in place (cache.engine_driven_in_place): the store opens
  // the instance's L1 arena first, with room after the L1 offsets for its
  // staging slots (chunks stored by others are still copied through them).
  if (st.p.engine_driven_in_place && !st.p.engine_driven_inline) {
    conf.arena = true;
    conf.owner_uid = call.peer_uid;
    const uint64_t page = 4096;
    conf.arena_extra_bytes = (pool_slot * pool_slots + page - 1) / page * page;
  }
  gpu_stage_open op{r.instance_id,    pool_slot,  pool_slots,
                    own.chunk_shape,  own.dtype,  own.format,
                    call.peer_uid,    st.p.engine_driven_inline,
                    groups};
  auto registered = [self, call, r, groups, pinged](const gpu_stage_opened& opened,
                                                    bool in_place) {
    auto& st = self->state;
    registry_state::instance in;
    in.model = r.model_name;
    in.world_size = r.world_size;
    in.engine = "engine_driven";
    in.last_seen = registry_state::clock::now();
    in.pinged = pinged;
    in.engine_driven = true;
    in.shm_name = opened.shm_name;
    in.pool_size = opened.pool_size;
    st.instances[r.instance_id] = std::move(in);
    ++st.registered;
    const std::string where =
      opened.shm_name.empty()
        ? std::string("inline transfers (no pool: the chunks travel in the messages)")
        : fmt::format("{} {} of {} bytes", in_place ? "L1 arena (written in place)" : "staging pool",
                      opened.shm_name, opened.pool_size);
    if (groups) {
      KVS_INFO(st.label,
               "instance {} registered (engine-driven, a hybrid model of {} groups): "
               "model {}, world_size {}, {}; {}",
               r.instance_id, groups->size(), r.model_name, r.world_size,
               describe_groups(*groups), where);
    } else {
      KVS_INFO(st.label,
               "instance {} registered (engine-driven): model {}, world_size {}, {} layers, "
               "hidden {}, {}, {} chunks ({}), {}",
               r.instance_id, r.model_name, r.world_size, r.num_layers, r.hidden_dim_size,
               r.dtype_str, r.use_mla ? "one plane [NL, T, H]" : "K and V [2, NL, T, H]",
               r.use_mla ? "single_plane" : "KV_2LTD", where);
    }
    self->send(st.bridge, make_reply(call, encode_reply_engine_driven_context(
                                             opened.shm_name, opened.pool_size,
                                             null_block_id_for(r))));
  };
  self->request(st.p.store, caf::infinite, conf)
    .then(
      [self, op, registered, fail, id = r.instance_id](store_configure_reply& conf_reply) mutable {
        const bool in_place = !conf_reply.arena_name.empty();
        op.arena_name = conf_reply.arena_name;
        op.arena_origin = conf_reply.arena_origin;
        op.arena_size = conf_reply.arena_size;
        self->request(self->state.p.gpu, caf::infinite, std::move(op))
          .then([registered, in_place](gpu_stage_opened& opened) { registered(opened, in_place); },
                [self, id, fail](caf::error& err) {
                  // The store forgets the instance (and closes its arena).
                  self->request(self->state.p.store, caf::infinite, store_configure{id, 0})
                    .then([](store_configure_reply&) {}, [](caf::error&) {});
                  fail(from_caf_error(err).detail);
                });
      },
      [fail](caf::error& err) { fail(from_caf_error(err).detail); });
}

// -- The ops the op table routes to the registry ------------------------------

void unregister(self_ptr self, const mp_call& call, int64_t id) {
  auto& st = self->state;
  if (st.instances.count(id)) {
    forget(self, id);
    KVS_INFO(st.label, "instance {} unregistered", id);
  } else {
    KVS_WARN(st.label, "{} of unknown instance {}", to_string(call.request->op), id);
  }
  self->send(st.bridge, make_reply(call, std::nullopt));
}

/// The step of each op the registry serves (registry_serves: every row
/// routed here has one, tests/unit/test_actor_op_handlers.cpp).
struct registry_step {
  mp_op op;
  void (*serve)(self_ptr, const mp_call&);
};
constexpr registry_step k_steps[] = {
  {mp_op::register_kv_cache,
   [](self_ptr self, const mp_call& call) {
     on_register(self, call, std::get<register_kv_cache_req>(call.request->body));
   }},
  {mp_op::register_kv_cache_engine_driven_context,
   [](self_ptr self, const mp_call& call) {
     on_register_engine_driven(self, call,
                               std::get<register_engine_driven_req>(call.request->body));
   }},
  {mp_op::unregister_kv_cache,
   [](self_ptr self, const mp_call& call) {
     unregister(self, call, std::get<unregister_kv_cache_req>(call.request->body).instance_id);
   }},
  {mp_op::unregister_kv_cache_engine_driven_context,
   [](self_ptr self, const mp_call& call) {
     unregister(self, call,
                std::get<unregister_engine_driven_req>(call.request->body).instance_id);
   }},
};

} // namespace

bool registry_serves(mp_op op) {
  for (const auto& step : k_steps)
    if (step.op == op)
      return true;
  return false;
}

stats_snapshot snapshot(const registry_state& st) {
  stats_snapshot s;
  s.actor = st.label;
  s.gauge("instances", "kvsidecar_cache_instances", st.instances.size())
    .counter("registered", "kvsidecar_cache_registrations_total", st.registered)
    .counter("failed", "kvsidecar_cache_registration_failures_total", st.failed)
    .counter("reaped", "kvsidecar_cache_instances_reaped_total", st.reaped)
    .counter("released", "kvsidecar_cache_instances_released_total", st.released);
  return s;
}

registry_actor::behavior_type registry(registry_actor::stateful_pointer<registry_state> self,
                                       registry_params params) {
  auto& st = self->state;
  st.p = std::move(params);
  st.label = log::label(registry_state::name, "", self->id());
  // LMCache 0.5.6's reaper (modules/management.py, lmcache_driven_transfer.py
  // reap_stale_instances): an instance that has pinged at least once is
  // reaped when silent for more than heartbeat_timeout, one that never
  // pinged (some adapters do not) after registration_grace; register, ping,
  // store and retrieve all count as signs of life, only a ping makes an
  // instance ping-proven; a timeout of 0 turns reaping off.
  log_lifecycle(self, st.label,
                st.p.heartbeat_timeout.count() == 0
                  ? std::string{"started: instances are never reaped (heartbeat_timeout 0)"}
                  : fmt::format("started: instances silent for over {} ({} if they never "
                                "pinged) are reaped",
                                to_string(st.p.heartbeat_timeout),
                                to_string(st.p.registration_grace)));
  arm_stats(self, st.p.stats_interval);
  auto reap_every = sweep_interval(st.p.heartbeat_timeout);
  if (st.p.heartbeat_timeout.count() > 0)
    self->delayed_send(self, reap_every, sweep_atom_v);
  return {
    [self](bridge_atom, engine_bridge_actor& bridge) { self->state.bridge = std::move(bridge); },
    [self](mp_call& call) {
      auto& st = self->state;
      for (const auto& step : k_steps)
        if (step.op == call.request->op) {
          step.serve(self, call);
          return;
        }
      // The router sends nothing else here; should it ever, the caller
      // still gets an answer.
      KVS_ERROR(st.label, "request of an op the registry does not serve: answered as failed");
      self->send(st.bridge, make_failure_reply(call, "not served by the registry"));
    },
    [self](seen_atom, int64_t id, bool ping) {
      auto i = self->state.instances.find(id);
      if (i != self->state.instances.end()) {
        i->second.last_seen = registry_state::clock::now();
        i->second.pinged = i->second.pinged || ping;
      }
    },
    [self](gone_atom, int64_t id) {
      // The connection that registered it ended (engine_bridge): the
      // instance goes now, not after heartbeat_timeout, so an engine that
      // restarts with the same id registers at once.
      auto& st = self->state;
      if (!st.instances.count(id))
        return;
      KVS_WARN(st.label, "instance {} released: the connection that registered it ended "
                         "(registration dropped, its sessions ended, their locks and staging "
                         "slots released)", id);
      forget(self, id);
      ++st.released;
    },
    [self, reap_every](sweep_atom) {
      auto& st = self->state;
      auto now = registry_state::clock::now();
      std::vector<int64_t> dead;
      std::vector<bool> pinged;
      for (auto& [id, in] : st.instances)
        if (now - in.last_seen > (in.pinged ? st.p.heartbeat_timeout : st.p.registration_grace)) {
          dead.push_back(id);
          pinged.push_back(in.pinged);
        }
      for (size_t d = 0; d < dead.size(); ++d) {
        auto id = dead[d];
        KVS_WARN(st.label, "instance {} silent for over {} ({}): reaped (registration dropped, "
                           "its sessions ended, their locks released)",
                 id, to_string(pinged[d] ? st.p.heartbeat_timeout : st.p.registration_grace),
                 pinged[d] ? "heartbeat_timeout" : "registration_grace: it never pinged");
        forget(self, id);
        ++st.reaped;
        if (st.bridge)
          self->send(st.bridge, reaped_atom_v, id);
      }
      self->delayed_send(self, reap_every, sweep_atom_v);
    },
    [self](stats_atom) {
      log_stats(self, snapshot(self->state), self->state.p.stats_interval);
    },
    [self](metrics_atom, const caf::actor& to) { send_snapshot(self, to, snapshot(self->state)); },
  };
}

} // namespace kvs
