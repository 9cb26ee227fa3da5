#include "metrics/http_server.hpp"

#include <civetweb.h>
#include <prometheus/text_serializer.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <sstream>
#include <string_view>
#include <thread>

namespace kvs {

namespace {

/// Writes a whole response; `head` answers HEAD requests without the body.
void reply(mg_connection* conn, int status, const char* reason, const char* type,
           const std::string& body) {
  bool head = std::strcmp(mg_get_request_info(conn)->request_method, "HEAD") == 0;
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n",
            status, reason, type, body.size());
  if (!head)
    mg_write(conn, body.data(), body.size());
}

/// Only GET and HEAD are served; anything else gets 405.
bool method_ok(mg_connection* conn) {
  const char* m = mg_get_request_info(conn)->request_method;
  if (std::strcmp(m, "GET") == 0 || std::strcmp(m, "HEAD") == 0)
    return true;
  reply(conn, 405, "Method Not Allowed", "text/plain", "only GET and HEAD\n");
  return false;
}

/// civetweb's own messages while it starts, on the starting thread: its
/// error text says only "Failed to setup server ports", these say why
/// ("cannot bind to 0.0.0.0:9090: 98 (Address already in use)").
thread_local std::string start_messages;

int on_log(const mg_connection*, const char* message) {
  if (start_messages.size() < 1024)
    start_messages += (start_messages.empty() ? "" : "; ") + std::string{message};
  return 1; // handled: civetweb does not print it to stderr itself
}

} // namespace

std::unique_ptr<http_server> http_server::start(const std::string& listen,
                                                std::shared_ptr<const stats_collector> collector,
                                                health_state& health, std::string& error) {
  std::unique_ptr<http_server> s{new http_server(std::move(collector), health)};
  // Four threads: a slow scrape (up to the collector's timeout) never holds
  // up the probes.
  const char* options[] = {"listening_ports", listen.c_str(), "num_threads", "4",
                           "request_timeout_ms", "10000", "enable_keep_alive", "no",
                           nullptr};
  mg_callbacks callbacks{};
  callbacks.log_message = on_log;
  // Routed from begin_request, which is set before the server listens:
  // mg_set_request_handler can only run after mg_start2 has started serving,
  // and a probe in between got civetweb's own 404 (seen in CI).
  callbacks.begin_request = on_request;
  mg_init_data init{};
  init.callbacks = &callbacks;
  init.user_data = s.get();
  init.configuration_options = options;
  char text[256] = {0};
  unsigned code = 0;
  mg_error_data err{};
  err.code = &code;
  err.text = text;
  err.text_buffer_size = sizeof(text);
  start_messages.clear();
  s->ctx_ = mg_start2(&init, &err);
  if (!s->ctx_) {
    error = text[0] ? text : "the HTTP server did not start";
    if (!start_messages.empty())
      error += " (" + start_messages + ")";
    return nullptr;
  }
  mg_server_port ports[1];
  if (mg_get_server_ports(s->ctx_, 1, ports) > 0)
    s->port_ = ports[0].port;
  s->host_ = listen.substr(0, listen.rfind(':')); // IPv4 (config checked the form)
  return s;
}

http_server::~http_server() {
  if (!ctx_)
    return;
  // civetweb's listener thread notices the stop flag only when its poll
  // returns, after up to a second; a connection of our own wakes it at once,
  // so shutdown does not wait for the quantum.
  std::atomic<bool> stopped{false};
  std::thread stopper{[&] {
    mg_stop(ctx_);
    stopped.store(true);
  }};
  while (!stopped.load()) {
    wake_listener();
    std::this_thread::sleep_for(std::chrono::milliseconds{5});
  }
  stopper.join();
}

void http_server::wake_listener() const {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port_));
  auto h = host_ == "0.0.0.0" ? std::string{"127.0.0.1"} : host_;
  if (::inet_pton(AF_INET, h.c_str(), &a.sin_addr) == 1)
    ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::close(fd);
}

int http_server::on_request(mg_connection* conn) {
  void* self = mg_get_user_data(mg_get_context(conn));
  const char* uri = mg_get_request_info(conn)->local_uri;
  std::string_view path = uri ? uri : "";
  if (path == "/metrics")
    return on_metrics(conn, self);
  if (path == "/healthz")
    return on_healthz(conn, self);
  if (path == "/readyz")
    return on_readyz(conn, self);
  reply(conn, 404, "Not Found", "text/plain", "not found: serving /metrics, /healthz, /readyz\n");
  return 404;
}

int http_server::on_metrics(mg_connection* conn, void* self) {
  if (!method_ok(conn))
    return 405;
  auto* s = static_cast<http_server*>(self);
  std::ostringstream out;
  prometheus::TextSerializer{}.Serialize(out, s->collector_->Collect());
  reply(conn, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", out.str());
  return 200;
}

int http_server::on_healthz(mg_connection* conn, void* self) {
  if (!method_ok(conn))
    return 405;
  auto& h = static_cast<http_server*>(self)->health_;
  if (h.alive.load())
    reply(conn, 200, "OK", "text/plain", "ok\n");
  else
    reply(conn, 503, "Service Unavailable", "text/plain", "an actor died: see the log\n");
  return h.alive.load() ? 200 : 503;
}

int http_server::on_readyz(mg_connection* conn, void* self) {
  if (!method_ok(conn))
    return 405;
  auto& h = static_cast<http_server*>(self)->health_;
  if (h.draining.load()) {
    reply(conn, 503, "Service Unavailable", "text/plain", "draining\n");
    return 503;
  }
  if (!h.ready.load() || !h.alive.load()) {
    reply(conn, 503, "Service Unavailable", "text/plain",
          h.alive.load() ? "starting\n" : "an actor died: see the log\n");
    return 503;
  }
  reply(conn, 200, "OK", "text/plain", "ready\n");
  return 200;
}

} // namespace kvs
