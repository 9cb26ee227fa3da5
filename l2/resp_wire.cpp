#include "l2/resp_wire.hpp"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>

namespace kvs {

namespace {

constexpr size_t read_buffer_bytes = 64 * 1024; ///< also the longest reply line
constexpr size_t by_reference_from = 16 * 1024; ///< arguments this big are not copied
/// At most this much per read() straight into a destination: one huge
/// read holds the socket's lock while it copies, so the segments arriving
/// meanwhile wait in its backlog and the sender's window is answered late;
/// reads of 256 KiB kept 1 MiB GETs ~10% faster on loopback than reads of
/// everything missing (BENCHMARKS.md, "L2 tiers").
constexpr size_t direct_read_bytes = 256 * 1024;
/// A bulk's destination grows to at most this much ahead of the bytes that
/// actually arrived: a server announcing a huge length and sending little
/// costs little memory.
constexpr size_t bulk_first_step = 64ull << 20;

/// A printable rendering of an unexpected byte for an error message.
std::string show_byte(char c) {
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned char>(c));
  if (c >= 0x21 && c < 0x7f)
    return std::string{"'"} + c + "' (" + hex + ")";
  return hex;
}

/// At most 40 characters of a line, for an error message.
std::string excerpt(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 40))
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return s.size() > 40 ? out + "..." : out;
}

bool parse_int(std::string_view s, long long* v) {
  if (s.empty())
    return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc{} && end == s.data() + s.size();
}

/// A reply that breaks RESP: the connection cannot be trusted after it.
error protocol(std::string detail) { return make_error("protocol", std::move(detail)); }

} // namespace

resp_reader::resp_reader(size_t max_bulk, std::chrono::milliseconds timeout)
    : max_bulk_(max_bulk), timeout_(timeout), buf_(read_buffer_bytes) {}

error resp_reader::io_error(ssize_t n, const std::string& waiting_for) const {
  if (n == 0)
    return make_error("closed", "server closed the connection " + waiting_for);
  if (errno == EAGAIN || errno == EWOULDBLOCK)
    return make_error("timeout", "no data within " + std::to_string(timeout_.count()) + " ms " + waiting_for);
  return make_error("io", std::string{std::strerror(errno)} + " " + waiting_for);
}

