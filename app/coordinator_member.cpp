#include "app/coordinator_member.hpp"

#include "app/http_client.hpp"
#include "log/log.hpp"
#include "http/json_text.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace kvs {

namespace {
constexpr std::chrono::milliseconds call_timeout{2000};
} // namespace

std::string outbound_ip() {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return "127.0.0.1";
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(80);
  ::inet_pton(AF_INET, "10.255.255.255", &to.sin_addr);
  std::string ip = "127.0.0.1";
  sockaddr_in me{};
  socklen_t len = sizeof me;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0
      && ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0) {
    char buf[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &me.sin_addr, buf, sizeof buf) && std::string{buf} != "0.0.0.0")
      ip = buf;
  }
  ::close(fd);
  return ip;
}

std::unique_ptr<coordinator_member> coordinator_member::start(const coordinator_config& cfg,
                                                              uint16_t http_port,
                                                              std::string me,
                                                              std::shared_ptr<coordinator_events> events) {
  if (cfg.url.empty())
    return nullptr;
  return std::unique_ptr<coordinator_member>(
    new coordinator_member(cfg, http_port, std::move(me), std::move(events)));
}

coordinator_member::coordinator_member(const coordinator_config& cfg, uint16_t port,
                                       std::string me, std::shared_ptr<coordinator_events> events)
  : cfg_(cfg), port_(port), me_(std::move(me)), events_(std::move(events)) {
  while (!cfg_.url.empty() && cfg_.url.back() == '/')
    cfg_.url.pop_back();
  ip_ = cfg_.advertise_address.empty() ? outbound_ip() : cfg_.advertise_address;
  KVS_INFO(me_, "joining the LMCache coordinator at {} as {}:{} (heartbeat every {} ms)", cfg_.url,
           ip_, port_,
           std::chrono::duration_cast<std::chrono::milliseconds>(cfg_.heartbeat_interval).count());
  thread_ = std::thread([this] { run(); });
}

coordinator_member::~coordinator_member() {
  {
    std::lock_guard<std::mutex> lock{mu_};
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (events_)
    events_->leave(); // its last events first, then nothing after we are gone
  if (id_.empty())
    return;
  auto r = http_call(cfg_.url, "DELETE", "/instances/" + id_, {}, call_timeout);
  if (!r)
    KVS_WARN(me_, "deregistering {} from the coordinator failed: {}", id_, r.error_value().detail);
  else if (r.value().status / 100 != 2 && r.value().status != 404)
    KVS_WARN(me_, "deregistering {} from the coordinator: HTTP {}", id_, r.value().status);
  else
    KVS_INFO(me_, "deregistered {} from the coordinator", id_);
}

void coordinator_member::run() {
  std::unique_lock<std::mutex> lock{mu_};
  while (!stop_) {
    lock.unlock();
    tick();
    lock.lock();
    cv_.wait_for(lock, cfg_.heartbeat_interval, [this] { return stop_; });
  }
}

void coordinator_member::failed(const std::string& why) {
  if (why != last_error_)
    KVS_WARN(me_, "coordinator: {} (retrying every heartbeat; logged again when it changes)", why);
  last_error_ = why;
}

void coordinator_member::tick() {
  if (id_.empty()) {
    json_writer w;
    w.begin_object().str("instance_id", cfg_.instance_id).str("ip", ip_)
      .integer("http_port", port_).end_object();
    auto r = http_call(cfg_.url, "POST", "/instances", w.take(), call_timeout);
    if (!r)
      return failed("registering failed: " + r.error_value().detail);
    if (r.value().status / 100 != 2)
      return failed("registering: HTTP " + std::to_string(r.value().status) + ": "
                    + r.value().body.substr(0, 200));
    auto o = parse_json_object(r.value().body);
    auto id = o.error.empty() ? o.get("instance_id") : nullptr;
    if (!id || id->k != json_value::kind::string || id->s.empty() || id->s.size() > 256
        || id->s.find_first_of("/?#% ") != std::string::npos)
      return failed("registering: the answer has no usable instance_id: "
                    + r.value().body.substr(0, 200));
    id_ = id->s;
    if (events_)
      events_->set_instance_id(id_);
    last_error_.clear();
    KVS_INFO(me_, "registered with the coordinator as {}", id_);
    return;
  }
  auto r = http_call(cfg_.url, "PUT", "/instances/" + id_ + "/heartbeat", {}, call_timeout);
  if (!r)
    return failed("heartbeat failed: " + r.error_value().detail);
  if (r.value().status == 404) {
    // The coordinator forgot us (restarted): register again at once.
    KVS_INFO(me_, "the coordinator no longer knows {}: registering again", id_);
    id_.clear();
    tick();
    return;
  }
  if (r.value().status / 100 != 2)
    return failed("heartbeat: HTTP " + std::to_string(r.value().status));
  if (!last_error_.empty())
    KVS_INFO(me_, "coordinator reachable again");
  last_error_.clear();
}

} // namespace kvs
