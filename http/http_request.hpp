// http_request: reads the head of an HTTP/1.x request from the bytes a
// client has sent so far. Pure (no sockets, no allocation): the HTTP server
// calls it after each read, and it is fuzzed (tests/fuzz/fuzz_http_request).
//
// The request line's method, path and query string, and the two header
// fields the admin API needs: Content-Length (a body follows the head; the
// server reads it, up to its own limit) and Authorization (the bearer
// token of mutating calls). Other header fields are skipped; a chunked body
// (Transfer-Encoding) is refused. Anything else is a 400 naming what was
// wrong, a head past the limit a 431.
#pragma once

#include <cstddef>
#include <string_view>

namespace kvs {

struct http_head {
  enum class state {
    incomplete, ///< no blank line yet, and under the limit: read more
    complete,   ///< method and path are set
    bad,        ///< status and why are set: answer and close
  };
  state st = state::incomplete;
  std::string_view method; ///< "GET", "HEAD", ...
  std::string_view path;   ///< "/metrics" (the target up to '?')
  std::string_view query;  ///< what follows '?' ("" if none)
  std::string_view authorization; ///< the Authorization field's value ("" if none)
  std::string_view api_key;       ///< the X-LMCache-API-Key field's value ("" if none)
  size_t content_length = 0;      ///< body bytes after the head
  size_t head_size = 0;           ///< bytes of the head, blank line included
  int status = 0;          ///< 400 or 431 when bad
  const char* why = "";    ///< what was wrong, for the answer's body
};

/// Parses `bytes` (all received so far); the views point into it. Heads
/// longer than `max_head` bytes (blank line included) are bad (431).
http_head parse_http_head(std::string_view bytes, size_t max_head);

} // namespace kvs
