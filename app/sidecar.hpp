// The sidecar process: builds the actor system from a config, spawns the
// actor tree, waits for a signal and shuts everything down in order.
#pragma once

#include "config/config.hpp"

namespace kvs {

/// Exit statuses of the process.
enum exit_status : int {
  exit_ok = 0,
  exit_startup_failed = 1, ///< e.g. a port already in use
  exit_bad_config = 2,
  exit_actor_failed = 3, ///< a long-lived actor exited unexpectedly (restart the container)
};

/// Runs until SIGTERM/SIGINT; returns the process exit status. The caller
/// must have blocked SIGINT and SIGTERM in every thread (block_signals()).
int run_sidecar(const config& cfg);

/// Blocks SIGINT/SIGTERM in the calling thread; threads started later
/// inherit the mask, so only run_sidecar's signal watcher sees them.
void block_signals();

} // namespace kvs
