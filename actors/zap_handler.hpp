// zap_handler: who may finish a handshake on the sockets routers and
// engines connect to: CURVE client authorisation ([security], off by
// default) and every listening socket's connection limit (its
// connection_gate, found by the socket's ZAP domain). Always running.
//
// libzmq asks the ZAP handler bound at inproc://zeromq.zap.01 *of the
// socket's context* whether a CURVE client that completed the handshake may
// connect; without a handler, any key would do. One zap_handler serves every
// context of the process from one thread. It is started before any bridge
// exists and stopped after every bridge closed its sockets (app/sidecar.cpp),
// so no CURVE socket ever runs without it and its own sockets are closed
// before the contexts terminate.
#pragma once

#include <zmq.hpp>

#include <atomic>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace kvs {

/// Makes `s` a CURVE server with the 32-byte `secret_key` whose clients the
/// zap_handler authorises; nothing when `secret_key` is empty. Call before
/// bind (and before zmq_bridge::limit_connections, which sets the domain).
void serve_curve(zmq::socket_t& s, const std::string& secret_key);

class zap_handler {
public:
  /// `allowed_keys`: 32-byte client public keys.
  zap_handler(std::vector<zmq::context_t*> contexts, std::vector<std::string> allowed_keys);
  ~zap_handler();
  zap_handler(const zap_handler&) = delete;
  zap_handler& operator=(const zap_handler&) = delete;

  /// Binds the ZAP endpoint in every context and starts answering; the
  /// error when one cannot be bound.
  std::optional<std::string> start();
  /// Stops answering and closes its sockets (idempotent).
  void stop();

  uint64_t allowed() const { return allowed_.load(); }
  uint64_t denied() const { return denied_.load(); }

private:
  void run(std::vector<zmq::socket_t>& socks);
  void answer(zmq::socket_t& s);

  std::vector<zmq::context_t*> contexts_;
  std::set<std::string> allowed_keys_;
  std::string label_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> allowed_{0};
  std::atomic<uint64_t> denied_{0};
};

} // namespace kvs
