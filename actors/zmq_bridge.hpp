// zmq_bridge: the base of every actor that owns ZeroMQ sockets.
//
// A blocking CAF actor on its own thread. It owns its sockets for its whole
// life (xeus-zmq style: one thread per component, no socket shared) and
// waits in zmq_poll with no timeout on its sockets plus an eventfd. Every
// message put into its mailbox writes the eventfd, so a typed message wakes
// the poll at once: no busy loop, no polling interval.
//
// Start-up handshake: after open() the bridge sends `ready_atom, label` (or
// `failed_atom, label, why`) to its supervisor. Shutdown handshake: on
// `stop_atom` the bridge calls drain(), closes its sockets on its own thread,
// sends `stop_atom, label` to the supervisor and returns from act().
//
// Built in besides stop: `stats_atom` (the periodic stats line) and
// `metrics_atom, reply_to` (sends snapshot() to reply_to), both from
// snapshot(), so the log line and /metrics share one source.
#pragma once

#include "actors/connection_gate.hpp"
#include "messages/stats_snapshot.hpp"
#include "messages/type_ids.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/blocking_actor.hpp>
#include <caf/typed_behavior.hpp>
#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvs {

/// What poll_timeout() returns besides a real delay: sleep until a socket or
/// the mailbox is ready (zmq_poll's -1), or only look and return (0).
inline constexpr std::chrono::milliseconds poll_until_ready{-1};
inline constexpr std::chrono::milliseconds poll_now{0};

class zmq_bridge : public caf::blocking_actor {
public:
  zmq_bridge(caf::actor_config& cfg, zmq::context_t& ctx, std::string name,
             std::string detail, caf::actor supervisor,
             std::chrono::nanoseconds stats_interval);
  ~zmq_bridge() override;

  zmq_bridge(const zmq_bridge&) = delete;
  zmq_bridge& operator=(const zmq_bridge&) = delete;

  /// Wakes the poll loop after the message is in the mailbox.
  void enqueue(caf::mailbox_element_ptr ptr, caf::execution_unit* eu) override;

  void act() final;

  const char* name() const override;

  /// "ingest[dp=0]#7": how this bridge names itself in logs.
  const std::string& label() const {
    return label_;
  }

protected:
  // -- hooks, all called on the bridge's own thread ---------------------------

  /// Creates, configures and binds/connects the sockets; returns why not.
  virtual std::optional<std::string> open() = 0;
  /// The typed messages this bridge handles, built with typed_handlers<I>().
  virtual caf::behavior handlers() = 0;

  /// A bridge's handlers, checked by the compiler against its typed
  /// interface `Handle` (interfaces.hpp, extending bridge_actor): every
  /// message the interface names is handled and nothing else is, as for an
  /// event-based typed actor. The built-ins (bridge_actor's stop, stats and
  /// metrics) are the base's and are added here.
  template <class Handle, class... Fs>
  caf::behavior typed_handlers(Fs... fs) {
    typename Handle::behavior_type checked{
      std::move(fs)...,
      [this](stop_atom) { on_stop(); },
      [this](stats_atom) { on_stats(); },
      [this](metrics_atom, const caf::actor& reply_to) { on_metrics(reply_to); }};
    return std::move(checked.unbox());
  }
  /// Socket `index` (order of watch()) is ready with `revents`.
  virtual void on_socket(size_t index, short revents) = 0;
  /// The bridge's counters: its periodic stats line (every stats_interval
  /// when > 0) and its answer to `metrics_atom` (/metrics) come from here.
  virtual stats_snapshot snapshot() {
    return {};
  }
  /// Called on stop, before the sockets close: flush what was accepted.
  virtual void drain() {}
  /// Closes the sockets (default: every owned socket, linger 0).
  virtual void close_sockets();
  /// Poll timeout while the bridge has deferred work (default: none).
  virtual std::chrono::milliseconds poll_timeout() {
    return poll_until_ready;
  }
  /// Called after each poll round, e.g. to retry deferred sends.
  virtual void after_poll() {}

  // -- helpers for subclasses -------------------------------------------------

