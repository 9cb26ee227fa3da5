#include "http/http_server.hpp"

#include "core/listen_address.hpp"
#include "log/log.hpp"
#include "metrics/families.hpp"
#include "http/http_request.hpp"

#include <prometheus/text_serializer.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <sstream>
#include <variant>

namespace kvs {

namespace {

/// After the answer is written, what the client still sends (a body we did
/// not read) is read and dropped for at most this long before closing:
/// closing with unread bytes would reset the connection, and the client
/// could lose the answer.
constexpr std::chrono::milliseconds drain_timeout{1000};
/// ... and at most this much of it.
constexpr size_t max_drained = 64 * 1024;
/// New connections taken per wake-up, so a connect flood cannot starve the
/// requests already read.
constexpr int max_accepts_per_wake = 64;
/// How long accepting rests after it failed for want of descriptors.
constexpr std::chrono::milliseconds accept_pause{100};

std::string errno_text(int e) {
  return std::strerror(e);
}

/// "10.1.2.3:41234" or "[fd00::5]:41234" of a connected socket ("?" if unknown).
std::string peer_of(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  char ip[INET6_ADDRSTRLEN] = "?";
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return "?";
  if (a.ss_family == AF_INET6) {
    auto& a6 = reinterpret_cast<sockaddr_in6&>(a);
    if (!::inet_ntop(AF_INET6, &a6.sin6_addr, ip, sizeof(ip)))
      return "?";
    return "[" + std::string{ip} + "]:" + std::to_string(ntohs(a6.sin6_port));
  }
  auto& a4 = reinterpret_cast<sockaddr_in&>(a);
  if (!::inet_ntop(AF_INET, &a4.sin_addr, ip, sizeof(ip)))
    return "?";
  return std::string{ip} + ":" + std::to_string(ntohs(a4.sin_port));
}

/// A closed_reason's log line is written at most this often.
constexpr std::chrono::minutes reason_log_interval{1};

} // namespace

struct http_server::connection {
  enum class phase {
    reading,  ///< waiting for the whole request head (and body)
    scraping, ///< /metrics or an admin call: waiting for its thread
    writing,  ///< sending the answer
    draining, ///< answer sent, write side shut: waiting for the client to close
  };

  explicit connection(int f, uint64_t i, clock::time_point now)
    : fd(f), id(i), accepted(now), deadline(now + http_head_timeout) {}
  ~connection() {
    if (fd >= 0)
      ::close(fd);
  }
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  void close() {
    if (fd >= 0)
      ::close(fd);
    fd = -1;
  }
  bool closed() const {
    return fd < 0;
  }

  int fd;
  uint64_t id;
  std::string peer; ///< the client's address, for log lines
  clock::time_point accepted;
  clock::time_point deadline;
  phase ph = phase::reading;
  std::string in;  ///< the request head so far (at most http_max_head bytes), then its body
  /// Once the head is read and announces a body: head + body bytes, and
  /// the head's parts (copied: `in` grows while the body arrives).
  size_t need = 0;
  size_t head_size = 0;
  std::string method, path, query, authorization, api_key;
  std::string out; ///< the answer
  size_t written = 0;
  size_t drained = 0;
  bool head = false; ///< a HEAD request: no body in the answer
};

std::unique_ptr<http_server> http_server::start(const std::string& listen,
                                                std::shared_ptr<const stats_collector> collector,
                                                health_state& health, std::string& error,
                                                std::shared_ptr<http_control_plane> control) {
  std::unique_ptr<http_server> s{
    new http_server(std::move(collector), health, std::move(control))};
  s->label_ = log::label("http", listen, 0);
  auto addr = parse_listen_address(listen); // the config checked it too
  if (!addr) {
    error = "expected " + addr.error_value().detail + ", got \"" + listen + "\"";
    return nullptr;
  }
  auto& a = addr->addr;
  bool v6 = addr->v6;
  s->listen_fd_ = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) {
    error = "cannot create a socket: " + errno_text(errno);
    return nullptr;
  }
  int one = 1, zero = 0;
  ::setsockopt(s->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  // [::] takes IPv4 clients too, whatever the host's net.ipv6.bindv6only.
  if (v6)
    ::setsockopt(s->listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  if (::bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&a), addr->len) != 0) {
    error = "cannot bind " + listen + ": " + errno_text(errno);
    return nullptr;
  }
  if (::listen(s->listen_fd_, SOMAXCONN) != 0) {
    error = "cannot listen on " + listen + ": " + errno_text(errno);
    return nullptr;
  }
  socklen_t len = sizeof(a);
  ::getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
  s->port_ = ntohs(v6 ? reinterpret_cast<sockaddr_in6&>(a).sin6_port
                      : reinterpret_cast<sockaddr_in&>(a).sin_port);
  s->wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s->wake_fd_ < 0) {
    error = "cannot create an eventfd: " + errno_text(errno);
    return nullptr;
  }
  s->loop_ = std::thread{[p = s.get()] { p->run(); }};
  s->scraper_ = std::thread{[p = s.get()] { p->scrape_loop(); }};
  // Named from here, so that they have their names once start() returns.
  ::pthread_setname_np(s->loop_.native_handle(), "http");
  ::pthread_setname_np(s->scraper_.native_handle(), "http-scrape");
  if (s->control_) {
    s->admin_thread_ = std::thread{[p = s.get()] { p->admin_loop(); }};
    ::pthread_setname_np(s->admin_thread_.native_handle(), "http-admin");
  }
  return s;
}

