#include "actors/cache/l1_prefault.hpp"

#include "actors/actor_logging.hpp"
#include "actors/thread_priority.hpp"

namespace kvs {

caf::behavior l1_prefault(caf::stateful_actor<l1_prefault_state>* self,
                          std::shared_ptr<slot_pool> pool, store_actor store) {
  auto& st = self->state;
  st.pool = std::move(pool);
  st.label = log::label(l1_prefault_state::name, "", self->id());
  st.started = std::chrono::steady_clock::now();
  self->link_to(store);
  if (auto why = lower_this_thread_priority(l1_prefault_nice))
    KVS_WARN(st.label, "could not lower its priority ({}): faulting L1 in at normal priority",
             *why);
  log_lifecycle(self, st.label,
                fmt::format("started: faulting in {} MiB of L1 (cache.l1_prefault = "
                            "\"background\", nice {})",
                            st.pool->mapped_bytes() >> 20, l1_prefault_nice));
  self->send(self, prefault_atom_v);
  return {
    [self](prefault_atom) {
      auto& st = self->state;
      auto done = st.pool->prefault(st.next, l1_prefault_step);
      if (!done) {
        KVS_WARN(st.label, "stopped after {} MiB: {} (pages are faulted in on first use)",
                 st.next >> 20, to_string(done.error_value()));
        self->quit();
        return;
      }
      st.next += l1_prefault_step;
      if (st.next < st.pool->mapped_bytes()) {
        self->send(self, prefault_atom_v);
        return;
      }
      auto took = std::chrono::duration<double>(std::chrono::steady_clock::now() - st.started);
      KVS_INFO(st.label, "L1 faulted in: {} MiB in {:.2f} s", st.pool->mapped_bytes() >> 20,
               took.count());
      self->quit();
    },
  };
}

} // namespace kvs
