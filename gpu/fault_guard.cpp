#include "gpu/fault_guard.hpp"

#include <atomic>
#include <csetjmp>
#include <csignal>
#include <mutex>

namespace kvs {

namespace {

struct guard_frame {
  sigjmp_buf env;
  const guarded_range* ranges = nullptr;
  size_t n = 0;
  volatile size_t hit = 0;
  volatile size_t offset = 0;
};

// Read in the signal handler: initial-exec TLS is a fixed offset from the
// thread pointer, so reading it never allocates (the libraries are built
// with -fPIC, whose default model could call __tls_get_addr).
__attribute__((tls_model("initial-exec"))) thread_local guard_frame* t_frame = nullptr;

struct sigaction g_previous {};
std::once_flag g_installed;

/// A SIGBUS that is not ours: behave as if our handler were not there.
void pass_on(int sig, siginfo_t* info, void* uctx) {
  const struct sigaction& prev = g_previous;
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

void on_sigbus(int sig, siginfo_t* info, void* uctx) {
  guard_frame* f = t_frame;
  // si_code > 0: raised by the kernel for a fault on this thread.
  if (f != nullptr && info != nullptr && info->si_code > 0) {
    const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
    for (size_t i = 0; i < f->n; ++i) {
      const auto base = reinterpret_cast<uintptr_t>(f->ranges[i].base);
      if (addr >= base && addr - base < f->ranges[i].size) {
        f->hit = i;
        f->offset = addr - base;
        siglongjmp(f->env, 1); // restores the mask saved by sigsetjmp: SIGBUS unblocked
      }
    }
  }
  pass_on(sig, info, uctx);
}

void install() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &g_previous);
}

} // namespace

guard_result run_guarded(const guarded_range* ranges, size_t n, void (*fn)(void*), void* arg) {
  std::call_once(g_installed, install);
  guard_frame frame;
  frame.ranges = ranges;
  frame.n = n;
  guard_frame* const outer = t_frame;
  if (sigsetjmp(frame.env, 1) != 0) {
    t_frame = outer;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    return guard_result{true, frame.hit, frame.offset};
  }
  t_frame = &frame;
  std::atomic_signal_fence(std::memory_order_seq_cst); // the handler sees the frame
  fn(arg);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_frame = outer;
  return guard_result{};
}

} // namespace kvs
