// A thread that turns SIGINT/SIGTERM into calls of a function, so that the
// main thread can wait for "a signal or an actor that died" in one blocking
// receive instead of polling both.
//
// The signals must be blocked in every thread (block_signals() before any
// thread starts); the watcher reads them from a signalfd. Destroying the
// watcher stops and joins its thread.
#pragma once

#include <functional>
#include <string>
#include <thread>

namespace kvs {

class signal_watcher {
public:
  /// `on_signal` runs on the watcher's thread, once per signal. On failure
  /// (no signalfd) `error()` says why and no thread runs.
  explicit signal_watcher(std::function<void(int)> on_signal);
  ~signal_watcher();
  signal_watcher(const signal_watcher&) = delete;
  signal_watcher& operator=(const signal_watcher&) = delete;

  const std::string& error() const { return error_; }

private:
  void run();

  std::function<void(int)> on_signal_;
  int signal_fd_ = -1;
  int stop_fd_ = -1; ///< eventfd: written by the destructor
  std::string error_;
  std::thread thread_;
};

} // namespace kvs
