#include "actors/zmq_bridge.hpp"

#include "actors/zmq_frames.hpp"

#include "core/thread_name.hpp"
#include "log/log.hpp"
#include "log/stats_repeat.hpp"
#include "config/config.hpp"
#include "messages/type_ids.hpp"

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/send.hpp>

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvs {

zmq_bridge::zmq_bridge(caf::actor_config& cfg, zmq::context_t& ctx, std::string name,
                       std::string detail, caf::actor supervisor,
                       std::chrono::nanoseconds stats_interval)
  : caf::blocking_actor(cfg),
    ctx_(ctx),
    supervisor_(std::move(supervisor)),
    name_(std::move(name)),
    detail_(detail),
    label_(log::label(name_, detail, id())),
    thread_name_(actor_thread_name(name_, detail)),
    stats_interval_(stats_interval) {
  efd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

zmq_bridge::~zmq_bridge() {
  if (efd_ >= 0)
    ::close(efd_);
}

const char* zmq_bridge::name() const {
  return name_.c_str();
}

void zmq_bridge::enqueue(caf::mailbox_element_ptr ptr, caf::execution_unit* eu) {
  caf::blocking_actor::enqueue(std::move(ptr), eu);
  // Only a bridge that is (about to be) asleep in zmq_poll needs the
  // eventfd: under load this saves a syscall per message. Paired with the
  // fence in act(): either we see `polling_`, or the bridge sees the message.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (polling_.load(std::memory_order_relaxed)) {
    uint64_t one = 1;
    // A full counter (never in practice) still leaves the fd readable.
    [[maybe_unused]] auto n = ::write(efd_, &one, sizeof(one));
  }
}

size_t zmq_bridge::watch(zmq::socket_t& s, short events) {
  sockets_.push_back(&s);
  items_.push_back(zmq::pollitem_t{s.handle(), 0, events, 0});
  return sockets_.size() - 1;
}

void zmq_bridge::limit_connections(zmq::socket_t& s, const std::string& what,
                                   const std::string& setting, int64_t cap) {
  // Unbounded: the monitor's pipe must never drop an event (the count would
  // drift); what it holds is a few bytes per connection event.
  constexpr int unbounded = 0;
  auto gate = gate_connections(s, what, setting, cap);
  auto ep = "inproc://kvsidecar-monitor-" + gate->domain();
  if (zmq_socket_monitor(s.handle(), ep.c_str(), ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0)
    throw zmq::error_t{};
  auto& gm = monitors_.emplace_back(gate_monitor{zmq::socket_t{ctx_, zmq::socket_type::pair}, gate});
  auto& m = gm.pair;
  m.set(zmq::sockopt::linger, 0);
  m.set(zmq::sockopt::rcvhwm, unbounded);
  m.connect(ep);
}

std::shared_ptr<connection_gate> zmq_bridge::gate_connections(zmq::socket_t& s,
                                                             const std::string& what,
                                                             const std::string& setting,
                                                             int64_t cap) {
  constexpr int handshake_timeout_ms = 5000;
  auto gate = make_connection_gate(what + (detail_.empty() ? "" : " " + detail_), setting, cap);
  s.set(zmq::sockopt::zap_domain, gate->domain());
  s.set(zmq::sockopt::handshake_ivl, handshake_timeout_ms);
  gates_.push_back(gate);
  return gate;
}

void zmq_bridge::read_monitor(size_t index) {
  auto it = std::next(monitors_.begin(), static_cast<std::ptrdiff_t>(index));
  auto& gate = *it->gate;
  // All that waits is read now, so the count is current before the next
  // handshake.
  drain_monitor_events(it->pair, [&gate](uint16_t event, uint32_t value, const std::string&) {
    gate.on_monitor_event(event, value);
  });
}

void zmq_bridge::close_monitors() {
  // Not in close_sockets(): a bridge that overrides it (PUB linger) need
  // not know about them.
  for (auto& m : monitors_)
    if (m.pair.handle() != nullptr)
      m.pair.close();
}

stats_snapshot zmq_bridge::full_snapshot() {
  auto s = snapshot();
  for (auto& g : gates_)
    s.gauge("connections", "kvsidecar_connections", static_cast<double>(g->open()), "socket",
            g->what())
      .counter("connections_refused", "kvsidecar_connections_refused_total",
               static_cast<double>(g->refused()), "socket", g->what());
  return s;
}

void zmq_bridge::close_sockets() {
  for (auto* s : owned_)
    if (s->handle() != nullptr) {
      s->set(zmq::sockopt::linger, 0);
      s->close();
    }
}

void zmq_bridge::dispatch_mailbox(caf::behavior& base) {
  // Drains everything queued; handlers run here, on the bridge's thread.
  while (running_ && has_next_message()) {
    auto ptr = dequeue();
    if (!ptr)
      break;
    auto msg = ptr->move_content_to_message();
    if (msg.match_elements<caf::exit_msg>()) {
      KVS_INFO(label_, "exit requested ({})", to_string(msg.get_as<caf::exit_msg>(0).reason));
      drain();
      running_ = false;
      break;
    }
    if (!base(msg))
      KVS_WARN(label_, "ignored an unexpected message: {}", to_string(msg));
  }
}

void zmq_bridge::on_stop() {
  drain();
  stopping_ = true;
  running_ = false;
}

void zmq_bridge::on_stats() {
  if (auto line = full_snapshot().line(); log::stats_line_due(label_, line))
    KVS_INFO(label_, "stats: {}", line);
  delayed_send(caf::actor_cast<caf::actor>(this), stats_interval_, stats_atom_v);
}

void zmq_bridge::on_metrics(const caf::actor& reply_to) {
  auto s = full_snapshot();
  s.actor = label_;
  s.actor_id = id();
  send(reply_to, std::move(s));
}

void zmq_bridge::act() {
  name_this_thread(thread_name_);
  if (efd_ < 0) {
    auto why = std::string{"eventfd: "} + std::strerror(errno);
    send(supervisor_, failed_atom_v, label_, why);
    return;
  }
  std::optional<std::string> err;
  try {
    err = open();
  } catch (const std::exception& e) {
    err = e.what();
  }
  if (err) {
    close_sockets();
    close_monitors();
    KVS_ERROR(label_, "failed to start: {}", *err);
    send(supervisor_, failed_atom_v, label_, *err);
    return;
  }
  items_.insert(items_.begin(), zmq::pollitem_t{nullptr, efd_, ZMQ_POLLIN, 0});
  for (auto& m : monitors_)
    items_.push_back(zmq::pollitem_t{m.pair.handle(), 0, ZMQ_POLLIN, 0});
  KVS_DEBUG(label_, "started");
  send(supervisor_, ready_atom_v, label_);

  auto base = handlers();
  if (stats_interval_.count() > 0)
    delayed_send(caf::actor_cast<caf::actor>(this), stats_interval_, stats_atom_v);

  while (running_) {
    try {
      polling_.store(true, std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      // Messages that arrived meanwhile are handled without sleeping.
      auto timeout = has_next_message() ? poll_now : poll_timeout();
      zmq::poll(items_.data(), items_.size(), timeout);
      polling_.store(false, std::memory_order_relaxed);
    } catch (const zmq::error_t& e) {
      polling_.store(false, std::memory_order_relaxed);
      if (e.num() == EINTR)
        continue;
      KVS_ERROR(label_, "poll failed: {}", e.what());
      break;
    }
    if (items_[0].revents & ZMQ_POLLIN) {
      uint64_t n;
      [[maybe_unused]] auto r = ::read(efd_, &n, sizeof(n));
    }
    dispatch_mailbox(base);
    if (!running_)
      break;
    // Connection counts first: current before the sockets' traffic.
    for (size_t m = 0; m < monitors_.size(); ++m)
      if (items_[1 + sockets_.size() + m].revents != 0)
        read_monitor(m);
    for (size_t i = 1; i <= sockets_.size(); ++i)
      if (items_[i].revents != 0) {
        try {
          on_socket(i - 1, items_[i].revents);
        } catch (const zmq::error_t& e) {
          KVS_ERROR(label_, "socket error: {}", e.what());
        }
      }
    after_poll();
  }
  close_sockets();
  close_monitors();
  KVS_INFO(label_, "stopped, sockets closed{}", stopping_ ? "" : " (not by a stop request)");
  if (stopping_)
    send(supervisor_, stop_atom_v, label_);
}

open_result open_endpoint(zmq::socket_t& s, const std::string& ep, bool force_bind) {
  open_result r;
  r.bound = force_bind || endpoint_binds(ep);
  try {
    // An IPv6 literal ("tcp://[::]:5600", "tcp://[fd00::5]:5557") needs
    // libzmq's IPv6 option, as vLLM sets it for such addresses; bound to
    // [::] the socket takes IPv4 clients too. Without it libzmq answers
    // "No such device".
    if (ep.rfind("tcp://", 0) == 0 && ep.find('[') != std::string::npos)
      s.set(zmq::sockopt::ipv6, true);
    if (r.bound)
      s.bind(ep);
    else
      s.connect(ep);
    r.endpoint = r.bound ? s.get(zmq::sockopt::last_endpoint) : ep;
    r.ok = true;
  } catch (const zmq::error_t& e) {
    r.endpoint = std::string{r.bound ? "bind " : "connect "} + ep + ": " + e.what();
  }
  return r;
}

} // namespace kvs
