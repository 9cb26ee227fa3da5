// Start/exit/stats conventions shared by every event-based actor: each logs
// its start, its exit with the reason, and a stats line every stats_interval.
#pragma once

#include "log/log.hpp"
#include "log/stats_repeat.hpp"
#include "messages/type_ids.hpp"

#include <caf/error.hpp>
#include <caf/send.hpp>
#include <caf/exit_reason.hpp>

#include <chrono>
#include <string>

namespace kvs {

/// Logs `started` now and the exit reason when the actor terminates.
template <class Self>
void log_lifecycle(Self* self, const std::string& label, const std::string& started) {
  KVS_INFO(label, "{}", started);
  self->attach_functor([label](const caf::error& reason) {
    if (!reason || reason == caf::exit_reason::user_shutdown)
      KVS_INFO(label, "exited: {}", reason ? "shutdown" : "normal");
    else
      KVS_WARN(label, "exited: {}", caf::to_string(reason));
  });
}

/// Schedules the first stats tick; the actor's stats handler re-arms it.
template <class Self>
void arm_stats(Self* self, std::chrono::nanoseconds interval) {
  if (interval.count() > 0)
    self->delayed_send(self, interval, stats_atom_v);
}

/// Answers the /metrics collector. Anonymous: a typed actor may not send()
/// to the collector's untyped handle; actor_id says who answered.
template <class Self>
void send_snapshot(Self* self, const caf::actor& to, stats_snapshot s) {
  s.actor_id = self->id();
  caf::anon_send(to, std::move(s));
}

/// The periodic stats line from the actor's snapshot (the same snapshot
/// /metrics reads), when a figure changed or sidecar.stats_repeat passed
/// (log/stats_repeat.hpp), and the next tick.
template <class Self>
void log_stats(Self* self, const stats_snapshot& s, std::chrono::nanoseconds interval) {
  if (auto line = s.line(); log::stats_line_due(s.actor, line))
    KVS_INFO(s.actor, "stats: {}", line);
  self->delayed_send(self, interval, stats_atom_v);
}

} // namespace kvs
