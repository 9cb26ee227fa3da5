#include "gpu/copy_crew.hpp"

#include "core/thread_name.hpp"

#include <string>

namespace kvs {

namespace {

struct part_call {
  copy_crew::part_fn fn;
  void* arg;
  size_t part, parts;
};

void run_part(void* p) {
  const auto* c = static_cast<const part_call*>(p);
  c->fn(c->arg, c->part, c->parts);
}

} // namespace

copy_crew::copy_crew(size_t threads) {
  if (threads > 1) workers_.resize(threads - 1);
  for (size_t i = 0; i < workers_.size(); ++i)
    workers_[i].thread = std::thread([this, i] { loop(i); });
}

copy_crew::~copy_crew() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (worker& w : workers_) w.thread.join();
}

void copy_crew::loop(size_t index) {
  name_this_thread("kvs-copy-" + std::to_string(index + 1));
  uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const size_t part = index + 1;
    if (part >= parts_) continue; // this job has fewer parts than the crew
    part_call call{fn_, arg_, part, parts_};
    const guarded_range* ranges = ranges_;
    const size_t n = n_ranges_;
    lock.unlock();
    const guard_result r = run_guarded(ranges, n, &run_part, &call);
    lock.lock();
    workers_[index].result = r;
    if (--pending_ == 0) done_.notify_one();
  }
}

guard_result copy_crew::run(const guarded_range* ranges, size_t n, part_fn fn, void* arg,
                            size_t parts) {
  if (parts > threads()) parts = threads();
  // A second caller while a job runs (not expected: one transfer actor)
  // works alone rather than wait for the crew.
  if (parts <= 1 || busy_.exchange(true, std::memory_order_acquire)) {
    part_call call{fn, arg, 0, 1};
    return run_guarded(ranges, n, &run_part, &call);
  }
  struct release {
    std::atomic<bool>& b;
    ~release() { b.store(false, std::memory_order_release); }
  } done_with_crew{busy_};
  {
    std::lock_guard lock(mutex_);
    ranges_ = ranges;
    n_ranges_ = n;
    fn_ = fn;
    arg_ = arg;
    parts_ = parts;
    pending_ = parts - 1;
    for (worker& w : workers_) w.result = guard_result{};
    ++generation_;
  }
  wake_.notify_all();
  part_call call{fn, arg, 0, parts};
  const guard_result mine = run_guarded(ranges, n, &run_part, &call);
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
  if (mine.faulted) return mine;
  for (size_t i = 0; i + 1 < parts; ++i)
    if (workers_[i].result.faulted) return workers_[i].result;
  return guard_result{};
}

} // namespace kvs
