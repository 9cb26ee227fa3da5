// Quiet when idle: an actor's periodic stats line is written when one of its
// figures changed since its last line, and an unchanged one only every
// sidecar.stats_repeat (a heartbeat that says the actor is alive). An idle
// sidecar then writes a few lines an interval instead of one per actor every
// sidecar.stats_interval, all zeros.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

namespace kvs::log {

/// Sets how often an unchanged line is written again (0: every time, as
/// before this filter). Process-wide; set once at start.
void set_stats_repeat(std::chrono::nanoseconds repeat);

/// Whether `actor`'s stats `line` (keyed by the actor's label and `kind`,
/// for an actor with several lines) should be written now; remembers it
/// when so. Thread-safe: bridges call it from their own threads.
bool stats_line_due(std::string_view actor, std::string_view line,
                    std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());

} // namespace kvs::log
