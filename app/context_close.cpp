#include "app/context_close.hpp"

#include <zmq.hpp>

#include <future>
#include <memory>
#include <thread>

namespace kvs {

bool close_contexts_until(const std::vector<zmq::context_t*>& contexts,
                          std::chrono::steady_clock::time_point deadline) {
  // Shared: a detached thread may outlive this call.
  auto done = std::make_shared<std::promise<void>>();
  auto closed = done->get_future();
  std::thread closer{[contexts, done] {
    for (auto* c : contexts)
      c->close();
    done->set_value();
  }};
  if (closed.wait_until(deadline) == std::future_status::ready) {
    closer.join();
    return true;
  }
  closer.detach();
  return false;
}

} // namespace kvs
