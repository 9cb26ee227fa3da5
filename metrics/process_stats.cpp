#include "metrics/process_stats.hpp"

#include <unistd.h>

#include <chrono>
#include <fstream>

namespace kvs {

namespace {

// Taken when the binary is loaded, before main(): close enough to the
// process start for an uptime in seconds.
const auto steady_start = std::chrono::steady_clock::now();
const auto wall_start = std::chrono::system_clock::now();

} // namespace

uint64_t resident_bytes() {
  std::ifstream in{"/proc/self/statm"};
  uint64_t size = 0, resident = 0;
  if (!(in >> size >> resident))
    return 0;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

double uptime_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - steady_start).count();
}

double start_time_seconds() {
  return std::chrono::duration<double>(wall_start.time_since_epoch()).count();
}

} // namespace kvs