status resp_reader::fill(int fd, const char* waiting_for) {
  if (begin_ == end_)
    begin_ = end_ = 0;
  else if (end_ == buf_.size() && begin_ > 0) {
    std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  for (;;) {
    ssize_t n = ::read(fd, buf_.data() + end_, buf_.size() - end_);
    if (n > 0) {
      end_ += static_cast<size_t>(n);
      return {};
    }
    if (n < 0 && errno == EINTR)
      continue;
    return io_error(n, waiting_for);
  }
}

status resp_reader::line(int fd, std::string_view* out) {
  size_t scanned = begin_;
  for (;;) {
    auto* start = buf_.data() + begin_;
    auto* from = buf_.data() + std::max(scanned, begin_ + 1);
    auto* end = buf_.data() + end_;
    for (auto* p = from; p < end; ++p)
      if (*p == '\n' && p[-1] == '\r') {
        *out = std::string_view(start, static_cast<size_t>(p - 1 - start));
        begin_ = static_cast<size_t>(p + 1 - buf_.data());
        return {};
      }
    if (end_ - begin_ >= buf_.size())
      return protocol("reply line longer than " + std::to_string(buf_.size()) + " bytes without CRLF");
    size_t seen = end_ - begin_; // survives the compaction in fill()
    if (auto ok = fill(fd, seen ? "in the middle of a reply line" : "waiting for a reply"); !ok)
      return ok;
    scanned = begin_ + seen;
  }
}

status resp_reader::bulk(int fd, long long len, std::string& dst) {
  auto total = static_cast<size_t>(len);
  auto context = [&](size_t got) {
    return "after " + std::to_string(got) + " of " + std::to_string(total)
           + " bytes of a bulk reply";
  };
  size_t got = std::min(total, buffered());
  dst.resize(std::max(got, std::min(total, bulk_first_step)));
  std::memcpy(dst.data(), buf_.data() + begin_, got);
  begin_ += got;
  // The rest straight from the socket into the destination: exactly what
  // is missing, so nothing of the next reply is read here.
  while (got < total) {
    if (got == dst.size())
      dst.resize(std::min(total, dst.size() * 2));
    ssize_t n = ::read(fd, dst.data() + got, std::min(direct_read_bytes, dst.size() - got));
    if (n > 0) {
      got += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    return io_error(n, context(got));
  }
  while (buffered() < 2)
    if (auto ok = fill(fd, "before the CRLF that ends a bulk reply"); !ok)
      return ok;
  if (buf_[begin_] != '\r' || buf_[begin_ + 1] != '\n')
    return protocol("bulk reply of " + std::to_string(total) + " bytes followed by "
                    + show_byte(buf_[begin_]) + " instead of CRLF");
  begin_ += 2;
  return {};
}

status resp_reader::next(int fd, resp_reply& out, std::string* bulk_to) {
  std::string_view l;
  if (auto ok = line(fd, &l); !ok)
    return ok;
  if (l.empty())
    return protocol("empty reply line");
  auto rest = l.substr(1);
  switch (l[0]) {
    case '+':
    case '-':
      out.type = l[0] == '+' ? resp_reply::kind::status : resp_reply::kind::error;
      out.text.assign(rest.data(), rest.size());
      return {};
    case ':':
      out.type = resp_reply::kind::integer;
      if (!parse_int(rest, &out.integer))
        return protocol("integer reply ':" + excerpt(rest) + "' is not a number");
      return {};
    case '$': {
      long long len = 0;
      if (!parse_int(rest, &len) || len < -1)
        return protocol("bulk length '$" + excerpt(rest) + "' is not a length");
      if (len == -1) {
        out.type = resp_reply::kind::nil;
        out.text.clear();
        return {};
      }
      if (static_cast<unsigned long long>(len) > max_bulk_)
        return protocol("bulk length " + std::to_string(len) + " over the limit of "
                        + std::to_string(max_bulk_) + " bytes");
      out.type = resp_reply::kind::bulk;
      return bulk(fd, len, bulk_to ? *bulk_to : out.text);
    }
    default:
      return protocol("unexpected reply type byte " + show_byte(l[0]) + " in '" + excerpt(l)
                      + "' (a GET/SET/EXISTS reply starts with + - : or $)");
  }
}

void resp_writer::copy(std::string_view s) {
  if (!pieces_.empty() && !pieces_.back().ref
      && pieces_.back().off + pieces_.back().len == small_.size())
    pieces_.back().len += s.size();
  else
    pieces_.push_back({nullptr, small_.size(), s.size()});
  small_.append(s.data(), s.size());
}

void resp_writer::put(std::string_view s) {
  if (s.size() >= by_reference_from)
    pieces_.push_back({s.data(), 0, s.size()});
  else if (!s.empty())
    copy(s);
}

void resp_writer::command(std::initializer_list<resp_arg> argv) {
  char num[32];
  auto header = [&](char type, size_t n) {
    num[0] = type;
    auto r = std::to_chars(num + 1, num + sizeof num - 2, n);
    r.ptr[0] = '\r';
    r.ptr[1] = '\n';
    copy(std::string_view(num, static_cast<size_t>(r.ptr + 2 - num)));
  };
  header('*', argv.size());
  for (auto& a : argv) {
    header('$', a.head.size() + a.tail.size());
    put(a.head);
    put(a.tail);
    copy("\r\n");
  }
}

void resp_writer::clear() {
  small_.clear();
  pieces_.clear();
}

status resp_writer::flush(int fd) {
  std::vector<iovec> iov;
  iov.reserve(pieces_.size());
  for (auto& p : pieces_)
    iov.push_back({const_cast<char*>(p.ref ? p.ref : small_.data() + p.off), p.len});
  size_t i = 0;
  status ok;
  while (i < iov.size()) {
    msghdr m{};
    m.msg_iov = iov.data() + i;
    m.msg_iovlen = std::min<size_t>(iov.size() - i, IOV_MAX);
    ssize_t n = ::sendmsg(fd, &m, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      ok = errno == EAGAIN || errno == EWOULDBLOCK ? make_error("timeout", "send timed out")
                                                   : make_error("io", std::strerror(errno));
      break;
    }
    // Skip what was sent; a partly sent piece keeps its tail.
    auto left = static_cast<size_t>(n);
    while (i < iov.size() && left >= iov[i].iov_len)
      left -= iov[i++].iov_len;
    if (left > 0) {
      iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + left;
      iov[i].iov_len -= left;
    }
  }
  clear();
  return ok;
}

} // namespace kvs
