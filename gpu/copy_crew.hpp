// copy_crew: a few threads that split one large host copy with the thread
// that asked for it (issue #46: an lmcache_driven store or retrieve of a
// 256 MiB request was one memcpy loop on the transfer actor's thread, ~8.5
// GB/s here, while a second core sat idle; two threads reach ~16 GB/s).
//
// run() hands parts 1..n-1 of a job to the crew and runs part 0 on the
// calling thread, every part under its own thread's SIGBUS guard
// (gpu/fault_guard.hpp: an engine may truncate its pool mid-copy), and
// returns when every part has finished. The parts must touch disjoint
// bytes; a part abandoned by a fault leaves the others to finish. One run()
// uses the crew at a time (the transfer actor is its only caller; another
// concurrent caller works alone); the crew's threads
// sleep on a condition variable between jobs, so an idle crew costs nothing.
#pragma once

#include "gpu/fault_guard.hpp"

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace kvs {

class copy_crew {
public:
  /// part(arg, i, n) does part i of n. Runs under run_guarded, so it may be
  /// abandoned at any memcpy: it must own nothing, lock nothing, allocate
  /// nothing.
  using part_fn = void (*)(void* arg, size_t part, size_t parts);

  /// `threads` counts the caller: 1 = no crew, run() works alone.
  explicit copy_crew(size_t threads);
  ~copy_crew();
  copy_crew(const copy_crew&) = delete;
  copy_crew& operator=(const copy_crew&) = delete;

  /// Threads a job is split over (the caller included).
  size_t threads() const { return workers_.size() + 1; }

  /// Runs `parts` parts (clipped to threads()) of fn; the first fault any
  /// part hit, by part order (faulted false when none did).
  guard_result run(const guarded_range* ranges, size_t n, part_fn fn, void* arg, size_t parts);

private:
  struct worker {
    std::thread thread;
    guard_result result;
  };
  void loop(size_t index);

  std::vector<worker> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  uint64_t generation_ = 0; // bumped per job; a worker runs each generation once
  size_t pending_ = 0;      // crew parts of the current job not finished yet
  size_t parts_ = 0;        // parts of the current job
  bool stop_ = false;
  std::atomic<bool> busy_{false}; // a run() is using the crew
  // The current job (read by the workers under mutex_ when woken).
  const guarded_range* ranges_ = nullptr;
  size_t n_ranges_ = 0;
  part_fn fn_ = nullptr;
  void* arg_ = nullptr;
};

} // namespace kvs