http_server::~http_server() {
  if (loop_.joinable() || scraper_.joinable() || admin_thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock{mu_};
      stopping_ = true;
    }
    scrape_cv_.notify_all();
    admin_cv_.notify_all();
    uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
    if (loop_.joinable())
      loop_.join();
    if (scraper_.joinable())
      scraper_.join();
    if (admin_thread_.joinable())
      admin_thread_.join();
  }
  if (listen_fd_ >= 0)
    ::close(listen_fd_);
  if (wake_fd_ >= 0)
    ::close(wake_fd_);
}

void http_server::run() {
  std::vector<std::unique_ptr<connection>> conns;
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    // While accepting fails for want of descriptors (or memory), the
    // listener is left alone for a moment: it stays readable, and polling it
    // would spin.
    bool paused = accept_paused_until_ && clock::now() < *accept_paused_until_;
    fds.push_back({listen_fd_, static_cast<short>(paused ? 0 : POLLIN), 0});
    std::optional<clock::time_point> next;
    if (paused)
      next = accept_paused_until_;
    for (auto& c : conns) {
      short ev = c->ph == connection::phase::writing    ? POLLOUT
                 : c->ph == connection::phase::scraping ? 0 // hang-ups are reported anyway
                                                        : POLLIN;
      fds.push_back({c->fd, ev, 0});
      if (c->ph != connection::phase::scraping && (!next || c->deadline < *next))
        next = c->deadline;
    }
    int timeout = -1;
    if (next) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(*next - clock::now()).count();
      timeout = static_cast<int>(std::clamp<long long>(left, 0, 60'000));
    }
    if (::poll(fds.data(), fds.size(), timeout) < 0) {
      // EINTR, or ENOMEM (the kernel's, passing): try again, without spinning.
      if (errno != EINTR)
        std::this_thread::sleep_for(std::chrono::milliseconds{10});
      continue;
    }
    if (fds[0].revents & POLLIN) {
      uint64_t n;
      [[maybe_unused]] auto r = ::read(wake_fd_, &n, sizeof(n));
      {
        std::lock_guard<std::mutex> lock{mu_};
        if (stopping_)
          break;
      }
      take_scrapes(conns);
    }
    for (size_t i = 0; i < conns.size(); ++i) {
      auto& c = *conns[i];
      short re = fds[i + 2].revents;
      if (c.closed() || re == 0)
        continue;
      if ((re & (POLLERR | POLLNVAL)) || ((re & POLLHUP) && !(re & POLLIN)))
        c.close();
      else if ((re & POLLIN)
               && (c.ph == connection::phase::reading || c.ph == connection::phase::draining))
        on_readable(c);
      else if ((re & POLLOUT) && c.ph == connection::phase::writing)
        on_writable(c);
    }
    auto now = clock::now();
    for (auto& c : conns) {
      if (c->closed() || c->ph == connection::phase::scraping || now < c->deadline)
        continue;
      // A request head or a reader too slow: the slot is needed. A client
      // that keeps its end open after the answer is closed without a word.
      if (c->ph == connection::phase::reading)
        closed(*c, closed_reason::head_timeout);
      else if (c->ph == connection::phase::writing)
        closed(*c, closed_reason::write_timeout);
      c->close();
    }
    conns.erase(std::remove_if(conns.begin(), conns.end(), [](auto& c) { return c->closed(); }),
                conns.end());
    if (fds[1].revents & POLLIN)
      accept_all(conns);
    open_connections_.store(conns.size(), std::memory_order_relaxed);
  }
  // conns close their sockets as they go.
}

