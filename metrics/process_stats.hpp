// The process's own figures for /metrics: resident memory and start time.
#pragma once

#include <cstdint>

namespace kvs {

/// Resident set size in bytes (/proc/self/statm), 0 when unreadable.
uint64_t resident_bytes();
/// Seconds since the process started (monotonic clock).
double uptime_seconds();
/// When the process started, seconds since the Unix epoch.
double start_time_seconds();

} // namespace kvs
