// open_files_limit: lets the process use as many file descriptors as the
// host allows.
//
// Every router subscribed to the PUB, every replay client, engine
// connection, probe, L2 file and shared-memory segment takes one. Linux
// starts processes at a soft limit of 1024 (and a container runtime often
// keeps it): a few hundred connections that never finish their handshake
// (libzmq drops them after 30 s) then stop the sidecar from accepting new
// routers. The soft limit is raised to the hard one at start (at most
// 65,536), as the Go runtime does; the hard limit stays the operator's.
#pragma once

#include "core/error.hpp"

#include <sys/resource.h>

namespace kvs {

struct open_files_limit {
  rlim_t before = 0; ///< the soft limit the process started with
  rlim_t now = 0;    ///< the soft limit after raising it
};

/// Raises the soft RLIMIT_NOFILE to the hard limit, at most 65,536 (see
/// open_files_limit.cpp). On failure the limit is unchanged and the error
/// (kind "rlimit") says why.
expected<open_files_limit> raise_open_files_limit();

} // namespace kvs
