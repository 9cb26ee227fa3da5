// /metrics, /healthz, /readyz without the rest of the sidecar: the families
// built from snapshots (text format, byte for byte), the collector's
// fan-out with a timeout (an actor that stops answering keeps its last
// values and is counted), and the probes' answers for each health state.
#include "metrics/collector.hpp"
#include "metrics/families.hpp"
#include "admin/admin_plane.hpp"
#include "http/http_server.hpp"
#include "messages/type_ids.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <caf/send.hpp>
#include <doctest/doctest.h>
#include <prometheus/text_serializer.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

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

/// A connected TCP socket to 127.0.0.1:port.
int dial(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  return fd;
}

/// Whether the server closed `fd` (EOF or reset) within `within`.
bool closed_by_server(int fd, std::chrono::milliseconds within) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(within.count())) <= 0)
    return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

/// Sends `req` on a connected socket, reads until the server closes, closes.
std::string exchange(int fd, const std::string& req) {
  // Sent whole or in part: the server may answer and close before the end.
  [[maybe_unused]] auto sent = ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0)
    out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

/// One HTTP/1.0 request; the whole response (status line, headers, body).
std::string http(int port, const std::string& method, const std::string& path) {
  return exchange(dial(port), method + " " + path + " HTTP/1.0\r\n\r\n");
}

/// The value of the sample line that starts with `series` (-1 if none).
double sample(const std::string& text, const std::string& series) {
  auto at = text.find("\n" + series + " ");
  return at == std::string::npos ? -1 : std::stod(text.substr(at + series.size() + 2));
}

std::string status_line(const std::string& response) {
  return response.substr(0, response.find("\r\n"));
}

std::string body(const std::string& response) {
  auto at = response.find("\r\n\r\n");
  return at == std::string::npos ? std::string{} : response.substr(at + 4);
}

