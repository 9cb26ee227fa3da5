#include "actors/registry.hpp"

#include "actors/actor_logging.hpp"
#include "config/config.hpp"
#include "messages/lmcache_protocol.hpp"

#include <algorithm>

namespace kvs {

namespace {

using self_ptr = registry_actor::stateful_pointer<registry_state>;

kv_layout_hints to_layout_hints(const register_kv_cache_req& r) {
  kv_layout_hints h;
  h.engine_type = to_string(r.engine);
  h.tokens_per_block = r.hints.tokens_per_block.value_or(0);
  h.kv_layout = r.hints.kv_layout.value_or("");
  h.kv_list_layout = r.hints.kv_list_layout.value_or("");
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

void on_register(self_ptr self, const mp_call& call, const register_kv_cache_req& r) {
  auto& st = self->state;
  auto fail = [self, call, id = r.instance_id](const std::string& why) {
    ++self->state.failed;
    // LMCache's server sends nothing when a registration fails, and the
    // connector's start-up fails on its 300 s RPC timeout. The same start-up
    // failure comes at once here, with the reason in the client's exception
    // (messages/lmcache_failure.hpp).
    KVS_ERROR(self->state.label, "register_kv_cache of instance {} failed: {}", id, why);
    self->send(self->state.bridge, make_failure_reply(call, "register_kv_cache failed: " + why));
  };
  auto layout = detect_kv_layout(r.kv_caches, to_layout_hints(r));
  if (!layout) {
    fail(layout.error().kind + ": " + layout.error().detail);
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
  gpu_open op{r.instance_id, to_string(r.engine),
              std::make_shared<const std::vector<tensor_desc>>(r.kv_caches), lay};
  self->request(st.p.gpu, caf::infinite, std::move(op))
    .then([self, call, r, lay, slot, fail, pinged](gpu_status_reply& opened) {
      if (!opened.ok) {
        fail("opening its memory: " + opened.why);
        return;
      }
      self->request(self->state.p.store, caf::infinite, store_configure{r.instance_id, slot})
        .then([self, call, r, lay, fail, pinged](store_configure_reply& cfg) {
          auto& st = self->state;
          if (!cfg.ok) {
            self->send(st.p.gpu, gpu_close{r.instance_id});
            fail(cfg.why);
            return;
          }
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
        [fail](caf::error& err) { fail(caf::to_string(err)); });
    },
    [fail](caf::error& err) { fail(caf::to_string(err)); });
}

} // namespace

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
  auto reap_every = std::clamp<std::chrono::nanoseconds>(st.p.heartbeat_timeout / 4,
                                                         std::chrono::milliseconds{10},
                                                         std::chrono::seconds{5});
  if (st.p.heartbeat_timeout.count() > 0)
    self->delayed_send(self, reap_every, tick_atom_v);
  return {
    [self](mp_call& call) {
      auto& st = self->state;
      st.bridge = caf::actor_cast<engine_bridge_actor>(self->current_sender());
      auto& req = *call.request;
      if (auto* r = std::get_if<register_kv_cache_req>(&req.body)) {
        on_register(self, call, *r);
      } else if (auto* u = std::get_if<unregister_kv_cache_req>(&req.body)) {
        if (st.instances.count(u->instance_id)) {
          forget(self, u->instance_id);
          KVS_INFO(st.label, "instance {} unregistered", u->instance_id);
        } else {
          KVS_WARN(st.label, "unregister_kv_cache of unknown instance {}", u->instance_id);
        }
        self->send(st.bridge, make_reply(call, std::nullopt));
      } else {
        // The bridge routes nothing else here; should it ever, the caller
        // still gets an answer.
        KVS_ERROR(st.label, "request of an op the registry does not serve: answered as failed");
        self->send(st.bridge, make_failure_reply(call, "not served by the registry"));
      }
    },
    [self](tick_atom, int64_t id, bool ping) {
      auto i = self->state.instances.find(id);
      if (i != self->state.instances.end()) {
        i->second.last_seen = registry_state::clock::now();
        i->second.pinged = i->second.pinged || ping;
      }
    },
    [self, reap_every](tick_atom) {
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
          self->send(st.bridge, expire_atom_v, id);
      }
      self->delayed_send(self, reap_every, tick_atom_v);
    },
    [self](stats_atom) {
      auto& st = self->state;
      KVS_INFO(st.label, "stats: instances={} registered={} failed={} reaped={}",
               st.instances.size(), st.registered, st.failed, st.reaped);
      self->delayed_send(self, st.p.stats_interval, stats_atom_v);
    },
  };
}

} // namespace kvs