void http_server::accept_all(std::vector<std::unique_ptr<connection>>& conns) {
  for (int k = 0; k < max_accepts_per_wake; ++k) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        accept_paused_until_ = clock::now() + accept_pause;
      return; // EAGAIN: none left; a connection reset before accept: the next one
    }
    if (conns.size() >= http_max_connections) {
      // The oldest goes: a probe is answered within milliseconds of its
      // connect, so what has been here longest is the least likely to be one.
      auto oldest = std::min_element(conns.begin(), conns.end(), [](auto& x, auto& y) {
        return x->accepted < y->accepted;
      });
      closed(**oldest, closed_reason::evicted);
      conns.erase(oldest);
    }
    conns.push_back(std::make_unique<connection>(fd, next_id_++, clock::now()));
    conns.back()->peer = peer_of(fd);
  }
}

void http_server::on_readable(connection& c) {
  char buf[4096];
  for (;;) {
    auto n = ::recv(c.fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (n <= 0) { // the client closed (or reset): nothing to answer
      c.close();
      return;
    }
    if (c.ph == connection::phase::draining) {
      c.drained += static_cast<size_t>(n);
      if (c.drained > max_drained)
        c.close();
      if (c.closed())
        return;
      continue;
    }
    std::string_view chunk{buf, static_cast<size_t>(n)};
    if (c.need > 0) { // the head is read: its body arrives
      c.in.append(chunk.substr(0, c.need - std::min(c.in.size(), c.need)));
      if (c.in.size() < c.need)
        continue;
      route(c, c.method, c.path, c.query, std::string_view{c.in}.substr(c.head_size),
            c.authorization, c.api_key);
      return;
    }
    bool first = c.in.empty();
    // Up to a head and a body: a body sent with its head in one segment is
    // kept; a head past http_max_head is judged (431) before more arrives.
    constexpr size_t most = http_max_head + http_max_body;
    c.in.append(chunk.substr(0, most - std::min(c.in.size(), most)));
    // The head can only end on a newline: parsed when one arrives (and on
    // the first bytes, so garbage is answered at once), not on every byte.
    if (!first && chunk.find('\n') == std::string_view::npos && c.in.size() <= http_max_head)
      continue;
    auto h = parse_http_head(c.in, http_max_head);
    if (h.st == http_head::state::incomplete)
      continue;
    if (h.st == http_head::state::bad) {
      closed(c, closed_reason::bad_request, h.why);
      respond(c, h.status, h.status == 431 ? "Request Header Fields Too Large" : "Bad Request",
              "text/plain", std::string{h.why} + "\n");
      return;
    }
    if (h.content_length > http_max_body) {
      closed(c, closed_reason::bad_request, "body too large");
      respond(c, http_error(413, "request body of " + std::to_string(h.content_length)
                                    + " bytes: at most " + std::to_string(http_max_body)));
      return;
    }
    if (h.content_length > 0) {
      // The body follows (maybe already in part): the head's parts are
      // kept, and the rest is read before routing.
      c.method = std::string{h.method};
      c.path = std::string{h.path};
      c.query = std::string{h.query};
      c.authorization = std::string{h.authorization};
      c.api_key = std::string{h.api_key};
      c.head_size = h.head_size;
      c.need = h.head_size + h.content_length;
      if (c.in.size() >= c.need) {
        c.in.resize(c.need);
        route(c, c.method, c.path, c.query, std::string_view{c.in}.substr(c.head_size),
              c.authorization, c.api_key);
        return;
      }
      continue;
    }
    route(c, h.method, h.path, h.query, {}, h.authorization, h.api_key);
    return;
  }
}

void http_server::route(connection& c, std::string_view method, std::string_view path,
                        std::string_view query, std::string_view body,
                        std::string_view authorization, std::string_view api_key) {
  c.head = method == "HEAD";
  // API keys (LMCache 0.5.7): before anything else, /metrics included.
  if (control_)
    if (auto deny = control_->admit(path, authorization, api_key)) {
      respond(c, *deny);
      return;
    }
  // LMCache takes the key in either header: X-LMCache-API-Key alone opens
  // what a bearer key opens (the state changes off loopback included).
  std::string key_as_bearer;
  if (authorization.empty() && !api_key.empty()) {
    key_as_bearer = "Bearer " + std::string{api_key};
    authorization = key_as_bearer;
  }
  bool known = path == "/metrics" || path == "/healthz" || path == "/readyz";
  if (!known && control_) {
    auto r = control_->route(method, path, query, body, authorization);
    if (auto* a = std::get_if<http_answer>(&r)) {
      respond(c, *a);
      return;
    }
    // The backend may wait for the actors: on the admin thread, never here.
    // Calls of connections closed meanwhile still run: the queue is bounded.
    {
      std::lock_guard<std::mutex> lock{mu_};
      if (admin_queue_.size() >= http_max_connections) {
        respond(c, http_error(503, "too many control-plane calls waiting; try again"));
        return;
      }
      admin_queue_.emplace_back(c.id, std::move(std::get<http_control_plane::deferred>(r)));
    }
    c.ph = connection::phase::scraping;
    admin_cv_.notify_one();
    return;
  }
  if (!known) {
    respond(c, 404, "Not Found", "text/plain", "not found: serving /metrics, /healthz, /readyz\n");
    return;
  }
  if (method != "GET" && method != "HEAD") {
    respond(c, 405, "Method Not Allowed", "text/plain", "only GET and HEAD\n");
    return;
  }
  if (path == "/metrics") {
    // However many wait (one per connection at most), they share the next
    // collection.
    {
      std::lock_guard<std::mutex> lock{mu_};
      scrape_queue_.push_back(c.id);
    }
    c.ph = connection::phase::scraping;
    scrape_cv_.notify_one();
    return;
  }
  if (path == "/healthz") {
    if (health_.alive.load())
      respond(c, 200, "OK", "text/plain", "ok\n");
    else
      respond(c, 503, "Service Unavailable", "text/plain", "an actor died: see the log\n");
    return;
  }
  // /readyz
  if (health_.draining.load())
    respond(c, 503, "Service Unavailable", "text/plain", "draining\n");
  else if (!health_.alive.load())
    respond(c, 503, "Service Unavailable", "text/plain", "an actor died: see the log\n");
  else if (!health_.ready.load())
    respond(c, 503, "Service Unavailable", "text/plain", "starting\n");
  else
    respond(c, 200, "OK", "text/plain", "ready\n");
}

void http_server::respond(connection& c, int status, const char* reason, const char* type,
                          const std::string& body) {
  for (size_t i = 0; i < answered_codes.size(); ++i)
    if (answered_codes[i] == status)
      answered_[i].fetch_add(1, std::memory_order_relaxed);
  c.out = "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\nContent-Type: " + type
          + "\r\nContent-Length: " + std::to_string(body.size())
          + (status == 401 ? "\r\nWWW-Authenticate: Bearer" : "")
          + "\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n";
  if (!c.head)
    c.out += body;
  c.written = 0;
  c.ph = connection::phase::writing;
  c.deadline = clock::now() + http_write_timeout;
  on_writable(c); // most answers fit in the socket's buffer: sent at once
}

namespace {
const char* status_reason(int status) {
  switch (status) {
  case 200: return "OK";
  case 202: return "Accepted";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 413: return "Content Too Large";
  case 422: return "Unprocessable Content";
  case 431: return "Request Header Fields Too Large";
  case 500: return "Internal Server Error";
  case 501: return "Not Implemented";
  case 503: return "Service Unavailable";
  case 504: return "Gateway Timeout";
  default: return "Unknown";
  }
}
} // namespace

void http_server::respond(connection& c, const http_answer& a) {
  respond(c, a.status, status_reason(a.status), a.content_type.c_str(), a.body);
}

void http_server::on_writable(connection& c) {
  while (c.written < c.out.size()) {
    auto n = ::send(c.fd, c.out.data() + c.written, c.out.size() - c.written, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return; // the rest when the socket is writable again
    if (n < 0) {
      c.close();
      return;
    }
    c.written += static_cast<size_t>(n);
  }
  std::string{}.swap(c.out);
  ::shutdown(c.fd, SHUT_WR);
  c.ph = connection::phase::draining;
  c.deadline = std::min(c.deadline, clock::now() + drain_timeout);
}

void http_server::take_scrapes(std::vector<std::unique_ptr<connection>>& conns) {
  std::vector<std::pair<uint64_t, std::string>> done;
  {
    std::lock_guard<std::mutex> lock{mu_};
    done.swap(scraped_);
  }
  std::vector<std::pair<uint64_t, http_answer>> answered;
  {
    std::lock_guard<std::mutex> lock{mu_};
    answered.swap(admin_done_);
  }
  for (auto& [id, text] : done)
    for (auto& c : conns)
      if (c->id == id && !c->closed() && c->ph == connection::phase::scraping)
        respond(*c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", text);
  for (auto& [id, a] : answered)
    for (auto& c : conns)
      if (c->id == id && !c->closed() && c->ph == connection::phase::scraping)
        respond(*c, a);
}

void http_server::admin_loop() {
  for (;;) {
    std::pair<uint64_t, http_control_plane::deferred> job;
    {
      std::unique_lock<std::mutex> lock{mu_};
      admin_cv_.wait(lock, [this] { return stopping_ || !admin_queue_.empty(); });
      if (stopping_)
        return;
      job = std::move(admin_queue_.front());
      admin_queue_.pop_front();
    }
    http_answer a;
    try {
      a = job.second();
    } catch (const std::exception& e) {
      a = http_error(500, std::string{"internal error: "} + e.what());
    }
    {
      std::lock_guard<std::mutex> lock{mu_};
      admin_done_.emplace_back(job.first, std::move(a));
    }
    uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
  }
}

void http_server::scrape_loop() {
  std::optional<clock::time_point> last_collection;
  for (;;) {
    std::vector<uint64_t> ids;
    {
      std::unique_lock<std::mutex> lock{mu_};
      scrape_cv_.wait(lock, [this] { return stopping_ || !scrape_queue_.empty(); });
      // Collections start at most every http_min_scrape_interval: a client
      // scraping in a loop would otherwise make every actor answer
      // thousands of snapshot requests a second. The wait happens before
      // the collection, so no answer is older than its request.
      if (last_collection)
        scrape_cv_.wait_until(lock, *last_collection + http_min_scrape_interval,
                              [this] { return stopping_; });
      if (stopping_)
        return;
      last_collection = clock::now();
      // Every scrape waiting now gets the same fresh collection.
      ids.assign(scrape_queue_.begin(), scrape_queue_.end());
      scrape_queue_.clear();
    }
    auto families = collector_->Collect();
    for (auto& f : to_families({snapshot()}))
      families.push_back(std::move(f));
    std::ostringstream out;
    prometheus::TextSerializer{}.Serialize(out, families);
    auto text = out.str();
    {
      std::lock_guard<std::mutex> lock{mu_};
      for (auto id : ids)
        scraped_.emplace_back(id, text);
    }
    uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
  }
}

void http_server::closed(connection& c, closed_reason why, const char* detail) {
  auto i = static_cast<size_t>(why);
  closed_[i].fetch_add(1, std::memory_order_relaxed);
  auto& l = reason_logs_[i];
  ++l.since_line;
  auto now = clock::now();
  if (l.last_line && now - *l.last_line < reason_log_interval)
    return;
  std::string what;
  switch (why) {
  case closed_reason::head_timeout:
    what = fmt::format("no whole request head within {} ms", http_head_timeout.count());
    break;
  case closed_reason::write_timeout:
    what = fmt::format("answer not read within {} ms", http_write_timeout.count());
    break;
  case closed_reason::evicted:
    what = fmt::format("the oldest, for a new one past {} connections",
                       http_max_connections);
    break;
  case closed_reason::bad_request:
    what = std::string{"bad request ("} + detail + "), answered 400 or 431";
    break;
  case closed_reason::count:
    break;
  }
  KVS_WARN(label_, "{} connection(s) closed: {}; the last from {} (logged at most once a minute, "
                   "counted in kvsidecar_http_closed_total)",
           l.since_line, what, c.peer);
  l.since_line = 0;
  l.last_line = now;
}

stats_snapshot http_server::snapshot() const {
  stats_snapshot s;
  s.gauge("", "kvsidecar_http_connections",
          static_cast<double>(open_connections_.load(std::memory_order_relaxed)));
  for (size_t i = 0; i < answered_codes.size(); ++i)
    s.counter("", "kvsidecar_http_requests_total",
              static_cast<double>(answered_[i].load(std::memory_order_relaxed)), "code",
              std::to_string(answered_codes[i]));
  static constexpr const char* reasons[] = {"head_timeout", "write_timeout", "evicted",
                                            "bad_request"};
  for (size_t i = 0; i < closed_.size(); ++i)
    s.counter("", "kvsidecar_http_closed_total",
              static_cast<double>(closed_[i].load(std::memory_order_relaxed)), "reason",
              reasons[i]);
  return s;
}

} // namespace kvs