/// Answers `answers` scrapes with received_total = 1, 2, ..., then no more.
stats_client_actor::behavior_type fake_actor(stats_client_actor::pointer self, int answers) {
  auto n = std::make_shared<int>(0);
  return {[](stats_atom) {},
          [self, n, answers](metrics_atom, const caf::actor& to) {
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

/// A server on a free port with a collector that watches nothing.
struct served {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  std::shared_ptr<stats_collector> col =
    std::make_shared<stats_collector>(sys, std::chrono::milliseconds{50});
  health_state h;
  std::unique_ptr<http_server> srv;

  served() {
    std::string err;
    srv = http_server::start("127.0.0.1:" + std::to_string(free_port()), col, h, err);
    REQUIRE_MESSAGE(srv, err);
  }
};

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
  // Named by its label without the id: stable for dashboards and alerts.
  CHECK(second.find("kvsidecar_scrape_timeouts_total{actor=\"fake[dp=0]\"} 1\n")
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

TEST_CASE_FIXTURE(served, "server: clients holding half a request neither delay a probe nor keep their slot") {
  // More slow clients than the server keeps: each sends half a request and
  // waits (slowloris). One thread per connection would be exhausted here.
  const size_t held = http_max_connections + 44;
  std::vector<int> slow;
  for (size_t i = 0; i < held; ++i) {
    slow.push_back(dial(srv->port()));
    std::string half = "GET /healthz HTTP/1.1\r\nHost: x";
    REQUIRE(::write(slow.back(), half.data(), half.size()) == static_cast<ssize_t>(half.size()));
  }
  for (int k = 0; k < 5; ++k) {
    auto t0 = std::chrono::steady_clock::now();
    CHECK(status_line(http(srv->port(), "GET", "/healthz")) == "HTTP/1.1 200 OK");
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds{500});
  }
  CHECK(status_line(http(srv->port(), "GET", "/metrics")) == "HTTP/1.1 200 OK");
  // Past http_max_connections the oldest went for the newer ones: the first
  // ones connected are closed, the last ones still wait.
  CHECK(closed_by_server(slow.front(), std::chrono::milliseconds{2000}));
  CHECK_FALSE(closed_by_server(slow.back(), std::chrono::milliseconds{0}));
  // Within http_head_timeout (plus slack) every one of them is closed.
  auto deadline = std::chrono::steady_clock::now() + http_head_timeout + std::chrono::seconds{3};
  size_t closed = 0;
  for (int fd : slow) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
    closed += closed_by_server(fd, std::max(left, std::chrono::milliseconds{0})) ? 1 : 0;
    ::close(fd);
  }
  CHECK(closed == held);
  CHECK(status_line(http(srv->port(), "GET", "/readyz")) == "HTTP/1.1 503 Service Unavailable");
  // Each was closed once, for one of the two reasons, and counted.
  auto text = body(http(srv->port(), "GET", "/metrics"));
  auto evicted = sample(text, "kvsidecar_http_closed_total{reason=\"evicted\"}");
  auto timed_out = sample(text, "kvsidecar_http_closed_total{reason=\"head_timeout\"}");
  CHECK(evicted >= 44);
  CHECK(evicted + timed_out == static_cast<double>(held));
  CHECK(sample(text, "kvsidecar_http_requests_total{code=\"200\"}") >= 6);
  CHECK(sample(text, "kvsidecar_http_requests_total{code=\"503\"}") == 1);
}

TEST_CASE_FIXTURE(served, "server: garbage gets a 400 naming what was wrong, a huge head a 431") {
  auto send_raw = [&](const std::string& bytes) { return exchange(dial(srv->port()), bytes); };
  auto tls = send_raw(std::string("\x16\x03\x01\x02\x00\x01", 6));
  CHECK(status_line(tls) == "HTTP/1.1 400 Bad Request");
  CHECK(body(tls) == "malformed request line: method is not a token\n");
  auto huge = send_raw("GET /" + std::string(50000, 'a') + " HTTP/1.1\r\n\r\n");
  CHECK(status_line(huge) == "HTTP/1.1 431 Request Header Fields Too Large");
  // A POST with a body: the body is never read, yet the 405 arrives whole.
  auto post = send_raw("POST /metrics HTTP/1.1\r\nContent-Length: 5000\r\n\r\n"
                       + std::string(5000, 'x'));
  CHECK(status_line(post) == "HTTP/1.1 405 Method Not Allowed");
  CHECK(body(post) == "only GET and HEAD\n");
  auto text = body(http(srv->port(), "GET", "/metrics"));
  CHECK(sample(text, "kvsidecar_http_closed_total{reason=\"bad_request\"}") == 2);
  CHECK(sample(text, "kvsidecar_http_requests_total{code=\"400\"}") == 1);
  CHECK(sample(text, "kvsidecar_http_requests_total{code=\"431\"}") == 1);
  CHECK(sample(text, "kvsidecar_http_requests_total{code=\"405\"}") == 1);
  CHECK(status_line(http(srv->port(), "GET", "/healthz")) == "HTTP/1.1 200 OK");
}

namespace {

/// CPU time (clock ticks) of this process's thread named `name`; -1 if none.
long thread_ticks(const std::string& name) {
  for (const auto& t : std::filesystem::directory_iterator{"/proc/self/task"}) {
    std::ifstream comm{t.path() / "comm"};
    std::string n;
    std::getline(comm, n);
    if (n != name)
      continue;
    std::ifstream stat{t.path() / "stat"};
    std::string s{std::istreambuf_iterator<char>{stat}, {}};
    std::istringstream rest{s.substr(s.rfind(')') + 2)}; // fields from 3 on
    std::string f;
    long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> f; ++i) {
      if (i == 14)
        utime = std::stol(f);
      if (i == 15)
        stime = std::stol(f);
    }
    return utime + stime;
  }
  return -1;
}

} // namespace

TEST_CASE_FIXTURE(served, "server: out of descriptors, accepting rests instead of spinning") {
  // Client sockets first (connect needs no new descriptor), then a limit
  // that leaves the server none for accept4: EMFILE while they wait.
  std::vector<int> clients;
  for (int i = 0; i < 8; ++i)
    clients.push_back(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  // Reading /proc needs descriptors too: measured before and after.
  auto t0 = thread_ticks("http");
  REQUIRE(t0 >= 0);
  rlimit before{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &before) == 0);
  rlimit tight = before;
  tight.rlim_cur = static_cast<rlim_t>(*std::max_element(clients.begin(), clients.end()) + 1);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &tight) == 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(srv->port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int fd : clients)
    CHECK(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds{500});
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &before) == 0);
  auto spent = thread_ticks("http") - t0;
  // A spinning loop would have used ~50 ticks (10 ms each) in 500 ms.
  CHECK_MESSAGE(spent <= 5, "the http thread used " << spent << " ticks while out of descriptors");
  // With descriptors again, the waiting clients are served.
  for (int fd : clients)
    CHECK(status_line(exchange(fd, "GET /healthz HTTP/1.0\r\n\r\n")) == "HTTP/1.1 200 OK");
}

