// /metrics, /healthz, /readyz without the rest of the sidecar: the families
// built from snapshots (text format, byte for byte), the collector's
// fan-out with a timeout (an actor that stops answering keeps its last
// values and is counted), and the probes' answers for each health state.
#include "metrics/collector.hpp"
#include "metrics/families.hpp"
#include "metrics/http_server.hpp"
#include "messages/type_ids.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <doctest/doctest.h>
#include <prometheus/text_serializer.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sstream>

using namespace kvs;

namespace {

std::string text_of(const std::vector<stats_snapshot>& snaps) {
  std::ostringstream out;
  prometheus::TextSerializer{}.Serialize(out, to_families(snaps));
  return out.str();
}

/// A free port on 127.0.0.1 (bound and released).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

/// One HTTP/1.0 request; the whole response (status line, headers, body).
std::string http(int port, const std::string& method, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  auto req = method + " " + path + " HTTP/1.0\r\n\r\n";
  REQUIRE(::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0)
    out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

std::string status_line(const std::string& response) {
  return response.substr(0, response.find("\r\n"));
}

std::string body(const std::string& response) {
  auto at = response.find("\r\n\r\n");
  return at == std::string::npos ? std::string{} : response.substr(at + 4);
}

/// Answers `answers` scrapes with received_total = 1, 2, ..., then no more.
caf::behavior fake_actor(caf::event_based_actor* self, int answers) {
  auto n = std::make_shared<int>(0);
  return {[self, n, answers](metrics_atom, const caf::actor& to) {
    if (*n >= answers)
      return;
    ++*n;
    stats_snapshot s;
    s.actor = "fake[dp=0]#" + std::to_string(self->id());
    s.actor_id = self->id();
    s.labels = {{"dp_rank", "0"}};
    s.counter("received", "kvsidecar_events_received_total", *n);
    caf::anon_send(to, std::move(s));
  }};
}

} // namespace

TEST_CASE("snapshot: the stats line keeps the order, numbers print as integers") {
  stats_snapshot s;
  s.counter("received", "kvsidecar_events_received_total", 12)
    .gauge("", "kvsidecar_cache_l1_usage_ratio", 0.25)
    .log_only("big", 1e12)
    .log_text("seq", "3..5")
    .gauge("ratio", "", 0.5);
  CHECK(s.line() == "received=12 big=1000000000000 seq=3..5 ratio=0.5");
}

TEST_CASE("fixed_histogram: a value on a bound falls in that bucket (le)") {
  static const std::array<double, 3> bounds{1, 2, 5};
  fixed_histogram<3> h{&bounds};
  for (double v : {0.5, 1.0, 1.5, 2.0, 5.0, 7.0})
    h.observe(v);
  CHECK(h.counts == std::array<uint64_t, 4>{2, 2, 1, 1});
  CHECK(h.count == 6);
  CHECK(h.sum == doctest::Approx(17.0));
}

TEST_CASE("families: one per name, labels merged, histogram cumulative with +Inf") {
  static const std::array<double, 2> bounds{0.001, 0.01};
  fixed_histogram<2> lat{&bounds};
  lat.observe(0.0005);
  lat.observe(0.005);
  lat.observe(0.5); // sum 0.5055 is not exact in binary: the sum line is checked apart
  stats_snapshot a;
  a.labels = {{"dp_rank", "0"}};
  a.counter("bad_payloads", "kvsidecar_events_dropped_total", 2, "reason", "bad_payload")
    .counter("dropped_queue_full", "kvsidecar_events_dropped_total", 3, "reason", "queue_full")
    .log_only("caught_up", 9);
  stats_snapshot b;
  b.labels = {{"dp_rank", "1"}};
  b.counter("bad_payloads", "kvsidecar_events_dropped_total", 5, "reason", "bad_payload");
  stats_snapshot c;
  c.gauge("locks", "kvsidecar_cache_locks", 4)
    .histogram("kvsidecar_cache_request_duration_seconds", lat, "op", "lookup");
  stats_snapshot d;
  d.counter("", "kvsidecar_not_in_the_catalog_total", 1);
  auto text = text_of({a, b, c, d});
  CHECK(text.find("# TYPE kvsidecar_events_dropped_total counter\n"
                  "kvsidecar_events_dropped_total{dp_rank=\"0\",reason=\"bad_payload\"} 2\n"
                  "kvsidecar_events_dropped_total{dp_rank=\"0\",reason=\"queue_full\"} 3\n"
                  "kvsidecar_events_dropped_total{dp_rank=\"1\",reason=\"bad_payload\"} 5\n")
        != std::string::npos);
  CHECK(text.find("# TYPE kvsidecar_cache_locks gauge\nkvsidecar_cache_locks 4\n")
        != std::string::npos);
  CHECK(text.find("kvsidecar_cache_request_duration_seconds_count{op=\"lookup\"} 3\n"
                  "kvsidecar_cache_request_duration_seconds_sum{op=\"lookup\"} 0.505")
        != std::string::npos);
  CHECK(text.find("kvsidecar_cache_request_duration_seconds_bucket{op=\"lookup\",le=\"0.001\"} 1\n"
                  "kvsidecar_cache_request_duration_seconds_bucket{op=\"lookup\",le=\"0.01\"} 2\n"
                  "kvsidecar_cache_request_duration_seconds_bucket{op=\"lookup\",le=\"+Inf\"} 3\n")
        != std::string::npos);
  CHECK(text.find("caught_up") == std::string::npos);
  CHECK(text.find("# HELP kvsidecar_events_dropped_total Batches dropped") != std::string::npos);
  CHECK(text.find("# HELP kvsidecar_not_in_the_catalog_total (undocumented)") != std::string::npos);
}

TEST_CASE("collector: fresh answers, then the last one and a timeout count") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto answers_once = sys.spawn(fake_actor, 1);
  auto answers_always = sys.spawn(fake_actor, 1000);
  stats_collector col{sys, std::chrono::milliseconds{100}};
  col.watch({answers_once, answers_always});
  auto scrape = [&] {
    std::ostringstream out;
    prometheus::TextSerializer{}.Serialize(out, col.Collect());
    return out.str();
  };
  auto first = scrape();
  CHECK(first.find("kvsidecar_scrape_timeouts_total") == std::string::npos);
  auto second = scrape();
  // The silent one is exported with its last value (1); the other moved on.
  CHECK(second.find("kvsidecar_events_received_total{dp_rank=\"0\"} 1\n") != std::string::npos);
  CHECK(second.find("kvsidecar_events_received_total{dp_rank=\"0\"} 2\n") != std::string::npos);
  CHECK(second.find("kvsidecar_scrape_timeouts_total{actor=\"fake[dp=0]#"
                    + std::to_string(answers_once.id()) + "\"} 1\n")
        != std::string::npos);
  CHECK(second.find("kvsidecar_up 1\n") != std::string::npos);
  caf::anon_send_exit(answers_once, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(answers_always, caf::exit_reason::user_shutdown);
}

TEST_CASE("probes: /readyz follows starting, ready, draining; /healthz follows alive") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto col = std::make_shared<stats_collector>(sys, std::chrono::milliseconds{50});
  health_state h;
  int port = free_port();
  std::string err;
  auto srv = http_server::start("127.0.0.1:" + std::to_string(port), col, h, err);
  REQUIRE_MESSAGE(srv, err);
  CHECK(srv->port() == port);

