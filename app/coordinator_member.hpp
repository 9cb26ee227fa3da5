// Membership in an LMCache fleet coordinator ([coordinator], LMCache 0.5.6's
// lmcache.v1.mp_coordinator.registrar.keep_registered): a thread that
// registers (POST /instances {"instance_id", "ip", "http_port"}), sends a
// heartbeat every heartbeat_interval (PUT /instances/{id}/heartbeat),
// registers again when the coordinator answers 404 (it restarted or
// forgot us), and deregisters (DELETE /instances/{id}) when stopped. Best
// effort as LMCache's: a coordinator that is down, slow (2 s deadline a
// call) or answers garbage is logged -- once per kind of failure, and when
// it recovers -- and retried on the next tick; it never stops the sidecar.
// Bounded: one call at a time, answers of at most 1 MiB (app/http_client).
#pragma once

#include "app/coordinator_events.hpp"
#include "app/http_client.hpp"
#include "app/peer_failure_log.hpp"
#include "config/config.hpp"

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace kvs {

class coordinator_member {
public:
  /// nullptr when coordinator.url is "" (no coordinator).
  static std::unique_ptr<coordinator_member> start(const coordinator_config& cfg,
                                                   uint16_t http_port, std::string me,
                                                   std::shared_ptr<coordinator_events> events = nullptr);
  /// Stops the heartbeats and deregisters (one call, within its deadline).
  ~coordinator_member();

  coordinator_member(const coordinator_member&) = delete;
  coordinator_member& operator=(const coordinator_member&) = delete;

private:
  coordinator_member(const coordinator_config& cfg, uint16_t port, std::string me,
                     std::shared_ptr<coordinator_events> events);
  void run();
  /// One tick: register when not registered, else a heartbeat.
  void tick();
  /// Counts a failed call and logs it when its kind changed.
  void failed(std::atomic<uint64_t>& counter, const std::string& why);
  /// "<METHOD> <url><path>: HTTP <status> -- <body excerpt>" for a non-2xx answer.
  std::string answered(std::string_view method, const std::string& path,
                       const http_reply& r) const;

  coordinator_config cfg_;
  uint16_t port_;
  std::string me_;
  std::string ip_;
  std::string id_; ///< the registered id; "" = not registered
  peer_failure_log failures_;
  std::shared_ptr<coordinator_events> events_; ///< told each id we register under
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

/// The address other hosts reach this one at (LMCache's get_ip: the local
/// address of a UDP socket "connected" to a public address; no packet is
/// sent), or 127.0.0.1 when there is no route.
std::string outbound_ip();

} // namespace kvs