  /// Registers a socket the bridge created: close_sockets() closes it on
  /// this thread, even when open() fails half-way. Call right after creating.
  zmq::socket_t& own(zmq::socket_t& s) {
    owned_.push_back(&s);
    return s;
  }
  /// Adds `s` to the poll set with interest `events`; returns its index.
  size_t watch(zmq::socket_t& s, short events);
  /// Caps the peers the listening socket `s` holds at `cap` (> 0; call
  /// before it binds, after serve_curve): a connection_gate counts them from
  /// the socket's monitor, read here on this thread between the bridge's
  /// own sockets, and the ZAP handler refuses handshakes past the cap.
  /// `what` names the socket ("events.replay_endpoint"), `setting` the
  /// config key of the cap. Its figures join this bridge's stats
  /// (connections, connections_refused). A handshake that does not finish
  /// within handshake_timeout is dropped, so silent TCP peers free their
  /// place too.
  void limit_connections(zmq::socket_t& s, const std::string& what, const std::string& setting,
                         int64_t cap);
  /// The same for a socket whose monitor the bridge reads itself (one
  /// monitor per socket in libzmq): it passes ACCEPTED / DISCONNECTED
  /// events to the returned gate.
  std::shared_ptr<connection_gate> gate_connections(zmq::socket_t& s, const std::string& what,
                                                    const std::string& setting, int64_t cap);
  /// For a loop draining a socket: true when the mailbox (a scrape, a
  /// reply, a stop) should get its turn now. Checked every 32 messages, so a
  /// flood of slow messages (large batches, a sanitizer build) delays the
  /// mailbox by 32 of them rather than by a whole burst; the poll loop
  /// comes straight back to the socket afterwards.
  bool mailbox_waiting(int handled) {
    return handled % 32 == 31 && has_next_message();
  }

  zmq::context_t& ctx_;
  caf::actor supervisor_;

private:
  void dispatch_mailbox(caf::behavior& base);
  // The built-ins typed_handlers() adds.
  void on_stop();
  void on_stats();
  void on_metrics(const caf::actor& reply_to);
  /// snapshot() with what the base keeps (the gates' figures).
  stats_snapshot full_snapshot();
  void read_monitor(size_t index);
  void close_monitors();

  std::string name_;
  std::string detail_; ///< "dp=0": names a gate's socket with its rank
  std::string label_;
  std::string thread_name_; ///< this bridge's thread, as top -H shows it
  std::chrono::nanoseconds stats_interval_;
  int efd_ = -1;
  std::atomic<bool> polling_{false}; ///< in (or entering) zmq_poll: wake via efd_
  std::vector<zmq::socket_t*> owned_;
  std::vector<zmq::socket_t*> sockets_;
  std::vector<zmq::pollitem_t> items_; // [0] = eventfd, then sockets_, then monitors_
  /// One per limit_connections(): the monitor PAIR this bridge reads, and
  /// the gate its events go to.
  struct gate_monitor {
    zmq::socket_t pair;
    std::shared_ptr<connection_gate> gate;
  };
  std::list<gate_monitor> monitors_;
  /// Every gate (limit_connections' and gate_connections'): their figures.
  std::vector<std::shared_ptr<connection_gate>> gates_;
  bool running_ = true;
  bool stopping_ = false; ///< a stop request ended the loop: acknowledge it
};

/// Opens `ep` on `s` by vLLM's rule: bind for * / :: / ipc:// / inproc://,
/// else connect. `force_bind` always binds. Returns the endpoint actually
/// bound (ZMQ_LAST_ENDPOINT, so port 0 shows the real port) or the error.
struct open_result {
  bool ok = false;
  bool bound = false;
  std::string endpoint; ///< actual endpoint on success, error text on failure
};
open_result open_endpoint(zmq::socket_t& s, const std::string& ep, bool force_bind);

/// Spawns a bridge on its own thread and returns it as its typed interface
/// (`Bridge::handle_type`, interfaces.hpp). A blocking actor spawns as an
/// untyped caf::actor in CAF 0.17; this is the one place it is cast, and
/// typed_handlers() checks that the bridge handles exactly that interface.
template <class Bridge, class... Ts>
typename Bridge::handle_type spawn_bridge(caf::actor_system& sys, Ts&&... xs) {
  return caf::actor_cast<typename Bridge::handle_type>(
    sys.spawn<Bridge, caf::detached>(std::forward<Ts>(xs)...));
}

} // namespace kvs
