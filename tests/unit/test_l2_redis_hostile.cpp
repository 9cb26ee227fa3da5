// The Redis client against a hostile or broken server: a fake one on a
// loopback socket that answers garbage, announces an oversize value, closes
// mid-reply, never answers, or sends more than was asked (and, for a
// cluster, answers CLUSTER SLOTS with garbage or silence). Each must end as
// a miss (or a failed SET) within the timeout, with last_error() naming the
// endpoint and what was wrong, and the client must work again once the
// server behaves. Plus resp_reader on random byte streams (run under ASan).
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "l2/redis_client.hpp"
#include "l2/resp_wire.hpp"

using namespace kvs;
using namespace std::chrono_literals;

namespace {

/// Waits up to `ms` for fd to be readable.
bool readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) > 0;
}

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    auto n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0)
      return; // the client hung up: fine for these tests
    off += static_cast<size_t>(n);
  }
}

/// A fake Redis on 127.0.0.1: connection k (0, 1, ...) is handled by
/// script(k, fd) on the server thread, which reads the request first.
struct fake_redis {
  using script_fn = std::function<void(int conn, int fd, const std::atomic<bool>& stop)>;
  int listen_fd = -1;
  int port = 0;
  std::atomic<bool> stop{false};
  std::atomic<int> accepted{0};
  std::thread th;

  explicit fake_redis(script_fn script) {
    listen_fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listen_fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listen_fd, 8) == 0);
    socklen_t len = sizeof a;
    ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    th = std::thread([this, script] {
      while (!stop) {
        if (!readable(listen_fd, 20))
          continue;
        int fd = ::accept(listen_fd, nullptr, nullptr);
        if (fd < 0)
          continue;
        script(accepted++, fd, stop);
        ::close(fd);
      }
    });
  }
  ~fake_redis() {
    stop = true;
    th.join();
    ::close(listen_fd);
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port); }
};

