#include "actors/connection_gate.hpp"

#include "log/log.hpp"

#include <zmq.h>

#include <cstring>
#include <map>
#include <mutex>

namespace kvs {

namespace {

/// Every live gate by domain. Weak: a gate lives as long as its bridge.
struct gate_registry {
  std::mutex mu;
  std::map<std::string, std::weak_ptr<connection_gate>> gates;
  uint64_t next = 0;
};

gate_registry& registry() {
  static gate_registry r;
  return r;
}

} // namespace

connection_gate::connection_gate(std::string what, std::string setting, int64_t cap,
                                 std::string domain)
  : what_(std::move(what)), setting_(std::move(setting)), domain_(std::move(domain)), cap_(cap) {}

uint64_t connection_gate::admit() {
  if (open() <= cap_)
    return 0;
  auto n = refused_.fetch_add(1, std::memory_order_relaxed) + 1;
  // The first refusal and then one in a thousand: a flood cannot flood the log.
  if (n == 1 || n % 1000 == 0)
    KVS_WARN("connection_gate", "{}: refused a connection, {} are open ({} = {}; refusal #{}, "
                                "counted in connections_refused)",
             what_, open(), setting_, cap_, n);
  return n;
}

void connection_gate::on_monitor_event(uint16_t event, uint32_t value) {
  if (event == ZMQ_EVENT_ACCEPTED)
    fds_.insert(value);
  else if (event == ZMQ_EVENT_DISCONNECTED)
    fds_.erase(value);
  else
    return;
  open_.store(static_cast<int64_t>(fds_.size()), std::memory_order_relaxed);
}

std::shared_ptr<connection_gate> make_connection_gate(std::string what, std::string setting,
                                                      int64_t cap) {
  auto& r = registry();
  std::lock_guard<std::mutex> guard{r.mu};
  // Unique in the process: two sidecars' sockets in one test never share one.
  auto domain = "kvsidecar/gate/" + std::to_string(++r.next);
  std::shared_ptr<connection_gate> gate(
    new connection_gate(std::move(what), std::move(setting), cap, domain), [](connection_gate* g) {
      auto& reg = registry();
      {
        std::lock_guard<std::mutex> guard{reg.mu};
        reg.gates.erase(g->domain());
      }
      delete g;
    });
  r.gates[domain] = gate;
  return gate;
}

std::shared_ptr<connection_gate> find_connection_gate(const std::string& domain) {
  auto& r = registry();
  std::lock_guard<std::mutex> guard{r.mu};
  auto it = r.gates.find(domain);
  return it == r.gates.end() ? nullptr : it->second.lock();
}

bool parse_monitor_event(const void* data, size_t size, uint16_t& event, uint32_t& value) {
  // libzmq 4.x (version 1 events): 2 bytes event id, 4 bytes value, host order.
  if (size != 6)
    return false;
  std::memcpy(&event, data, 2);
  std::memcpy(&value, static_cast<const char*>(data) + 2, 4);
  return true;
}

} // namespace kvs
