// connection_gate: a cap on how many peers one listening ZeroMQ socket holds.
//
// libzmq takes every peer that connects to a bound socket, and each holds
// pipes (up to the socket's high-water marks, both ways) for as long as it
// stays. A gate bounds that: the bridge that owns the socket counts its TCP
// connections from the socket's monitor (accepted minus disconnected, read
// on the bridge's own thread: zmq_bridge::limit_connections), and the ZAP
// handler (actors/zap_handler), which libzmq asks at every handshake once
// the socket has a ZAP domain, refuses the handshake while the count is
// past the cap. The refused peer is disconnected right after its greeting,
// holds nothing, and is counted (`connections_refused`) and logged once per
// socket (then one in a thousand).
//
// The count can lag the kernel by what arrives within one poll round of the
// owning bridge, so a burst may pass the cap by that much; the next
// handshake after the bridge caught up is refused. No CAF in here.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>

namespace kvs {

class connection_gate {
public:
  /// `what` names the socket in logs and metrics ("events.replay_endpoint
  /// dp=0"); `cap` > 0 connections at most; `setting` is the config key;
  /// `domain` unique in the process (make_connection_gate picks it).
  connection_gate(std::string what, std::string setting, int64_t cap, std::string domain);

  /// The ZAP domain the gated socket carries: how the ZAP handler finds it.
  const std::string& domain() const { return domain_; }
  const std::string& what() const { return what_; }
  int64_t cap() const { return cap_; }
  /// Connections open now, as the monitor last said.
  int64_t open() const { return open_.load(std::memory_order_relaxed); }
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

  /// ZAP handler's thread: whether a peer may finish its handshake now. A
  /// refusal is counted; returns the refusal's number (0 when admitted).
  uint64_t admit();

  /// The owning bridge's thread: one monitor event (ZMQ_EVENT_*, its value:
  /// the connection's file descriptor for ACCEPTED / DISCONNECTED).
  void on_monitor_event(uint16_t event, uint32_t value);

private:
  std::string what_;
  std::string setting_;
  std::string domain_;
  int64_t cap_;
  std::set<uint32_t> fds_; ///< open connections by descriptor (owner's thread)
  std::atomic<int64_t> open_{0};
  std::atomic<uint64_t> refused_{0};
};

/// Creates a gate and makes it findable by its domain until it is destroyed.
std::shared_ptr<connection_gate> make_connection_gate(std::string what, std::string setting,
                                                      int64_t cap);
/// The live gate with this ZAP domain, if any (the ZAP handler's lookup).
std::shared_ptr<connection_gate> find_connection_gate(const std::string& domain);

/// Decodes a monitor message's first frame (event id, value); false when
/// it is not one.
bool parse_monitor_event(const void* data, size_t size, uint16_t& event, uint32_t& value);

} // namespace kvs
