// Supervision of the long-lived actors (bridges, publishers, replays,
// registry, store, gpu_transfer): the sidecar monitors each one, and the
// first that exits while the process is not shutting down ends the process
// with exit status 3, so that the container restarts instead of a half-dead
// sidecar reporting ready. Per-request sessions are not watched: they end
// on their own.
//
// The sidecar's main thread waits in one blocking receive for whichever
// comes first: a stop signal (signal_atom, sent by the signal watcher
// thread) or a watched actor's down message (wait_for_stop).
#pragma once

#include <caf/actor.hpp>
#include <caf/actor_addr.hpp>
#include <caf/system_messages.hpp>
#include <caf/error.hpp>
#include <caf/scoped_actor.hpp>

#include <functional>
#include <map>
#include <optional>
#include <string>

namespace kvs {

struct actor_down {
  std::string name;  ///< "store#6": the actor's name and id, as its log lines show
  caf::error reason; ///< why it exited (none: it returned normally)
  std::string reason_text() const;
};

class supervisor {
public:
  /// Monitors `a` from `self`. An actor already dead is reported at once
  /// (its down message arrives immediately).
  void watch(caf::scoped_actor& self, const caf::actor& a);
  /// Records `dm`; the report when it is about a watched actor, else nullopt.
  std::optional<actor_down> on_down(const caf::down_msg& dm);
  bool is_down(const caf::actor_addr& a) const;
  /// The first watched actor seen down, if any.
  const std::optional<actor_down>& first_down() const { return first_; }
  size_t watched() const { return names_.size(); }

private:
  std::map<caf::actor_addr, std::string> names_;
  std::map<caf::actor_addr, caf::error> down_;
  std::optional<actor_down> first_;
};

/// Why the sidecar stops.
struct stop_cause {
  int signal = 0;                 ///< SIGINT / SIGTERM, or 0
  std::optional<actor_down> down; ///< a watched actor exited first
};

/// Blocks (no polling) until `self` receives `signal_atom, int` or the down
/// message of an actor `sup` watches. Other messages are dropped.
/// Also calls `tick` about once a second (the memory trimmer).
stop_cause wait_for_stop(caf::scoped_actor& self, supervisor& sup,
                         const std::function<void()>& tick = {});

} // namespace kvs
