#include "app/http_client.hpp"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace kvs {

namespace {

using clock = std::chrono::steady_clock;

struct fd_guard {
  int fd = -1;
  ~fd_guard() {
    if (fd >= 0)
      ::close(fd);
  }
};

int left_ms(clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
  return ms > 0 ? static_cast<int>(ms) : 0;
}

/// Waits for `events` on fd until the deadline; false on timeout.
bool wait_for(int fd, short events, clock::time_point deadline) {
  pollfd p{fd, events, 0};
  for (;;) {
    int n = ::poll(&p, 1, left_ms(deadline));
    if (n < 0 && errno == EINTR)
      continue;
    return n > 0;
  }
}

} // namespace

expected<http_reply> http_call(const std::string& base_url, std::string_view method,
                               const std::string& path, const std::string& body,
                               std::chrono::milliseconds timeout) {
  auto where = std::string{method} + " " + base_url + path;
  if (base_url.rfind("http://", 0) != 0)
    return make_error("coordinator", where + ": only http:// URLs are supported");
  auto hostport = base_url.substr(7);
  if (auto slash = hostport.find('/'); slash != std::string::npos)
    hostport.resize(slash);
  std::string host = hostport, port = "80";
  if (auto colon = hostport.rfind(':'); colon != std::string::npos && hostport.back() != ']') {
    host = hostport.substr(0, colon);
    port = hostport.substr(colon + 1);
  }
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  auto deadline = clock::now() + timeout;

  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int e = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); e != 0)
    return make_error("coordinator", where + ": cannot resolve \"" + host + "\": " + gai_strerror(e));
  fd_guard s;
  std::string why = "no address";
  for (auto* a = res; a; a = a->ai_next) {
    fd_guard c{::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol)};
    if (c.fd < 0)
      continue;
    if (::connect(c.fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      why = std::strerror(errno);
      continue;
    }
    if (!wait_for(c.fd, POLLOUT, deadline)) {
      why = "connect timed out";
      continue;
    }
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      why = std::strerror(err);
      continue;
    }
    s.fd = c.fd;
    c.fd = -1;
    break;
  }
  ::freeaddrinfo(res);
  if (s.fd < 0)
    return make_error("coordinator", where + ": cannot connect: " + why);

  std::string req = std::string{method} + " " + path + " HTTP/1.1\r\nHost: " + hostport
                    + "\r\nAccept: application/json\r\nConnection: close\r\n";
  if (!body.empty())
    req += "Content-Type: application/json\r\n";
  req += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  for (size_t sent = 0; sent < req.size();) {
    if (!wait_for(s.fd, POLLOUT, deadline))
      return make_error("coordinator", where + ": sending timed out");
    auto n = ::send(s.fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (n < 0)
      return make_error("coordinator", where + ": send: " + std::strerror(errno));
    sent += static_cast<size_t>(n);
  }
  std::string in;
  char buf[16384];
  for (;;) {
    if (!wait_for(s.fd, POLLIN, deadline))
      return make_error("coordinator", where + ": no whole answer within "
                                         + std::to_string(timeout.count()) + " ms");
    auto n = ::recv(s.fd, buf, sizeof buf, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (n < 0)
      return make_error("coordinator", where + ": recv: " + std::strerror(errno));
    if (n == 0)
      break;
    in.append(buf, static_cast<size_t>(n));
    if (in.size() > http_client_max_answer)
      return make_error("coordinator", where + ": answer larger than "
                                         + std::to_string(http_client_max_answer) + " bytes");
  }
  // "HTTP/1.1 200 OK\r\n" ... "\r\n\r\n" body
  auto head_end = in.find("\r\n\r\n");
  if (in.rfind("HTTP/1.", 0) != 0 || in.size() < 12 || head_end == std::string::npos)
    return make_error("coordinator", where + ": not an HTTP answer (" + std::to_string(in.size())
                                       + " bytes)");
  http_reply r;
  for (size_t i = 9; i < 12; ++i) {
    if (in[i] < '0' || in[i] > '9')
      return make_error("coordinator", where + ": malformed status line");
    r.status = r.status * 10 + (in[i] - '0');
  }
  std::string head = in.substr(0, head_end);
  for (auto& ch : head)
    ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (head.find("transfer-encoding: chunked") != std::string::npos)
    return make_error("coordinator", where + ": chunked answers are not supported");
  r.body = in.substr(head_end + 4);
  return r;
}

std::string printable_excerpt(std::string_view body) {
  constexpr size_t most = 120;
  std::string out;
  for (size_t i = 0; i < body.size() && i < most; ++i) {
    auto ch = static_cast<unsigned char>(body[i]);
    out += ch >= 0x20 && ch < 0x7f ? static_cast<char>(ch) : '?';
  }
  if (body.size() > most)
    out += "... (" + std::to_string(body.size()) + " bytes)";
  return out.empty() ? "(empty body)" : out;
}

} // namespace kvs
