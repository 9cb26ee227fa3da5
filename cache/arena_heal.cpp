#include "cache/arena_heal.hpp"

#include "core/sigbus_chain.hpp"

#include <csignal>
#include <mutex>

#include <sys/stat.h>
#include <unistd.h>

namespace kvs {

namespace {

constexpr size_t k_tables = 16;
std::atomic<const arena_heal_table*> g_tables[k_tables];
std::atomic<uint64_t> g_healed{0};
struct sigaction g_previous {};
std::once_flag g_installed;


/// Grows the object behind `addr` back when it was shrunk; true when the
/// access can be re-run.
bool heal(uintptr_t addr) {
  for (auto& slot : g_tables) {
    const arena_heal_table* t = slot.load(std::memory_order_acquire);
    if (t == nullptr || addr < t->base || addr - t->base >= t->len || t->extent == 0)
      continue;
    const size_t i = (addr - t->base) / t->extent;
    if (i >= t->n)
      return false;
    const int fd = t->fds[i].load(std::memory_order_acquire);
    const uint64_t want = t->sizes[i].load(std::memory_order_acquire);
    struct stat st {};
    if (fd < 0 || fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) >= want)
      return false; // not shrunk: growing would not help
    if (ftruncate(fd, static_cast<off_t>(want)) != 0)
      return false;
    g_healed.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  return false;
}

void on_sigbus(int sig, siginfo_t* info, void* uctx) {
  if (info != nullptr && info->si_code > 0 && heal(reinterpret_cast<uintptr_t>(info->si_addr)))
    return;
  sigbus_pass_on(g_previous, sig, info, uctx);
}

void install() { sigbus_install(on_sigbus, &g_previous); }

} // namespace

bool arena_heal_add(const arena_heal_table* t) {
  std::call_once(g_installed, install);
  for (auto& slot : g_tables) {
    const arena_heal_table* empty = nullptr;
    if (slot.compare_exchange_strong(empty, t, std::memory_order_acq_rel))
      return true;
  }
  return false;
}

void arena_heal_remove(const arena_heal_table* t) {
  for (auto& slot : g_tables) {
    const arena_heal_table* mine = t;
    slot.compare_exchange_strong(mine, nullptr, std::memory_order_acq_rel);
  }
}

uint64_t arena_heal_count() { return g_healed.load(std::memory_order_relaxed); }

} // namespace kvs
