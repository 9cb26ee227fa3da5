#include "actors/cache/gpu_transfer.hpp"

#include "actors/actor_logging.hpp"
#include "actors/caf_error.hpp"
#include "gpu/block_checksum.hpp"
#include "gpu/kv_layout.hpp"

namespace kvs {

namespace {

using self_ptr = gpu_transfer_actor::stateful_pointer<gpu_transfer_state>;

/// A STORE's chunk at `position` of a layout with more than one engine
/// group whose block ids in some group are all the null block 0 (vLLM's
/// null block: a sliding-window group's blocks out of the window, a
/// recurrent group's earlier blocks). One engine group: never (0 is then
/// an ordinary block id).
bool all_null_in_a_group(const kv_layout& layout, const std::vector<std::vector<int64_t>>& ids,
                         uint64_t position, uint64_t chunk_tokens) {
  if (layout.num_groups < 2 || layout.block_size == 0 || ids.size() != layout.num_groups)
    return false;
  const uint64_t bpc = chunk_tokens / layout.block_size;
  const uint64_t first = position * bpc;
  if (bpc == 0)
    return false;
  for (const auto& g : ids) {
    if (g.size() < first + bpc)
      continue; // malformed: the copy plan refuses it with the reason
    bool all_null = true;
    for (uint64_t b = first; b < first + bpc && all_null; ++b)
      all_null = g[b] == 0;
    if (all_null)
      return true;
  }
  return false;
}

/// In-flight copies are polled this often until none is left.
constexpr std::chrono::microseconds copy_poll_interval{100};

/// A copy in flight is over (`s` done or failed): counts it, and returns
/// the backend's reason when it failed (none when it is done).
caf::error settle(gpu_transfer_state& st, gpu_transfer_state::pending& p,
                  copy_completion::state s) {
  if (s == copy_completion::state::done) {
    st.finished(p.direction, p.bytes, p.start);
    return {};
  }
  ++st.failed;
  return to_caf_error("copy_failed", p.completion->error());
}

/// Polls in-flight (asynchronous, CUDA) copies until none is left.
void arm_poll(self_ptr self) {
  auto& st = self->state;
  if (st.polling || st.inflight.empty())
    return;
  st.polling = true;
  self->delayed_send(self, copy_poll_interval, poll_atom_v);
}

/// Shutdown: answers the drain request once nothing is pending.
void maybe_drained(self_ptr self) {
  auto& st = self->state;
  if (st.drained && pending_copies(st) == 0) {
    st.drained->deliver(st.drain_waited);
    st.drained.reset();
  }
}

} // namespace

size_t pending_copies(const gpu_transfer_state& st) {
  size_t n = 0;
  for (auto& [ticket, pend] : st.inflight)
    n += pend.completion->poll() == copy_completion::state::pending;
  return n;
}

gpu_transfer_state::~gpu_transfer_state() {
  for (auto& [ticket, pend] : inflight)
    pend.completion->wait();
  inflight.clear();
  for (auto& [id, inst] : instances)
    if (inst.pools)
      p.backend->close(*inst.pools);
  instances.clear();
}

stats_snapshot snapshot(const gpu_transfer_state& st) {
  stats_snapshot s;
  s.actor = st.label;
  s.labels = {{"backend", st.p.backend->name()}};
  size_t staging_free = 0;
  for (auto& [id, in] : st.staged)
    staging_free += in.pool ? in.pool->free_slots() : 0;
  s.gauge("instances", "", st.instances.size())
    .gauge("staged_instances", "kvsidecar_cache_engine_driven_instances", st.staged.size())
    .gauge("staging_free", "kvsidecar_cache_staging_free_slots", staging_free)
    .counter("staged_copies", "kvsidecar_cache_staging_copies_total", st.staged_copies)
    .counter("copies", "kvsidecar_cache_copies_total", st.copies)
    .counter("failed", "kvsidecar_cache_copy_failures_total", st.failed)
    .log_only("bytes", st.bytes)
    .gauge("inflight", "kvsidecar_cache_copies_inflight", st.inflight.size());
  const char* names[2] = {"store", "retrieve"};
  for (size_t d = 0; d < 2; ++d) {
    auto& x = st.directions[d];
    s.counter("", std::string{"kvsidecar_cache_"} + names[d] + "_bytes_total", x.bytes)
      .counter("", "kvsidecar_cache_copy_seconds_total", x.seconds, "op", names[d])
      .histogram("kvsidecar_cache_copy_throughput_gbps", x.gbps, "op", names[d]);
  }
  return s;
}

namespace {

// -- the handlers, one per message of gpu_transfer_actor (interfaces.hpp) ---------
// Each runs on this actor's thread; the behavior below only names them.

caf::result<gpu_status_reply> on_open(self_ptr self, gpu_open& op) {
  auto& st = self->state;
  auto opened = st.p.backend->open(*op.tensors, *op.layout);
  if (!opened)
    return to_caf_error("open_failed", to_string(opened.error_value()));
  st.instances[op.instance_id] = {std::move(opened.value()), op.engine};
  KVS_INFO(st.label, "opened {} tensors of instance {}", op.tensors->size(), op.instance_id);
  return gpu_status_reply{};
}

/// One chunk of a block-id checksum: read here, where the pools are (and,
/// for CUDA, on their stream after the copies before it); hashed by the
/// HTTP side. Engine-driven instances have no registered KV to read:
/// LMCache answers 404 for them too.
block_checksum_chunk on_checksum_read(self_ptr self, gpu_checksum_read& r) {
  auto& st = self->state;
  auto i = st.instances.find(r.instance_id);
  if (i == st.instances.end() || !i->second.pools) {
    block_checksum_chunk none;
    none.status = 404;
    none.error = "instance_id " + std::to_string(r.instance_id) + " not registered";
    return none;
  }
  return read_checksum_chunk(*st.p.backend, *i->second.pools, r.query, std::move(r.buffer));
}

void on_close(self_ptr self, gpu_close& c) {
  auto& st = self->state;
  if (st.staged.erase(c.instance_id) > 0)
    KVS_INFO(st.label, "removed the staging pool of instance {}", c.instance_id);
  auto i = st.instances.find(c.instance_id);
  if (i == st.instances.end())
    return;
  // close() waits for copies still using these pools.
  st.p.backend->close(*i->second.pools);
  st.instances.erase(i);
  KVS_INFO(st.label, "closed the memory of instance {}", c.instance_id);
}

caf::result<gpu_copy_started> on_copy(self_ptr self, gpu_copy& cp) {
  auto& st = self->state;
  if (st.draining || (st.p.refuse_copies && st.p.refuse_copies->load())) {
    ++st.failed;
    ++st.refused_at_shutdown;
    return to_caf_error("shutting_down", "the sidecar is shutting down: no new copies");
  }
  auto i = st.instances.find(cp.instance_id);
  if (i == st.instances.end()) {
    ++st.failed;
    return to_caf_error("not_registered",
                        "instance " + std::to_string(cp.instance_id) + " is not registered");
  }
  auto& pools = *i->second.pools;
  copy_request req;
  req.direction = cp.to_l1 ? copy_direction::to_l1 : copy_direction::from_l1;
  req.pools = &pools;
  req.block_ids = std::move(cp.block_ids);
  std::vector<uint32_t> null_chunks;
  for (size_t k = 0; k < cp.slots.size(); ++k) {
    if (cp.to_l1 && all_null_in_a_group(pools.layout(), req.block_ids,
                                        cp.chunk_positions[k], cp.chunk_tokens)) {
      null_chunks.push_back(static_cast<uint32_t>(k));
      continue;
    }
    req.chunks.push_back(l1_chunk{cp.chunk_positions[k], cp.slots[k]});
  }
  if (!null_chunks.empty())
    KVS_DEBUG(st.label, "instance {}: {} of {} chunks to store are all-null in an engine "
                        "group: not stored", cp.instance_id, null_chunks.size(), cp.slots.size());
  if (req.chunks.empty() && !cp.slots.empty()) {
    gpu_copy_started none{"", 0, true};
    none.null_chunks = std::move(null_chunks);
    return none;
  }
  req.chunk_tokens = cp.chunk_tokens;
  req.slot_bytes = cp.slot_bytes;
  // SGLang's connector counts skipped pages; LMCache 0.5.6's vLLM
  // adapter counts tokens (block-aligned).
  auto bs = pools.layout().block_size;
  req.skip_prefix_n_blocks = i->second.engine == engine_type::sglang || bs == 0
                               ? cp.skip_first_n
                               : cp.skip_first_n / bs;
  req.engine_event_handle = std::move(cp.engine_event_handle);
  auto start = gpu_transfer_state::clock::now();
  size_t direction = cp.to_l1 ? 0 : 1;
  auto res = st.p.backend->copy(req);
  if (!res) {
    ++st.failed;
    return to_caf_error("copy_failed", to_string(res.error_value()));
  }
  ++st.copies;
  uint64_t nbytes = req.chunks.size() * pools.layout().chunk_bytes(cp.chunk_tokens);
  st.bytes += nbytes;
  auto& completion = *res.value();
  auto state = completion.poll();
  if (state == copy_completion::state::failed) {
    ++st.failed;
    return to_caf_error("copy_failed", completion.error());
  }
  if (state == copy_completion::state::done) {
    st.finished(direction, nbytes, start);
    gpu_copy_started out{completion.event_handle(), 0, true};
    out.null_chunks = std::move(null_chunks);
    return out;
  }
  auto ticket = st.next_ticket++;
  gpu_copy_started out{completion.event_handle(), ticket, false};
  out.null_chunks = std::move(null_chunks);
  st.inflight[ticket] = {std::move(res.value()), std::nullopt, start, direction, nbytes};
  return out;
}

caf::result<gpu_stage_opened> on_stage_open(self_ptr self, gpu_stage_open& op) {
  auto& st = self->state;
  st.staged.erase(op.instance_id); // a re-registration gets a fresh object
  if (op.inline_data) {
    KVS_INFO(st.label, "instance {}: inline transfers (no staging pool), chunks of {} KiB{}",
             op.instance_id, op.slot_bytes >> 10,
             op.groups ? fmt::format(" in group 0 of {}", op.groups->size()) : "");
    st.staged[op.instance_id] = {nullptr, std::move(op.chunk_shape), std::move(op.dtype),
                                 op.format, op.slot_bytes, std::move(op.groups)};
    return gpu_stage_opened{"", 0};
  }
  uint64_t in_use = 0;
  for (auto& [id, in] : st.staged)
    in_use += in.pool ? in.pool->size() : 0;
  uint64_t want = 0;
  if (__builtin_mul_overflow(op.slot_bytes, uint64_t{op.slots}, &want)
      || in_use + want > st.p.staging_limit_bytes)
    return to_caf_error("open_failed",
                        "a staging pool of " + std::to_string(op.slots) + " chunks of "
                          + std::to_string(op.slot_bytes) + " bytes would bring the "
                          "engine-driven pools to " + std::to_string(in_use + want)
                          + " bytes, more than cache.l1_size ("
                          + std::to_string(st.p.staging_limit_bytes)
                          + "); lower cache.engine_driven_slots or raise cache.l1_size");
  const bool in_place = !op.arena_name.empty();
  auto pool = in_place ? staging_pool::open_in(op.arena_name, op.arena_origin, op.slot_bytes,
                                               op.slots)
                       : staging_pool::create(staging_pool_name(op.instance_id), op.slot_bytes,
                                              op.slots, op.owner_uid);
  if (!pool)
    return to_caf_error("open_failed", to_string(pool.error_value()));
  gpu_stage_opened out{pool.value()->name(), in_place ? op.arena_size : pool.value()->size()};
  if (in_place)
    KVS_INFO(st.label, "instance {} writes L1 in place: arena {} of {} bytes, {} staging slots "
                       "of {} KiB at {} (for chunks stored by other instances)",
             op.instance_id, out.shm_name, out.pool_size, op.slots, op.slot_bytes >> 10,
             op.arena_origin);
  else
    KVS_INFO(st.label, "staging pool {} for instance {}: {} slots of {} KiB", out.shm_name,
             op.instance_id, op.slots, op.slot_bytes >> 10);
  st.staged[op.instance_id] = {std::move(pool.value()), std::move(op.chunk_shape),
                               std::move(op.dtype), op.format, op.slot_bytes, std::move(op.groups),
                               in_place};
  return out;
}

caf::result<gpu_stage_taken> on_stage_take(self_ptr self, gpu_stage_take& t) {
  auto& st = self->state;
  auto i = st.staged.find(t.instance_id);
  if (i == st.staged.end())
    return to_caf_error("not_registered", "instance " + std::to_string(t.instance_id) +
                                            " has no engine-driven registration");
  auto& in = i->second;
  gpu_stage_taken out;
  out.inline_data = !in.pool;
  // A hybrid instance's slots, and an in-place one's (it needs them only
  // for chunks outside its arena), are taken once the session counted them.
  if (in.pool && ((!in.groups && !in.in_place) || t.group_slots))
    out.offsets = in.pool->take(t.count);
  out.slot_bytes = in.slot_bytes;
  out.chunk_shape = in.chunk_shape;
  out.dtype = in.dtype;
  out.format = in.format;
  out.groups = in.groups;
  out.in_place = in.in_place;
  return out;
}

caf::result<gpu_copy_done> on_stage_copy(self_ptr self, gpu_stage_copy& cp) {
  auto& st = self->state;
  if (st.draining || (st.p.refuse_copies && st.p.refuse_copies->load())) {
    ++st.failed;
    ++st.refused_at_shutdown;
    return to_caf_error("shutting_down", "the sidecar is shutting down: no new copies");
  }
  auto i = st.staged.find(cp.instance_id);
  if (i == st.staged.end())
    return to_caf_error("not_registered", "instance " + std::to_string(cp.instance_id) +
                                            " has no engine-driven registration");
  if (!i->second.pool)
    return to_caf_error("inline_instance", "instance " + std::to_string(cp.instance_id) +
                                             " transfers inline: it has no staging pool");
  auto& pool = *i->second.pool;
  auto start = gpu_transfer_state::clock::now();
  auto done = pool.copy(cp.offsets, cp.l1, cp.to_l1, cp.lengths);
  if (cp.release)
    (void)pool.give(cp.offsets); // checked by copy(); a failed copy frees them too
  if (!done) {
    ++st.failed;
    return to_caf_error("copy_failed", to_string(done.error_value()));
  }
  uint64_t nbytes = cp.offsets.size() * pool.slot_bytes();
  if (!cp.lengths.empty()) {
    nbytes = 0;
    for (auto n : cp.lengths)
      nbytes += n;
  }
  ++st.copies;
  ++st.staged_copies;
  st.bytes += nbytes;
  st.staged_bytes += nbytes;
  st.finished(cp.to_l1 ? 0 : 1, nbytes, start);
  return gpu_copy_done{};
}

void on_stage_give(self_ptr self, gpu_stage_give& g) {
  auto& st = self->state;
  auto i = st.staged.find(g.instance_id);
  if (i == st.staged.end() || !i->second.pool)
    return; // unregistered meanwhile: the pool and its slots are gone
  if (auto ok = i->second.pool->give(g.offsets); !ok)
    KVS_WARN(st.label, "instance {}: {}", g.instance_id, ok.error_value().detail);
}

caf::result<gpu_copy_done> on_await(self_ptr self, gpu_await& a) {
  auto& st = self->state;
  auto i = st.inflight.find(a.ticket);
  if (i == st.inflight.end())
    return to_caf_error("unknown_ticket", "unknown copy ticket");
  auto s = i->second.completion->poll();
  if (s != copy_completion::state::pending) {
    auto err = settle(st, i->second, s);
    st.inflight.erase(i);
    if (err)
      return err;
    return gpu_copy_done{};
  }
  auto rp = self->make_response_promise<gpu_copy_done>();
  i->second.promise = rp;
  arm_poll(self);
  return rp;
}

void on_poll(self_ptr self) {
  auto& st = self->state;
  st.polling = false;
  for (auto i = st.inflight.begin(); i != st.inflight.end();) {
    auto& pend = i->second;
    auto s = pend.completion->poll();
    if (s == copy_completion::state::pending || !pend.promise) {
      ++i;
      continue;
    }
    if (auto err = settle(st, pend, s))
      pend.promise->deliver(std::move(err));
    else
      pend.promise->deliver(gpu_copy_done{});
    i = st.inflight.erase(i);
  }
  arm_poll(self);
  maybe_drained(self);
}

caf::result<uint64_t> on_drain(self_ptr self) {
  // Copies run on this actor's thread (host) or are tracked in inflight
  // (CUDA): while this message is handled no copy runs on the CPU, and
  // none starts after it (copies still queued are refused).
  auto& st = self->state;
  st.draining = true;
  if (st.refused_at_shutdown > 0)
    KVS_INFO(st.label, "shutdown: refused {} copies that had not started",
             st.refused_at_shutdown);
  st.drain_waited = pending_copies(st);
  if (st.drain_waited == 0)
    return uint64_t{0};
  KVS_INFO(st.label, "shutdown: waiting for {} copies in flight", st.drain_waited);
  auto rp = self->make_response_promise<uint64_t>();
  st.drained = rp;
  arm_poll(self);
  return rp;
}

} // namespace

gpu_transfer_actor::behavior_type
gpu_transfer(gpu_transfer_actor::stateful_pointer<gpu_transfer_state> self,
             gpu_transfer_params params) {
  auto& st = self->state;
  st.p = std::move(params);
  st.label = log::label(gpu_transfer_state::name, st.p.backend->name(), self->id());
  log_lifecycle(self, st.label, fmt::format("started with the {} backend", st.p.backend->name()));
  // Staging objects a killed sidecar could not unlink would hold /dev/shm
  // until reboot.
  if (auto n = remove_stale_staging_pools(); n > 0)
    KVS_INFO(st.label, "removed {} engine-driven staging objects of sidecars that are gone", n);
  arm_stats(self, st.p.stats_interval);
  return {
    [self](gpu_open& op) -> caf::result<gpu_status_reply> { return on_open(self, op); },
    [self](gpu_close& c) { on_close(self, c); },
    [self](gpu_copy& cp) -> caf::result<gpu_copy_started> { return on_copy(self, cp); },
    [self](gpu_stage_open& op) -> caf::result<gpu_stage_opened> { return on_stage_open(self, op); },
    [self](gpu_stage_take& t) -> caf::result<gpu_stage_taken> { return on_stage_take(self, t); },
    [self](gpu_stage_copy& cp) -> caf::result<gpu_copy_done> { return on_stage_copy(self, cp); },
    [self](gpu_stage_give& g) { on_stage_give(self, g); },
    [self](gpu_checksum_read& r) { return on_checksum_read(self, r); },
    [self](gpu_await& a) -> caf::result<gpu_copy_done> { return on_await(self, a); },
    [self](poll_atom) { on_poll(self); },
    [self](drain_atom) -> caf::result<uint64_t> { return on_drain(self); },
    [self](stats_atom) {
      log_stats(self, snapshot(self->state), self->state.p.stats_interval);
    },
    [self](metrics_atom, const caf::actor& to) { send_snapshot(self, to, snapshot(self->state)); },
  };
}

} // namespace kvs
