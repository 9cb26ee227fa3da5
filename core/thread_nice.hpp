// The calling thread's nice value (Linux: nice is per thread), for
// background work that must yield to everything else: the prefault threads
// of L1 (actors/l1_prefault) and of the engine pools (gpu/host_backend), the
// replay and snapshot threads (actors/thread_priority.hpp).
#pragma once

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace kvs {

/// Background threads run at this nice value.
inline constexpr int background_thread_nice = 19;

/// Sets the nice value of thread `tid`. Returns why not, or nullopt.
inline std::optional<std::string> set_thread_nice(long tid, int nice) {
  if (::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), nice) != 0)
    return std::string{"setpriority("} + std::to_string(nice) + "): " + std::strerror(errno);
  return std::nullopt;
}

/// Sets the calling thread's nice value to `nice` (0..19; 0: leaves it).
/// An unprivileged thread may raise it, never lower it again. Returns why
/// not, or nullopt.
inline std::optional<std::string> lower_this_thread_priority(int nice) {
  if (nice <= 0)
    return std::nullopt;
  return set_thread_nice(::syscall(SYS_gettid), nice);
}

} // namespace kvs
