// Small ZeroMQ frame helpers shared by the bridges.
#pragma once

#include "actors/connection_gate.hpp"

#include <zmq.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvs {

/// Receives one whole multipart message without blocking: false (and
/// `frames` empty) when none is waiting. Later parts of a message are always
/// there once its first part is.
inline bool recv_message(zmq::socket_t& s, std::vector<zmq::message_t>& frames) {
  frames.clear();
  zmq::message_t first;
  if (!s.recv(first, zmq::recv_flags::dontwait))
    return false;
  frames.push_back(std::move(first));
  while (frames.back().more()) {
    zmq::message_t part;
    (void) s.recv(part, zmq::recv_flags::none);
    frames.push_back(std::move(part));
  }
  return true;
}

/// Reads every event waiting on a socket monitor's PAIR, calling
/// `f(event, value, endpoint)` for each well-formed one ([event (u16) +
/// value (u32), endpoint], host byte order); others are skipped.
template <class F>
void drain_monitor_events(zmq::socket_t& pair, F&& f) {
  std::vector<zmq::message_t> frames;
  while (recv_message(pair, frames)) {
    uint16_t event = 0;
    uint32_t value = 0;
    if (frames.size() == 2 && parse_monitor_event(frames[0].data(), frames[0].size(), event, value))
      f(event, value, frames[1].to_string());
  }
}

/// 8-byte big-endian encoding of a sequence number (vLLM's `seq` frame).
inline void put_be64(uint64_t v, unsigned char out[8]) {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<unsigned char>(v & 0xff);
    v >>= 8;
  }
}

inline uint64_t get_be64(const void* p) {
  auto b = static_cast<const unsigned char*>(p);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v = (v << 8) | b[i];
  return v;
}

inline zmq::message_t be64_frame(uint64_t v) {
  zmq::message_t m{8};
  put_be64(v, static_cast<unsigned char*>(m.data()));
  return m;
}

/// libzmq learns that a subscriber has read on through a command its I/O
/// thread posts to the socket (every low-water-mark messages), and a send
/// looks at pending commands only about once a millisecond (a CPU-tick
/// throttle). So a send can be refused for a pipe whose reader has already
/// drained it. Reading ZMQ_EVENTS processes every pending command at once,
/// unthrottled: a send refused after it is refused for a pipe full now.
inline void take_pending_commands(zmq::socket_t& s) {
  (void)s.get(zmq::sockopt::events);
}

/// Closes `s` (if open) after giving what was accepted up to `linger` to
/// leave: messages still in ZeroMQ's pipes are flushed meanwhile.
inline void close_with_linger(zmq::socket_t& s, std::chrono::nanoseconds linger) {
  if (s.handle() == nullptr)
    return;
  s.set(zmq::sockopt::linger,
        static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(linger).count()));
  s.close();
}

/// A frame that points into a shared payload without copying it; the
/// payload stays alive until ZeroMQ is done with the frame.
inline zmq::message_t shared_frame(const std::shared_ptr<const std::string>& payload) {
  auto* keep = new std::shared_ptr<const std::string>(payload);
  return zmq::message_t{
    const_cast<char*>((*keep)->data()), (*keep)->size(),
    [](void*, void* hint) { delete static_cast<std::shared_ptr<const std::string>*>(hint); },
    keep};
}

} // namespace kvs
