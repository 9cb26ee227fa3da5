#include "app/supervisor.hpp"

#include "messages/type_ids.hpp"

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>
#include <caf/local_actor.hpp>

namespace kvs {

std::string actor_down::reason_text() const {
  return reason ? caf::to_string(reason) : std::string{"returned normally"};
}

void supervisor::watch(caf::scoped_actor& self, const caf::actor& a) {
  if (!a)
    return;
  // Every actor we spawn is local; its name() is the state's or bridge's name.
  auto* local = dynamic_cast<caf::local_actor*>(caf::actor_cast<caf::abstract_actor*>(a));
  std::string name = local != nullptr ? local->name() : "actor";
  names_[a.address()] = name + "#" + std::to_string(a->id());
  self->monitor(a);
}

std::optional<actor_down> supervisor::on_down(const caf::down_msg& dm) {
  auto i = names_.find(dm.source);
  if (i == names_.end())
    return std::nullopt;
  down_.emplace(dm.source, dm.reason);
  actor_down d{i->second, dm.reason};
  if (!first_)
    first_ = d;
  return d;
}

bool supervisor::is_down(const caf::actor_addr& a) const {
  return down_.count(a) > 0;
}

stop_cause wait_for_stop(caf::scoped_actor& self, supervisor& sup,
                         const std::function<void()>& tick) {
  stop_cause out;
  bool done = false;
  while (!done) {
    self->receive(
      [&](signal_atom, int sig) {
        out.signal = sig;
        done = true;
      },
      [&](caf::down_msg& dm) {
        if (auto d = sup.on_down(dm)) {
          out.down = std::move(d);
          done = true;
        }
      },
      // Late start-up or stop acknowledgements: nothing to do.
      [&](ready_atom, const std::string&) {},
      [&](stop_atom, const std::string&) {},
      [&](failed_atom, const std::string&, const std::string&) {},
      caf::after(std::chrono::seconds(1)) >> [&] {
        if (tick)
          tick();
      });
  }
  return out;
}

} // namespace kvs