TEST_CASE("server: on [::] it answers IPv6 and IPv4 clients") {
  int probe6 = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe6 < 0) {
    MESSAGE("no IPv6 on this host: skipped");
    return;
  }
  ::close(probe6);
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto col = std::make_shared<stats_collector>(sys, std::chrono::milliseconds{50});
  health_state h;
  std::string err;
  auto srv = http_server::start("[::]:" + std::to_string(free_port()), col, h, err);
  REQUIRE_MESSAGE(srv, err);
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_port = htons(static_cast<uint16_t>(srv->port()));
  a.sin6_addr = in6addr_loopback;
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  CHECK(status_line(exchange(fd, "GET /healthz HTTP/1.0\r\n\r\n")) == "HTTP/1.1 200 OK");
  CHECK(status_line(http(srv->port(), "GET", "/healthz")) == "HTTP/1.1 200 OK");
}

TEST_CASE_FIXTURE(served, "server: scrapes in a loop make at most one collection per interval") {
  // A watched actor that counts the collections: its received_total is the
  // number of times it was asked.
  auto counter = sys.spawn(fake_actor, 1000000);
  col->watch({counter});
  auto collections = [&](const std::string& text) {
    return sample(text, "kvsidecar_events_received_total{dp_rank=\"0\"}");
  };
  // Four clients scraping back to back for ~1 s.
  std::atomic<int> scrapes{0};
  std::atomic<double> last_seen{0};
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (int k = 0; k < 4; ++k)
    clients.emplace_back([&] {
      while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds{1000}) {
        auto r = http(srv->port(), "GET", "/metrics");
        if (status_line(r) == "HTTP/1.1 200 OK") {
          ++scrapes;
          auto seen = collections(body(r));
          for (double cur = last_seen.load(); seen > cur && !last_seen.compare_exchange_weak(cur, seen);) {
          }
        }
      }
    });
  for (auto& c : clients)
    c.join();
  auto elapsed = std::chrono::steady_clock::now() - t0;
  auto limit = elapsed / http_min_scrape_interval + 2;
  CHECK(last_seen.load() >= 1);
  CHECK_MESSAGE(last_seen.load() <= static_cast<double>(limit),
                last_seen.load() << " collections in " << limit - 2 << " intervals");
  // Every scrape was answered, several of them from one collection.
  CHECK(scrapes.load() >= 2 * static_cast<int>(last_seen.load()));
  caf::anon_send_exit(counter, caf::exit_reason::user_shutdown);
}

namespace {

/// Echoes each call (op, and a quota_set's salt and limit) as JSON; blocks while `hold` is set.
struct echo_backend : admin_backend {
  std::atomic<bool> hold{false};
  std::atomic<int> calls{0};
  http_answer serve(const admin_call& c) override {
    ++calls;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds{5};
    while (hold.load() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds{5});
    // op: the call's type, by its index in admin_call (9: quota_set, 2: status).
    auto* q = std::get_if<admin_req::quota_set>(&c);
    return {200, "{\"op\":" + std::to_string(c.index()) + ",\"salt\":\""
                   + (q ? q->salt : std::string{}) + "\",\"bytes\":"
                   + std::to_string(q ? q->limit_bytes : 0) + "}"};
  }
};

/// A server on a free port with an echo_backend behind the control plane.
struct admin_served {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  std::shared_ptr<stats_collector> col =
    std::make_shared<stats_collector>(sys, std::chrono::milliseconds{50});
  health_state h;
  std::shared_ptr<echo_backend> backend = std::make_shared<echo_backend>();
  int port = free_port();
  std::unique_ptr<http_server> srv;

