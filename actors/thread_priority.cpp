#include "actors/thread_priority.hpp"

#include <zmq.hpp>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace kvs {

int lower_thread_priority_by_name(const std::string& comm, int nice) {
  if (nice <= 0)
    return 0;
  int changed = 0;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream in(task.path() / "comm");
    std::string name;
    if (!std::getline(in, name) || name != comm)
      continue;
    const long tid = std::strtol(task.path().filename().c_str(), nullptr, 10);
    if (tid > 0 && !set_thread_nice(tid, nice))
      ++changed;
  }
  return changed;
}

std::optional<std::string> start_context_threads_at_nice(zmq::context_t& ctx, int nice) {
  const long tid = ::syscall(SYS_gettid);
  errno = 0;
  const int mine = ::getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
  if (errno != 0)
    return std::string{"getpriority: "} + std::strerror(errno);
  auto err = nice != 0 && nice != mine ? set_thread_nice(tid, nice) : std::nullopt;
  try {
    zmq::socket_t first{ctx, zmq::socket_type::pair};
  } catch (const zmq::error_t& e) {
    err = std::string{"starting the ZeroMQ context: "} + e.what();
  }
  // Back up to where it was: raising a nice value is always allowed.
  if (::getpriority(PRIO_PROCESS, static_cast<id_t>(tid)) != mine)
    set_thread_nice(tid, mine);
  return err;
}

} // namespace kvs
