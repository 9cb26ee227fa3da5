// open_files_limit: lets the process use as many file descriptors as the
// host allows.
//
// Every router subscribed to the PUB, every replay client, engine
// connection, probe, L2 file and shared-memory segment takes one. Linux
// starts processes at a soft limit of 1024 (and a container runtime often
// keeps it): a few hundred connections that never finish their handshake
// (libzmq drops them after 30 s) then stop the sidecar from accepting new
// routers. The soft limit is raised to the hard one at start, as nginx and
// the Go runtime do; what the hard limit is stays the operator's choice.
#pragma once

#include <sys/resource.h>

#include <optional>
#include <string>

namespace kvs {

struct open_files_limit {
  rlim_t before = 0; ///< the soft limit the process started with
  rlim_t now = 0;    ///< the soft limit after raising it
};

/// Raises the soft RLIMIT_NOFILE to the hard limit (at most 2^20, the
/// kernel's usual nr_open). On failure: why, and the limit is unchanged.
open_files_limit raise_open_files_limit(std::optional<std::string>& error);

} // namespace kvs
