#include "app/open_files_limit.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kvs {

namespace {
/// Far more than a sidecar's routers, engines and probes need, and a bound
/// on what a connection flood can hold: libzmq keeps ~3.6 KiB per TCP
/// connection that never finishes its handshake (measured: 4,000 of them
/// on the PUB and replay ports, 14 MiB), so 65,536 hold at most ~240 MiB.
constexpr rlim_t max_open_files = 65536;
} // namespace

expected<open_files_limit> raise_open_files_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0)
    return make_error("rlimit", std::string{"getrlimit(RLIMIT_NOFILE): "} + std::strerror(errno));
  open_files_limit r;
  r.before = r.now = lim.rlim_cur;
  auto want = std::min(lim.rlim_max, max_open_files);
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= want)
    return r;
  lim.rlim_cur = want;
  if (::setrlimit(RLIMIT_NOFILE, &lim) != 0)
    return make_error("rlimit", "setrlimit(RLIMIT_NOFILE) from " + std::to_string(r.before)
                                  + " to " + std::to_string(want) + ": " + std::strerror(errno));
  r.now = want;
  return r;
}

} // namespace kvs
