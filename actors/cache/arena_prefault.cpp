#include "actors/cache/arena_prefault.hpp"

#include "actors/actor_logging.hpp"
#include "actors/thread_priority.hpp"
#include "core/thread_nice.hpp"

#include <chrono>

namespace kvs {

caf::behavior arena_prefault(caf::stateful_actor<arena_prefault_state>* self,
                             std::shared_ptr<slot_pool> pool) {
  auto& st = self->state;
  st.pool = std::move(pool);
  st.label = log::label(arena_prefault_state::name, "", self->id());
  if (auto why = lower_this_thread_priority(background_thread_nice))
    KVS_WARN(st.label, "could not lower its priority ({}): faulting arena extents in at normal "
                       "priority", *why);
  log_lifecycle(self, st.label,
                fmt::format("started: faults each L1 extent an engine-driven arena claims ahead "
                            "of need in (nice {})", background_thread_nice));
  return {
    [self](prefault_atom, uint64_t offset, uint64_t len) {
      auto& st = self->state;
      const auto t0 = std::chrono::steady_clock::now();
      if (auto done = st.pool->prefault_extent(offset, len); !done) {
        ++st.failed;
        KVS_INFO(st.label, "extent at {} MiB: stopped ({}); the engine's gather faults the rest",
                 offset >> 20, to_string(done.error_value()));
        return;
      }
      ++st.extents;
      KVS_DEBUG(st.label, "extent at {} MiB ({} MiB) faulted in in {:.1f} ms", offset >> 20,
                len >> 20,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count());
    },
  };
}

} // namespace kvs
