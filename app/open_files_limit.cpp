#include "app/open_files_limit.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kvs {

namespace {
/// Linux's default fs.nr_open: a soft limit above it is refused.
constexpr rlim_t max_open_files = rlim_t{1} << 20;
} // namespace

open_files_limit raise_open_files_limit(std::optional<std::string>& error) {
  open_files_limit r;
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) {
    error = std::string{"getrlimit(RLIMIT_NOFILE): "} + std::strerror(errno);
    return r;
  }
  r.before = r.now = lim.rlim_cur;
  auto want = std::min(lim.rlim_max, max_open_files);
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= want)
    return r;
  lim.rlim_cur = want;
  if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) {
    error = std::string{"setrlimit(RLIMIT_NOFILE, "} + std::to_string(want)
            + "): " + std::strerror(errno);
    return r;
  }
  r.now = want;
  return r;
}

} // namespace kvs