  auto ready = http(port, "GET", "/readyz");
  CHECK(status_line(ready) == "HTTP/1.1 503 Service Unavailable");
  CHECK(body(ready) == "starting\n");
  CHECK(status_line(http(port, "GET", "/healthz")) == "HTTP/1.1 200 OK");
  h.ready = true;
  CHECK(body(http(port, "GET", "/readyz")) == "ready\n");
  CHECK(status_line(http(port, "HEAD", "/readyz")) == "HTTP/1.1 200 OK");
  CHECK(body(http(port, "HEAD", "/readyz")).empty());
  h.draining = true;
  ready = http(port, "GET", "/readyz");
  CHECK(status_line(ready) == "HTTP/1.1 503 Service Unavailable");
  CHECK(body(ready) == "draining\n");
  h.draining = false;
  h.alive = false;
  CHECK(status_line(http(port, "GET", "/healthz")) == "HTTP/1.1 503 Service Unavailable");
  CHECK(status_line(http(port, "GET", "/readyz")) == "HTTP/1.1 503 Service Unavailable");

  auto metrics = http(port, "GET", "/metrics");
  CHECK(status_line(metrics) == "HTTP/1.1 200 OK");
  CHECK(metrics.find("Content-Type: text/plain; version=0.0.4") != std::string::npos);
  CHECK(body(metrics).find("kvsidecar_up 1\n") != std::string::npos);
  CHECK(status_line(http(port, "POST", "/metrics")) == "HTTP/1.1 405 Method Not Allowed");
  CHECK(status_line(http(port, "GET", "/metrics/x")) == "HTTP/1.1 404 Not Found");
  CHECK(status_line(http(port, "GET", "/readyz?x=1")) == "HTTP/1.1 503 Service Unavailable");

  // A second server on the same port: refused, and the reason says why.
  std::string err2;
  auto again = http_server::start("127.0.0.1:" + std::to_string(port), col, h, err2);
  CHECK_FALSE(again);
  CHECK(err2.find("Address already in use") != std::string::npos);

  // Stopping is prompt (the listener is woken, not waited for).
  auto t0 = std::chrono::steady_clock::now();
  srv.reset();
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds{500});
}
