// Lower CPU priority for background threads (Linux: nice is per thread).
//
// On a small machine the live relay (ingest -> publisher -> PUB) shares the
// CPUs with work that may wait: streaming replays and snapshots to routers.
// Threads doing only such work lower their own priority, so the kernel runs
// a live thread first whenever both are ready, instead of giving each its
// time slice in turn (which is what made snapshot streaming cost live
// batches milliseconds). An unprivileged process may always raise its nice
// value, never lower it again, so this is one-way.
#pragma once

#include <optional>
#include <string>

namespace kvs {

/// The replay context's ZMQ_THREAD_NAME_PREFIX (app/sidecar.cpp), and the
/// name libzmq 4.3 then gives its I/O thread.
constexpr int replay_io_thread_prefix = 2;
constexpr const char* replay_io_thread_name = "2/ZMQbg/IO/0";

/// Sets the calling thread's nice value to `nice` (0..19; 0: leaves it).
/// Returns why not, or nullopt.
std::optional<std::string> lower_this_thread_priority(int nice);

/// Sets the nice value of every thread of this process named `comm`
/// (/proc/self/task/*/comm), e.g. a ZeroMQ context's I/O thread, whose name
/// comes from ZMQ_THREAD_NAME_PREFIX. Returns how many it changed.
int lower_thread_priority_by_name(const std::string& comm, int nice);

} // namespace kvs
