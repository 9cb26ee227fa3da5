// run_guarded (gpu/fault_guard.hpp): a SIGBUS inside a declared range ends
// the guarded function and is reported; the thread goes on working; a
// SIGBUS anywhere else still kills the process as it always did.
#include <doctest/doctest.h>

#include "gpu/fault_guard.hpp"

#include <cstring>
#include <fcntl.h>
#include <string>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using namespace kvs;

namespace {

/// Two pages of a POSIX shm object, mapped, then shrunk to one: the second
/// page raises SIGBUS when touched.
struct shrunk_mapping {
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::string name = "/kvs_guard_" + std::to_string(getpid());
  uint8_t* base = nullptr;

  shrunk_mapping() {
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, static_cast<off_t>(2 * page)) == 0);
    void* p = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    REQUIRE(p != MAP_FAILED);
    base = static_cast<uint8_t*>(p);
    std::memset(base, 7, 2 * page);
    REQUIRE(ftruncate(fd, static_cast<off_t>(page)) == 0);
    close(fd);
  }
  ~shrunk_mapping() {
    munmap(base, 2 * page);
    shm_unlink(name.c_str());
  }
};

struct touch {
  const volatile uint8_t* at;
  int sum = 0;
};

void read_byte(void* arg) {
  auto* t = static_cast<touch*>(arg);
  t->sum += *t->at;
}

} // namespace

TEST_CASE("fault guard: a SIGBUS in a declared range is reported with its range and offset") {
  shrunk_mapping m;
  uint8_t other[64] = {};
  guarded_range ranges[2] = {{other, sizeof other}, {m.base, 2 * m.page}};

  touch fine{m.base + 10};
  auto ok = run_guarded(ranges, 2, read_byte, &fine);
  CHECK_FALSE(ok.faulted);
  CHECK(fine.sum == 7);

  for (int round = 0; round < 3; ++round) {  // SIGBUS is unblocked again after each jump
    touch past{m.base + m.page + 123};
    auto r = run_guarded(ranges, 2, read_byte, &past);
    REQUIRE(r.faulted);
    CHECK(r.range == 1);
    CHECK(r.offset == m.page + 123);
    CHECK(past.sum == 0);
  }
  // Guards are per thread: another thread's guarded fault is its own.
  guard_result from_thread;
  std::thread t([&] {
    touch past{m.base + m.page};
    from_thread = run_guarded(ranges, 2, read_byte, &past);
  });
  t.join();
  CHECK(from_thread.faulted);
  CHECK(from_thread.offset == m.page);
}

TEST_CASE("fault guard: a SIGBUS outside every declared range still kills the process") {
  shrunk_mapping m;
  // In a child: the guard declares only an unrelated range, so the fault is
  // not ours and the default action (death by SIGBUS) must follow.
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);  // the death is expected: leave no core file
    uint8_t other[64] = {};
    guarded_range ranges[1] = {{other, sizeof other}};
    touch past{m.base + m.page};
    run_guarded(ranges, 1, read_byte, &past);
    _exit(42);  // the fault was swallowed: what must not happen
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
#ifdef __SANITIZE_ADDRESS__
  // ASan's handler was there first and is passed the fault: it reports it
  // and ends the process its own way (abort or a non-zero exit).
  const bool died = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0 &&
                                            WEXITSTATUS(status) != 42);
  CHECK_MESSAGE(died, "wait status " << status);
#else
  CHECK_MESSAGE((WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS), "wait status " << status);
#endif
}
