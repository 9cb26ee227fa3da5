// What the process says about itself, readable from any thread: the
// sidecar writes it, the HTTP /healthz and /readyz endpoints read it.
//
//   alive     every long-lived actor is running (false once one exited
//             unexpectedly; the process then exits with status 3)
//   ready     the start-up handshake is done and no shutdown has begun
//   draining  a stop signal arrived: input is stopping, output draining
#pragma once

#include <atomic>
#include <memory>

namespace kvs {

struct health_state {
  std::atomic<bool> alive{true};
  std::atomic<bool> ready{false};
  std::atomic<bool> draining{false};

  /// /healthz: the process should be kept (not restarted).
  bool healthy() const { return alive.load(); }
  /// /readyz: the process should get traffic.
  bool serving() const { return alive.load() && ready.load() && !draining.load(); }
};

using health_ptr = std::shared_ptr<health_state>;

} // namespace kvs
