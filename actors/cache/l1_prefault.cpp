#include "actors/cache/l1_prefault.hpp"

#include "actors/actor_logging.hpp"
#include "actors/thread_priority.hpp"

#include <algorithm>

namespace kvs {
namespace {

using self_ptr = caf::stateful_actor<l1_prefault_state>*;

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

/// Where the resident prefix should end now.
size_t target(const l1_prefault_state& st) {
  const size_t end = st.p.pool->mapped_bytes();
  if (st.p.ahead == 0)
    return end;
  const size_t hw = st.p.pool->high_water();
  return std::min(end, hw + std::min(st.p.ahead, end - std::min(hw, end)));
}

/// One step towards target(); sends itself the next one, or goes idle (until
/// a nudge) or ends (the whole mapping is resident).
void step(self_ptr self) {
  auto& st = self->state;
  const size_t end = st.p.pool->mapped_bytes();
  const size_t goal = target(st);
  if (st.next < goal) {
    const size_t len = std::min(l1_prefault_step, goal - st.next);
    auto done = st.p.pool->prefault(st.next, len);
    if (!done) {
      KVS_WARN(st.label, "stopped after {} MiB: {} (pages are faulted in on first use)",
               st.next >> 20, to_string(done.error_value()));
      self->quit();
      return;
    }
    st.next += len;
    st.busy = true;
    self->send(self, prefault_atom_v);
    return;
  }
  st.busy = false;
  if (st.next >= end) {
    KVS_INFO(st.label, "L1 faulted in: {} MiB in {:.2f} s", end >> 20, seconds_since(st.started));
    self->quit();
    return;
  }
  if (!st.window_logged) { // the start-up cost of "ahead": the first window
    st.window_logged = true;
    KVS_INFO(st.label, "L1 resident ahead of use: {} MiB in {:.2f} s", st.next >> 20,
             seconds_since(st.started));
  }
}

} // namespace

caf::behavior l1_prefault(self_ptr self, l1_prefault_params p) {
  auto& st = self->state;
  st.p = std::move(p);
  st.label = log::label(l1_prefault_state::name, "", self->id());
  st.started = std::chrono::steady_clock::now();
  if (auto why = lower_this_thread_priority(l1_prefault_nice))
    KVS_WARN(st.label, "could not lower its priority ({}): faulting L1 in at normal priority",
             *why);
  const size_t mib = st.p.pool->mapped_bytes() >> 20;
  log_lifecycle(self, st.label,
                st.p.ahead == 0
                  ? fmt::format("started: faulting in {} MiB of L1 (cache.l1_prefault = "
                                "\"background\", nice {})", mib, l1_prefault_nice)
                  : fmt::format("started: keeping {} MiB of L1 ({} MiB) resident ahead of use "
                                "(cache.l1_prefault = \"ahead\", nice {})",
                                st.p.ahead >> 20, mib, l1_prefault_nice));
  st.busy = true;
  self->send(self, prefault_atom_v);
  return {
    [self](prefault_atom) { step(self); },
    // The store's nudge: its high water moved.
    [self](prefault_atom, uint64_t) {
      if (!self->state.busy)
        step(self);
    },
  };
}

void nudge_l1_prefault(const caf::actor& prefault, const slot_pool& pool, size_t& nudged_at) {
  if (!prefault)
    return;
  const size_t hw = pool.high_water();
  if (hw < nudged_at + l1_prefault_nudge)
    return;
  nudged_at = hw;
  caf::anon_send(prefault, prefault_atom_v, static_cast<uint64_t>(hw));
}

} // namespace kvs
