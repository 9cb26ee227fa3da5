// Passing a SIGBUS on to the handler that was installed before ours.
//
// Two handlers catch SIGBUS for their own address ranges and chain the rest:
// gpu/fault_guard.cpp (copies to a client's shared memory) and
// cache/arena_heal.cpp (L1 arenas a client shrank). Whichever installs
// last calls the other through this; the first calls the default action.
#pragma once

#include <csignal>

namespace kvs {

/// Behaves as if our handler were not there: calls `prev` (the sigaction
/// saved when ours was installed) or takes the default action.
inline void sigbus_pass_on(const struct sigaction& prev, int sig, siginfo_t* info, void* uctx) {
  if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
    prev.sa_sigaction(sig, info, uctx);
    return;
  }
  if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
    return;
  }
  // Default action. A fault re-executes the faulting instruction on return
  // and dies of it now (with a core and the right address); a SIGBUS sent
  // with kill() has no instruction to re-run, so raise it again.
  signal(SIGBUS, SIG_DFL);
  if (info == nullptr || info->si_code <= 0)
    raise(SIGBUS);
}

/// Installs `handler` for SIGBUS (with siginfo), saving what was there.
inline void sigbus_install(void (*handler)(int, siginfo_t*, void*), struct sigaction* previous) {
  struct sigaction sa {};
  sa.sa_sigaction = handler;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, previous);
}

} // namespace kvs
