// http_call (the coordinator's client) against a one-shot local server that
// answers canned bytes: a good answer is read whole; every bad one (not
// HTTP, a bad status line, chunked, too large, none within the deadline,
// nobody listening) is an error naming what was wrong.
#include <doctest/doctest.h>

#include "app/http_client.hpp"
#include "app/peer_failure_log.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

using namespace kvs;
using namespace std::chrono_literals;

namespace {

/// Accepts one connection, reads the request head, answers `reply` (unless
/// `silent`), closes.
struct one_shot {
  int fd = -1;
  uint16_t port = 0;
  std::string request;
  std::thread t;
  one_shot(std::string reply, bool silent = false) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    ::listen(fd, 1);
    t = std::thread([this, reply = std::move(reply), silent] {
      int c = ::accept(fd, nullptr, nullptr);
      char buf[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        auto n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0)
          break;
        request.append(buf, static_cast<size_t>(n));
      }
      if (silent) {
        ::recv(c, buf, sizeof buf, 0); // until the client gives up
      } else {
        for (size_t at = 0; at < reply.size();) {
          auto n = ::send(c, reply.data() + at, reply.size() - at, MSG_NOSIGNAL);
          if (n <= 0)
            break;
          at += static_cast<size_t>(n);
        }
      }
      ::close(c);
    });
  }
  ~one_shot() {
    if (t.joinable())
      t.join();
    ::close(fd);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

std::string error_of(const expected<http_reply>& r) {
  REQUIRE_FALSE(r.has_value());
  return r.error_value().detail;
}

} // namespace

TEST_CASE("http_call: a good answer, and the request it sent") {
  one_shot s{"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n"
             "{\"a\": 1}\n"};
  auto r = http_call(s.url(), "POST", "/instances", "{\"ip\": \"x\"}", 2000ms);
  REQUIRE_MESSAGE(r.has_value(), r.error_value().detail);
  CHECK(r.value().status == 201);
  CHECK(r.value().body == "{\"a\": 1}\n");
  s.t.join(); // the request is complete once the server has answered
  CHECK(s.request.rfind("POST /instances HTTP/1.1\r\n", 0) == 0);
  CHECK(s.request.find("Content-Length: 11\r\n") != std::string::npos);
  CHECK(s.request.find("Connection: close\r\n") != std::string::npos);
}

TEST_CASE("http_call: every bad answer is an error naming it") {
  {
    one_shot s{"hello there, not HTTP at all\r\n\r\n"};
    CHECK(error_of(http_call(s.url(), "GET", "/x", {}, 2000ms)).find("not an HTTP answer")
          != std::string::npos);
  }
  {
    one_shot s{"HTTP/1.1 2x0 OK\r\n\r\n"};
    CHECK(error_of(http_call(s.url(), "GET", "/x", {}, 2000ms)).find("malformed status line")
          != std::string::npos);
  }
  {
    one_shot s{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"};
    CHECK(error_of(http_call(s.url(), "GET", "/x", {}, 2000ms)).find("chunked")
          != std::string::npos);
  }
  {
    one_shot s{"HTTP/1.1 200 OK\r\n\r\n" + std::string(http_client_max_answer + 10, 'x')};
    CHECK(error_of(http_call(s.url(), "GET", "/x", {}, 5000ms)).find("answer larger than")
          != std::string::npos);
  }
  {
    one_shot s{"", true};
    auto why = error_of(http_call(s.url(), "PUT", "/instances/a/heartbeat", {}, 300ms));
    CHECK(why.find("no whole answer within 300 ms") != std::string::npos);
    CHECK(why.find("PUT http://127.0.0.1:") == 0);
  }
  uint16_t closed_port = 0;
  {
    one_shot s{"HTTP/1.1 200 OK\r\n\r\n"};
    closed_port = s.port;
    CHECK(http_call(s.url(), "GET", "/", {}, 2000ms).has_value());
  }
  CHECK(error_of(http_call("http://127.0.0.1:" + std::to_string(closed_port), "GET", "/", {},
                           2000ms)).find("cannot connect") != std::string::npos);
  CHECK(error_of(http_call("https://127.0.0.1:1", "GET", "/", {}, 100ms)).find("only http://")
        != std::string::npos);
}

TEST_CASE("a garbage answer's excerpt is short and printable; its kind ignores what varies") {
  CHECK(printable_excerpt("") == "(empty body)");
  CHECK(printable_excerpt(std::string("{not\xff\0json", 10)) == "{not??json");
  auto big = printable_excerpt(std::string(5000, 'x'));
  CHECK(big == std::string(120, 'x') + "... (5000 bytes)");
  // The same failure with another byte count or body is the same kind.
  CHECK(failure_kind("POST http://h:1/x: not an HTTP answer (17 bytes)")
        == failure_kind("POST http://h:1/x: not an HTTP answer (4096 bytes)"));
  CHECK(failure_kind("PUT u: HTTP 503 -- <html>a") == failure_kind("PUT u: HTTP 503 -- {b"));
  CHECK(failure_kind("PUT u: HTTP 503 -- x") == "PUT u: HTTP #");
  peer_failure_log log;
  CHECK(log.failed("a: HTTP 500 -- one"));
  CHECK_FALSE(log.failed("a: HTTP 500 -- two"));
  CHECK(log.failed("a: no whole answer within 2000 ms"));
  CHECK(log.succeeded());
  CHECK_FALSE(log.succeeded());
  CHECK(log.failed("a: no whole answer within 2000 ms")); // again after a recovery
}
