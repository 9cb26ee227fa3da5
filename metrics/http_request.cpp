#include "metrics/http_request.hpp"

namespace kvs {

namespace {

http_head bad(int status, const char* why) {
  http_head h;
  h.st = http_head::state::bad;
  h.status = status;
  h.why = why;
  return h;
}

/// RFC 9110 tchar: what a method may be made of.
bool is_tchar(char c) {
  if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))
    return true;
  switch (c) {
  case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+':
  case '-': case '.': case '^': case '_': case '`': case '|': case '~':
    return true;
  default:
    return false;
  }
}

/// A request target's characters: visible ASCII, no space (RFC 9112 3.2).
bool is_target_char(char c) {
  return c > 0x20 && c < 0x7f;
}

} // namespace

http_head parse_http_head(std::string_view bytes, size_t max_head) {
  // The head ends at the first empty line; bare LF line ends are accepted
  // (RFC 9112 2.2), as curl and every HTTP library send CRLF anyway.
  size_t end = std::string_view::npos;
  for (size_t i = bytes.find('\n'); i != std::string_view::npos; i = bytes.find('\n', i + 1)) {
    if (i + 1 < bytes.size() && bytes[i + 1] == '\n') {
      end = i + 2;
      break;
    }
    if (i + 2 < bytes.size() && bytes[i + 1] == '\r' && bytes[i + 2] == '\n') {
      end = i + 3;
      break;
    }
  }
  if (end == std::string_view::npos || end > max_head) {
    if (bytes.size() >= max_head || end != std::string_view::npos)
      return bad(431, "request head too large");
    // The request line alone can already be judged: garbage is answered at
    // once instead of after the head timeout.
    auto line = bytes.substr(0, bytes.find('\n'));
    for (char c : line.substr(0, line.find(' ')))
      if (!is_tchar(c))
        return bad(400, "malformed request line: method is not a token");
    return http_head{};
  }
  auto line = bytes.substr(0, bytes.find('\n'));
  if (!line.empty() && line.back() == '\r')
    line.remove_suffix(1);
  auto sp1 = line.find(' ');
  if (sp1 == std::string_view::npos || sp1 == 0)
    return bad(400, "malformed request line: expected METHOD SP TARGET SP HTTP/1.x");
  auto sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || sp2 == sp1 + 1)
    return bad(400, "malformed request line: expected METHOD SP TARGET SP HTTP/1.x");
  auto method = line.substr(0, sp1);
  auto target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  auto version = line.substr(sp2 + 1);
  for (char c : method)
    if (!is_tchar(c))
      return bad(400, "malformed request line: method is not a token");
  if (version != "HTTP/1.1" && version != "HTTP/1.0")
    return bad(400, "malformed request line: version is not HTTP/1.0 or HTTP/1.1");
  if (target.front() != '/')
    return bad(400, "malformed request line: target must be a path starting with '/'");
  for (char c : target)
    if (!is_target_char(c))
      return bad(400, "malformed request line: target has a control or non-ASCII byte");
  http_head h;
  h.st = http_head::state::complete;
  h.method = method;
  h.path = target.substr(0, target.find('?'));
  return h;
}

} // namespace kvs
