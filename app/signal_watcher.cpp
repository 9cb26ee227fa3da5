#include "app/signal_watcher.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

namespace kvs {

signal_watcher::signal_watcher(std::function<void(int)> on_signal)
    : on_signal_(std::move(on_signal)) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  signal_fd_ = signalfd(-1, &set, SFD_CLOEXEC);
  stop_fd_ = eventfd(0, EFD_CLOEXEC);
  if (signal_fd_ < 0 || stop_fd_ < 0) {
    error_ = std::string{"signalfd/eventfd: "} + std::strerror(errno);
    return;
  }
  thread_ = std::thread([this] { run(); });
}

signal_watcher::~signal_watcher() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof one);
    thread_.join();
  }
  if (signal_fd_ >= 0)
    close(signal_fd_);
  if (stop_fd_ >= 0)
    close(stop_fd_);
}

void signal_watcher::run() {
  pollfd fds[2] = {{signal_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  for (;;) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR)
        continue;
      return;
    }
    if (fds[1].revents != 0)
      return;
    signalfd_siginfo info{};
    if (read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info))
      on_signal_(static_cast<int>(info.ssi_signo));
  }
}

} // namespace kvs