  explicit admin_served(admin_policy p) {
    std::string err;
    srv = http_server::start("127.0.0.1:" + std::to_string(port), col, h, err,
                             std::make_shared<admin_plane>(backend, std::move(p)));
    REQUIRE_MESSAGE(srv, err);
  }
};

} // namespace

TEST_CASE("server: control-plane calls get their body, off the loop thread") {
  admin_served a{admin_policy{}};
  auto& backend = a.backend;
  int port = a.port;

  // A body sent with its head, and one sent in three pieces after it.
  std::string body_text = "{\"limit_gb\": 2}";
  auto put = exchange(dial(port), "PUT /quota/tenant-a HTTP/1.1\r\nContent-Length: "
                                    + std::to_string(body_text.size()) + "\r\n\r\n" + body_text);
  CHECK(status_line(put) == "HTTP/1.1 200 OK");
  CHECK(body(put) == "{\"op\":9,\"salt\":\"tenant-a\",\"bytes\":2147483648}");
  int fd = dial(port);
  std::string head = "PUT /quota/b HTTP/1.1\r\ncontent-length: 17\r\n\r\n";
  REQUIRE(::send(fd, head.data(), head.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(head.size()));
  for (std::string piece : {"{\"limit_", "gb\": ", "0.5}"}) {
    std::this_thread::sleep_for(std::chrono::milliseconds{20});
    REQUIRE(::send(fd, piece.data(), piece.size(), MSG_NOSIGNAL) > 0);
  }
  CHECK(body(exchange(fd, "")) == "{\"op\":9,\"salt\":\"b\",\"bytes\":536870912}");
  // Validation answers come from the loop thread; the backend never sees them.
  int before = backend->calls.load();
  auto bad = exchange(dial(port), "PUT /quota/a@b HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}");
  CHECK(status_line(bad) == "HTTP/1.1 400 Bad Request");
  CHECK(body(bad).find("'@'") != std::string::npos);
  CHECK(status_line(http(port, "GET", "/run_script")) == "HTTP/1.1 501 Not Implemented");
  CHECK(status_line(http(port, "GET", "/nope")) == "HTTP/1.1 404 Not Found");
  CHECK(backend->calls.load() == before);
  // A body past the limit: 413 at once, nothing read.
  auto big = exchange(dial(port), "PUT /quota/t HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n{");
  CHECK(status_line(big) == "HTTP/1.1 413 Content Too Large");
  // A slow call holds neither the probes nor /metrics.
  backend->hold = true;
  int slow = dial(port);
  std::string get = "GET /status HTTP/1.0\r\n\r\n";
  REQUIRE(::send(slow, get.data(), get.size(), MSG_NOSIGNAL) > 0);
  auto t0 = std::chrono::steady_clock::now();
  CHECK(status_line(http(port, "GET", "/healthz")) == "HTTP/1.1 200 OK");
  CHECK(status_line(http(port, "GET", "/metrics")) == "HTTP/1.1 200 OK");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds{1000});
  backend->hold = false;
  CHECK(body(exchange(slow, "")).find("\"op\":2") != std::string::npos);
  // Counted by status.
  auto m = body(http(port, "GET", "/metrics"));
  CHECK(sample(m, "kvsidecar_http_requests_total{code=\"413\"}") == 1);
  CHECK(sample(m, "kvsidecar_http_requests_total{code=\"501\"}") == 1);
}

TEST_CASE("server: off loopback a state change without the bearer token is 401") {
  admin_served a{admin_policy{false, "0123456789abcdef", {}}};
  auto& backend = a.backend;
  int port = a.port;
  auto refused = exchange(dial(port), "POST /cache/clear HTTP/1.1\r\n\r\n");
  CHECK(status_line(refused) == "HTTP/1.1 401 Unauthorized");
  CHECK(backend->calls.load() == 0);
  auto ok = exchange(dial(port), "POST /cache/clear HTTP/1.1\r\nAuthorization: Bearer "
                                 "0123456789abcdef\r\n\r\n");
  CHECK(status_line(ok) == "HTTP/1.1 200 OK");
  CHECK(status_line(http(port, "GET", "/status")) == "HTTP/1.1 200 OK");
  CHECK(backend->calls.load() == 2);
}
