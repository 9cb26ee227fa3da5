// http_server: /metrics, /healthz and /readyz on [http] listen, and a
// control plane (http/control_plane.hpp: LMCache's HTTP API,
// admin/admin_plane.hpp) beside them.
//
//   GET /metrics  Prometheus text format (prometheus-cpp's TextSerializer)
//   GET /healthz  200 "ok" while the process and its long-lived actors live
//   GET /readyz   200 "ready" once start-up is done; 503 during start-up and drain
//   anything else: the control plane's, when one is given; a request
//     body (Content-Length, at most http_max_body, else 413) is read for it,
//     within the same http_head_timeout as the head. A call
//     that needs the actors runs on a third thread ("http-admin"), one at
//     a time, so neither probes nor scrapes wait for it.
//
// One thread ("http") owns the listening socket and every connection and
// polls them all (non-blocking, no per-connection thread): a client that
// sends half a request and waits, or never reads its answer, holds one slot
// and nothing else, so the kubelet's probes are answered while hundreds of
// such clients are connected. Each connection has a deadline (its request
// head within http_head_timeout, its answer written within
// http_write_timeout); at http_max_connections the oldest connection is
// closed for the new one. Probes are answered on that thread from the health
// atomics; a /metrics scrape, which waits up to the collector's timeout for
// the actors, runs on a second thread ("http-scrape"), so probes never wait
// for a scrape; collections start at most every http_min_scrape_interval,
// shared by the scrapes waiting. Nothing here runs on an actor's thread.
//
// What it closes or refuses is counted (kvsidecar_http_requests_total by
// status code, kvsidecar_http_closed_total by reason, exported with every
// scrape) and logged: the first time for each reason, then at most once a
// minute with the count since the last line and the last client's address.
//
// Shutdown is a handshake: the destructor wakes the loop (eventfd), the loop
// closes its sockets and returns, the threads are joined; no socket outlives
// its thread.
#pragma once

#include "http/control_plane.hpp"
#include "metrics/collector.hpp"
#include "metrics/health.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace kvs {

/// Connections served at once; the oldest is closed for a new one past it.
inline constexpr size_t http_max_connections = 256;
/// A request head (request line and header fields) larger than this is 431.
inline constexpr size_t http_max_head = 8192;
/// Time from accept to a whole request head; then the connection is closed.
inline constexpr std::chrono::milliseconds http_head_timeout{5000};
/// Time to write an answer (and to drain what the client still sends).
inline constexpr std::chrono::milliseconds http_write_timeout{10000};
/// Collections (every long-lived actor asked for its stats) start at most
/// this often; scrapes waiting meanwhile (at most one per connection)
/// share the next one. Measured: each
/// costs the actors ~220 us of CPU, so a client scraping in a loop (~800/s)
/// took ~18% of a core from them; now at most ~0.2%.
inline constexpr std::chrono::milliseconds http_min_scrape_interval{100};

class http_server {
public:
  /// Starts listening on `listen` ("0.0.0.0:9090", or "[::]:9090" for IPv6
  /// and IPv4 clients); nullptr and
  /// `error` (e.g. "cannot bind 127.0.0.1:9090: Address already in use")
  /// when it cannot.
  static std::unique_ptr<http_server> start(const std::string& listen,
                                            std::shared_ptr<const stats_collector> collector,
                                            health_state& health, std::string& error,
                                            std::shared_ptr<http_control_plane> control = {});
  /// Stops both threads and closes every connection.
  ~http_server();

  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  /// The port actually listened on.
  int port() const {
    return port_;
  }

private:
  using clock = std::chrono::steady_clock;
  struct connection;

  /// Why the server closed a connection or refused a request (stats, log).
  enum class closed_reason { head_timeout, write_timeout, evicted, bad_request, count };
  /// The status codes this server answers with, in kvsidecar_http_requests_total.
  static constexpr std::array<int, 12> answered_codes{200, 400, 401, 404, 405, 413,
                                                       422, 431, 500, 501, 503, 504};

  /// Rate-limited log of one closed_reason (the loop thread's only).
  struct reason_log {
    uint64_t since_line = 0;
    std::optional<clock::time_point> last_line;
  };

  http_server(std::shared_ptr<const stats_collector> collector, health_state& health,
              std::shared_ptr<http_control_plane> control)
    : collector_(std::move(collector)), health_(health), control_(std::move(control)) {}

  // The loop thread.
  void run();
  void accept_all(std::vector<std::unique_ptr<connection>>& conns);
  void on_readable(connection& c);
  void on_writable(connection& c);
  void route(connection& c, std::string_view method, std::string_view path,
             std::string_view query, std::string_view body, std::string_view authorization,
             std::string_view api_key);
  void respond(connection& c, int status, const char* reason, const char* type,
               const std::string& body);
  void respond(connection& c, const http_answer& a);
  void take_scrapes(std::vector<std::unique_ptr<connection>>& conns);

  /// Counts and (rate-limited) logs why `c` is closed; `detail`: a bad
  /// request's reason.
  void closed(connection& c, closed_reason why, const char* detail = "");

  // The scrape thread.
  void scrape_loop();
  // The admin thread.
  void admin_loop();
  /// This server's own counters, for /metrics.
  stats_snapshot snapshot() const;

  std::shared_ptr<const stats_collector> collector_;
  health_state& health_;
  std::shared_ptr<http_control_plane> control_; ///< null: only /metrics and the probes
  int listen_fd_ = -1;
  int wake_fd_ = -1; ///< eventfd: stop, or scrapes done
  int port_ = 0;
  uint64_t next_id_ = 1;
  std::string label_; ///< "http[0.0.0.0:9090]#0", in log lines
  std::array<reason_log, static_cast<size_t>(closed_reason::count)> reason_logs_{};
  // Written by the loop thread, read by scrapes.
  std::array<std::atomic<uint64_t>, answered_codes.size()> answered_{};
  std::array<std::atomic<uint64_t>, static_cast<size_t>(closed_reason::count)> closed_{};
  std::atomic<uint64_t> open_connections_{0};
  std::optional<clock::time_point> accept_paused_until_; ///< out of descriptors: rest

  std::mutex mu_; ///< guards everything below
  std::condition_variable scrape_cv_;
  bool stopping_ = false;
  std::deque<uint64_t> scrape_queue_;                       ///< connection ids
  std::vector<std::pair<uint64_t, std::string>> scraped_;   ///< id, text body
  std::condition_variable admin_cv_;
  std::deque<std::pair<uint64_t, http_control_plane::deferred>> admin_queue_; ///< at most one per connection
  std::vector<std::pair<uint64_t, http_answer>> admin_done_;

  std::thread loop_;
  std::thread scraper_;
  std::thread admin_thread_;
};

} // namespace kvs
