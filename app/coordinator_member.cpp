#include "app/coordinator_member.hpp"

#include "app/http_client.hpp"
#include "log/log.hpp"
#include "http/json_text.hpp"
#include "metrics/coordinator_calls.hpp"

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
  coordinator_calls().joined = true;
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
  if (!r || (r.value().status / 100 != 2 && r.value().status != 404))
    coordinator_calls().deregistering.fetch_add(1, std::memory_order_relaxed);
  if (!r)
    KVS_WARN(me_, "deregistering {} from the coordinator failed: {}", id_, r.error_value().detail);
  else if (r.value().status / 100 != 2 && r.value().status != 404)
    KVS_WARN(me_, "deregistering {} from the coordinator: DELETE {}/instances/{}: HTTP {}", id_,
             cfg_.url, id_, r.value().status);
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

void coordinator_member::failed(std::atomic<uint64_t>& counter, const std::string& why) {
  counter.fetch_add(1, std::memory_order_relaxed);
  if (failures_.failed(why))
    KVS_WARN(me_, "coordinator: {} (retrying every heartbeat; logged again when it changes)", why);
}

std::string coordinator_member::answered(std::string_view method, const std::string& path,
                                         const http_reply& r) const {
  // The body excerpt after " -- ": garbage differs each time, its kind does not.
  return std::string{method} + " " + cfg_.url + path + ": HTTP " + std::to_string(r.status) + " -- "
         + printable_excerpt(r.body);
}

void coordinator_member::tick() {
  if (id_.empty()) {
    json_writer w;
    w.begin_object().str("instance_id", cfg_.instance_id).str("ip", ip_)
      .integer("http_port", port_).end_object();
    auto& counter = coordinator_calls().registering;
    auto r = http_call(cfg_.url, "POST", "/instances", w.take(), call_timeout);
    if (!r)
      return failed(counter, "registering failed: " + r.error_value().detail);
    if (r.value().status / 100 != 2)
      return failed(counter, "registering: " + answered("POST", "/instances", r.value()));
    auto o = parse_json_object(r.value().body);
    auto id = o.error.empty() ? o.get("instance_id") : nullptr;
    if (!o.error.empty())
      return failed(counter, "registering: POST " + cfg_.url + "/instances answered "
                               + std::to_string(r.value().status) + " with no JSON object ("
                               + o.error + ") -- " + printable_excerpt(r.value().body));
    if (!id || id->k != json_value::kind::string || id->s.empty() || id->s.size() > 256
        || id->s.find_first_of("/?#% ") != std::string::npos)
      return failed(counter, "registering: POST " + cfg_.url
                               + "/instances answered no usable instance_id -- "
                               + printable_excerpt(r.value().body));
    id_ = id->s;
    if (events_)
      events_->set_instance_id(id_);
    failures_.succeeded();
    KVS_INFO(me_, "registered with the coordinator as {}", id_);
    return;
  }
  auto& counter = coordinator_calls().heartbeat;
  auto r = http_call(cfg_.url, "PUT", "/instances/" + id_ + "/heartbeat", {}, call_timeout);
  if (!r)
    return failed(counter, "heartbeat failed: " + r.error_value().detail);
  if (r.value().status == 404) {
    // The coordinator forgot us (restarted): register again at once.
    KVS_INFO(me_, "the coordinator no longer knows {}: registering again", id_);
    id_.clear();
    tick();
    return;
  }
  if (r.value().status / 100 != 2)
    return failed(counter, "heartbeat: " + answered("PUT", "/instances/" + id_ + "/heartbeat", r.value()));
  if (failures_.succeeded())
    KVS_INFO(me_, "coordinator reachable again");
}

} // namespace kvs