/// Reads what the client sent (its whole pipeline is written before it
/// reads a reply); empty when nothing came within 2 s.
std::string read_request(int fd) {
  std::string got;
  char buf[65536];
  while (readable(fd, got.empty() ? 2000 : 20)) {
    auto n = ::read(fd, buf, sizeof buf);
    if (n <= 0)
      break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

/// Holds the connection open, saying nothing, until the client hangs up
/// (or the test ends); what the client sends is read and ignored.
void hang(int fd, const std::atomic<bool>& stop) {
  char buf[65536];
  while (!stop)
    if (readable(fd, 20) && ::read(fd, buf, sizeof buf) <= 0)
      return;
}

/// A script that answers the first request with `reply` and then behaves
/// like a healthy server holding key "k" = "v" (every GET a hit, every SET
/// OK), so recovery can be checked.
fake_redis::script_fn first_reply(std::string reply, bool then_close) {
  return [reply, then_close](int conn, int fd, const std::atomic<bool>& stop) {
    if (conn == 0) {
      read_request(fd);
      write_all(fd, reply);
      if (!then_close)
        hang(fd, stop);
      return;
    }
    while (!stop) {
      if (!readable(fd, 20))
        continue;
      auto req = read_request(fd);
      if (req.empty())
        return;
      std::string out;
      for (size_t at = 0; (at = req.find("*", at)) != std::string::npos; ++at) {
        if (req.compare(at, 13, "*2\r\n$3\r\nGET\r\n") == 0)
          out += "$1\r\nv\r\n";
        else if (req.compare(at, 13, "*3\r\n$3\r\nSET\r\n") == 0)
          out += "+OK\r\n";
      }
      write_all(fd, out);
    }
  };
}

redis_options options_for(const fake_redis& srv) {
  redis_options o;
  o.endpoints = {srv.endpoint()};
  o.timeout = 1000ms; // generous: the fake's thread may be slow on a busy machine
  o.retry_after = 10ms;
  return o;
}

/// One GET of "k" against a server whose first connection answers `reply`:
/// it must be a miss, fast, with an error naming the endpoint and `expect`;
/// the next GET (a new connection) must be a hit.
void hostile_get(const std::string& reply, const std::string& expect, bool then_close = false,
                 size_t max_value = size_t{512} << 20) {
  CAPTURE(reply.substr(0, 60));
  fake_redis srv(first_reply(reply, then_close));
  auto o = options_for(srv);
  o.max_value_bytes = max_value;
  redis_client c(o);
  auto t0 = std::chrono::steady_clock::now();
  auto got = c.get({"k"});
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
  REQUIRE(got.size() == 1);
  CHECK_FALSE(got[0]);
  CHECK(c.stats().errors == 1);
  CHECK(c.last_error().find(srv.endpoint() + ": read: ") == 0);
  CHECK_MESSAGE(c.last_error().find(expect) != std::string::npos, c.last_error());
  // It heals: after retry_after, a new connection to the same server.
  auto deadline = std::chrono::steady_clock::now() + 3s;
  std::optional<std::string> again;
  while (!again && std::chrono::steady_clock::now() < deadline)
    again = c.get({"k"})[0];
  CHECK(again == std::string("v"));
  CHECK(c.stats().connects == 2);
}

} // namespace

TEST_CASE("hostile Redis: garbage, oversize, truncated, silent replies are misses that say why") {
  SUBCASE("garbage instead of a reply") {
    hostile_get("hello world\r\n", "unexpected reply type byte 'h' (0x68) in 'hello world'");
  }
  SUBCASE("an array where a GET reply was expected") {
    hostile_get("*1\r\n$1\r\nv\r\n", "unexpected reply type byte '*'");
  }
  SUBCASE("a binary byte") {
    hostile_get(std::string("\x01\xff\r\n", 4), "unexpected reply type byte 0x01");
  }
  SUBCASE("oversize bulk length") {
    hostile_get("$1073741824\r\n", "bulk length 1073741824 over the limit of 1048576 bytes",
                false, 1 << 20);
  }
  SUBCASE("bulk length beyond Redis's own limit (the default)") {
    hostile_get("$99999999999999999\r\n",
                "bulk length 99999999999999999 over the limit of 536870912 bytes");
  }
  SUBCASE("bulk length that overflows") {
    hostile_get("$999999999999999999999999\r\n", "bulk length '$999999999999999999999999' is not a length");
  }
  SUBCASE("negative bulk length other than -1") {
    hostile_get("$-5\r\n", "bulk length '$-5' is not a length");
  }
  SUBCASE("bulk length that is not a number") {
    hostile_get("$12ab\r\n", "bulk length '$12ab' is not a length");
  }
  SUBCASE("a bulk not followed by CRLF") {
    hostile_get("$3\r\nabcXY", "bulk reply of 3 bytes followed by 'X' (0x58) instead of CRLF");
  }
  SUBCASE("the server closes mid-bulk") {
    hostile_get("$1000\r\nabc", "server closed the connection after 3 of 1000 bytes of a bulk reply",
                true);
  }
  SUBCASE("the server closes mid-line") {
    hostile_get("$10", "server closed the connection in the middle of a reply line", true);
  }
  SUBCASE("the server never replies") {
    hostile_get("", "no data within 1000 ms waiting for a reply");
  }
  SUBCASE("the server stops in the middle of a large value") {
    hostile_get("$5000000\r\n" + std::string(100000, 'x'),
                "no data within 1000 ms after 100000 of 5000000 bytes of a bulk reply");
  }
  SUBCASE("a reply line that never ends") {
    hostile_get("+" + std::string(70000, 'a'), "reply line longer than 65536 bytes without CRLF");
  }
  SUBCASE("an empty line") {
    hostile_get("\r\n", "empty reply line");
  }
}

TEST_CASE("hostile Redis: a non-numeric integer reply to EXISTS") {
  fake_redis srv(first_reply(":abc\r\n", false));
  redis_client c(options_for(srv));
  CHECK(c.exists({"k"}) == std::vector<bool>{false});
  CHECK(c.last_error() == srv.endpoint() + ": read: integer reply ':abc' is not a number");
}

TEST_CASE("hostile Redis: replies nobody asked for drop the connection, the answers read stay") {
  fake_redis srv(first_reply("$1\r\nv\r\n+surprise\r\n", false));
  redis_client c(options_for(srv));
  CHECK(c.get({"k"})[0] == std::string("v"));
  CHECK(c.last_error().find("bytes nobody asked for after the last reply") != std::string::npos);
  auto deadline = std::chrono::steady_clock::now() + 3s;
  std::optional<std::string> again;
  while (!again && std::chrono::steady_clock::now() < deadline)
    again = c.get({"k"})[0];
  CHECK(again == std::string("v"));
  CHECK(c.stats().connects == 2); // the out-of-step connection was not reused
}

TEST_CASE("hostile Redis: a server that resets the connection while we send a large SET") {
  // Connection 0 is reset once the request starts arriving (SO_LINGER 0:
  // RST), so the rest of our send fails (ECONNRESET; resp_writer sends
  // with MSG_NOSIGNAL so an EPIPE could not raise SIGPIPE either).
  fake_redis srv([](int conn, int fd, const std::atomic<bool>& stop) {
    if (conn == 0) {
      readable(fd, 2000);
      linger l{1, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
      return;
    }
    first_reply("", false)(1, fd, stop);
  });
  redis_client c(options_for(srv));
  std::string big(8 << 20, 'x');
  std::vector<std::string> keys = {"a", "b"};
  CHECK(c.set(keys, {big, big}) == std::vector<bool>{false, false});
  CHECK_MESSAGE(c.last_error().find(srv.endpoint() + ": write: ") == 0, c.last_error());
  CHECK(c.stats().errors == 2);
  auto deadline = std::chrono::steady_clock::now() + 3s;
  bool ok = false;
  while (!ok && std::chrono::steady_clock::now() < deadline)
    ok = c.set({"k"}, {std::string_view("v")})[0];
  CHECK(ok);
}

TEST_CASE("hostile Redis: a cluster seed answering CLUSTER SLOTS with garbage or silence") {
  // CLUSTER SLOTS goes through hiredis (not resp_wire): it must end too.
  std::string reply, expect;
  SUBCASE("garbage") {
    reply = "hello\r\n";
    expect = "CLUSTER SLOTS: Protocol error, got \"h\" as reply type byte";
  }
  SUBCASE("an array of nonsense") {
    // Its malformed ranges are skipped (no slot known: the seed is asked),
    // and the GET then waits for a reply the fake never sends.
    reply = "*2\r\n:1\r\n*1\r\n$1\r\nx\r\n";
    expect = "read: no data within 1000 ms waiting for a reply";
  }
  SUBCASE("silence") {
    reply = "";
    expect = "CLUSTER SLOTS: no reply within 1000 ms";
  }
  CAPTURE(reply);
  fake_redis srv(first_reply(reply, false));
  auto o = options_for(srv);
  o.cluster = true;
  redis_client c(o);
  auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(c.get({"k"})[0]);
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
  CHECK(c.stats().get_hits == 0);
  CHECK(c.last_error() == srv.endpoint() + ": " + expect);
}

TEST_CASE("resp_reader: random byte streams end in replies or a named error, never a crash") {
  const std::vector<std::string> tokens = {
    "+OK\r\n", "-ERR no\r\n", ":12\r\n", ":-3\r\n", "$5\r\nhello\r\n", "$-1\r\n", "$0\r\n\r\n",
    "$3\r\nab", "\r\n", "$", "*2\r\n", ":x\r\n", "$-7\r\n", "$999999999999\r\n", "\r", "\n",
    std::string("\0\xff", 2), "$20000\r\n" + std::string(20000, 'z') + "\r\n"};
  std::mt19937 rng(12345);
  resp_reader r(1 << 20, 100ms);
  for (int iter = 0; iter < 300; ++iter) {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    timeval tv{0, 100000};
    ::setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string stream;
    for (int t = 0, n = static_cast<int>(rng() % 12); t < n; ++t) {
      if (rng() % 4 == 0) { // random bytes
        for (int b = 0, m = static_cast<int>(rng() % 16); b < m; ++b)
          stream += static_cast<char>(rng());
      } else {
        stream += tokens[rng() % tokens.size()];
      }
    }
    write_all(sv[1], stream);
    ::close(sv[1]); // EOF after the stream: every read ends
    r.clear();
    resp_reply rep;
    size_t replies = 0;
    status got;
    while ((got = r.next(sv[0], rep)))
      ++replies;
    CHECK(!got.error_value().detail.empty());
    CHECK(replies <= stream.size() / 3); // the shortest reply is 3 bytes
    ::close(sv[0]);
  }
}
