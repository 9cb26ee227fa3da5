// CPU priority per thread (Linux: nice is per thread): lower for background
// threads, higher for the ZeroMQ I/O thread of the live path.
//
// On a small machine the live relay (ingest -> publisher -> PUB) shares the
// CPUs with work that may wait: streaming replays and snapshots to routers.
// Threads doing only such work lower their own priority, so the kernel runs
// a live thread first whenever both are ready, instead of giving each its
// time slice in turn (which is what made snapshot streaming cost live
// batches milliseconds). An unprivileged process may always raise its nice
// value, never lower it again, so this is one-way.
//
// The other way, the live context's I/O thread (engine events in, routers'
// events out, cache requests) is the relay's busiest thread: at a higher
// priority than the actors it is not preempted half-way through what it
// has read, moves more batches per system call and the whole relay spends
// less CPU per batch (BENCHMARKS.md, "The I/O thread's priority").
#pragma once

#include "core/thread_nice.hpp" // lower_this_thread_priority, set_thread_nice

#include <optional>
#include <string>

namespace zmq {
class context_t;
}

namespace kvs {

/// The replay context's ZMQ_THREAD_NAME_PREFIX (app/sidecar.cpp), and the
/// name libzmq 4.3 then gives its I/O thread.
constexpr int replay_io_thread_prefix = 2;
constexpr const char* replay_io_thread_name = "2/ZMQbg/IO/0";

/// Sets the nice value of every thread of this process named `comm`
/// (/proc/self/task/*/comm), e.g. a ZeroMQ context's I/O thread, whose name
/// comes from ZMQ_THREAD_NAME_PREFIX. Returns how many it changed.
int lower_thread_priority_by_name(const std::string& comm, int nice);

/// Starts `ctx`'s threads (libzmq starts them with a context's first
/// socket, so call this before any) at nice value `nice` (-20..0; 0: the
/// calling thread's): the calling thread takes that value while it creates a
/// socket, which the new threads inherit, then goes back to its own. A
/// value below the thread's needs CAP_SYS_NICE (or RLIMIT_NICE): then the
/// threads start at the usual priority and this returns why.
std::optional<std::string> start_context_threads_at_nice(zmq::context_t& ctx, int nice);

} // namespace kvs
