// http_server: /metrics, /healthz and /readyz on [http] listen.
//
// civetweb (Debian's libcivetweb, the server prometheus-cpp's exposer is
// built on) runs its own few threads; the handlers read the health atomics
// and, for /metrics, the collector. Nothing here runs on an actor's thread.
//   GET /metrics  Prometheus text format (prometheus-cpp's TextSerializer)
//   GET /healthz  200 "ok" while the process and its long-lived actors live
//   GET /readyz   200 "ready" once start-up is done; 503 during start-up and drain
#pragma once

#include "metrics/health.hpp"
#include "metrics/collector.hpp"

#include <memory>
#include <string>

struct mg_context;
struct mg_connection;

namespace kvs {

class http_server {
public:
  /// Starts listening on `listen` ("0.0.0.0:9090"); nullptr and `error`
  /// (e.g. the port is in use) when it cannot.
  static std::unique_ptr<http_server> start(const std::string& listen,
                                            std::shared_ptr<const stats_collector> collector,
                                            health_state& health, std::string& error);
  /// Stops the server; waits for requests in progress.
  ~http_server();

  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  /// The port actually listened on.
  int port() const {
    return port_;
  }

private:
  http_server(std::shared_ptr<const stats_collector> collector, health_state& health)
    : collector_(std::move(collector)), health_(health) {}

  /// Every request: routes /metrics, /healthz, /readyz; 404 otherwise.
  static int on_request(::mg_connection* conn);
  static int on_metrics(::mg_connection* conn, void* self);
  static int on_healthz(::mg_connection* conn, void* self);
  static int on_readyz(::mg_connection* conn, void* self);

  /// Connects to the listener once (see the destructor).
  void wake_listener() const;

  std::shared_ptr<const stats_collector> collector_;
  health_state& health_;
  mg_context* ctx_ = nullptr;
  std::string host_;
  int port_ = 0;
};

} // namespace kvs
