#include "gpu/fault_guard.hpp"

#include "core/sigbus_chain.hpp"

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
  sigbus_pass_on(g_previous, sig, info, uctx);
}

void install() { sigbus_install(on_sigbus, &g_previous); }

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
