// peer_connections: which ROUTER identity each accepted connection carries,
// so the engine bridge learns when the connection that owns an instance
// ends (actors/cache/engine_bridge.hpp).
//
// libzmq without its draft API has no ZMQ_ROUTER_NOTIFY; what it has is the
// socket monitor (ACCEPTED / DISCONNECTED, valued with the connection's file
// descriptor) and, on every message, the descriptor it came in on
// (ZMQ_SRCFD). The two arrive on different queues, so the bridge must not
// bind a descriptor to a new identity before the monitor events queued
// ahead of it were read: libzmq posts a connection's DISCONNECTED before it
// closes the descriptor, hence before a later connection can reuse it and
// send anything. needs_drain() says when that is (a descriptor seen with
// another identity, or none yet): the bridge reads the monitor first, then
// bind()s. No CAF, no ZeroMQ in here.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <unordered_map>

namespace kvs {

class peer_connections {
public:
  /// Whether the monitor must be read before a message from `identity` on
  /// descriptor `fd` is served (the descriptor does not carry it yet).
  bool needs_drain(int fd, const std::string& identity) const {
    auto i = by_fd_.find(fd);
    return i == by_fd_.end() || i->second != identity;
  }
  /// `fd` carries `identity` from now on. Returns the identity it carried
  /// before, if another: that connection ended without its DISCONNECTED
  /// being read (only when the bridge skipped the drain).
  std::optional<std::string> bind(int fd, const std::string& identity);
  /// The connection on `fd` ended: the identity it carried, if one was seen.
  std::optional<std::string> disconnected(int fd);
  size_t size() const { return by_fd_.size(); }

private:
  std::unordered_map<int, std::string> by_fd_;
};

} // namespace kvs
