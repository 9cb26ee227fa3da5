#include "http/http_request.hpp"

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

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size())
    return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z')
      x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z')
      y = static_cast<char>(y - 'A' + 'a');
    if (x != y)
      return false;
  }
  return true;
}

std::string_view trim_ows(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t'))
    v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\r'))
    v.remove_suffix(1);
  return v;
}

/// Reads the header fields (between the request line and the blank line)
/// into `h`; false (and `h` bad) on a malformed or refused field.
bool read_fields(std::string_view fields, http_head& h) {
  bool seen_length = false;
  while (!fields.empty()) {
    auto nl = fields.find('\n');
    auto line = fields.substr(0, nl);
    fields = nl == std::string_view::npos ? std::string_view{} : fields.substr(nl + 1);
    if (!line.empty() && line.back() == '\r')
      line.remove_suffix(1);
    if (line.empty())
      break;
    auto colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) {
      h = bad(400, "malformed header field: expected NAME: VALUE");
      return false;
    }
    auto name = line.substr(0, colon);
    for (char c : name)
      if (!is_tchar(c)) {
        h = bad(400, "malformed header field: name is not a token");
        return false;
      }
    auto value = trim_ows(line.substr(colon + 1));
    if (iequals(name, "content-length")) {
      if (value.empty() || value.size() > 12) {
        h = bad(400, "malformed Content-Length");
        return false;
      }
      size_t n = 0;
      for (char c : value) {
        if (c < '0' || c > '9') {
          h = bad(400, "malformed Content-Length");
          return false;
        }
        n = n * 10 + static_cast<size_t>(c - '0');
      }
      if (seen_length && n != h.content_length) {
        h = bad(400, "conflicting Content-Length fields");
        return false;
      }
      seen_length = true;
      h.content_length = n;
    } else if (iequals(name, "transfer-encoding")) {
      h = bad(400, "Transfer-Encoding is not supported: send the body with Content-Length");
      return false;
    } else if (iequals(name, "authorization")) {
      h.authorization = value;
    } else if (iequals(name, "x-lmcache-api-key")) {
      h.api_key = value;
    }
  }
  return true;
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
  auto fields_at = bytes.find('\n') + 1;
  if (!read_fields(bytes.substr(fields_at, end - fields_at), h))
    return h;
  h.st = http_head::state::complete;
  h.method = method;
  auto q = target.find('?');
  h.path = target.substr(0, q);
  h.query = q == std::string_view::npos ? std::string_view{} : target.substr(q + 1);
  h.head_size = end;
  return h;
}

} // namespace kvs
