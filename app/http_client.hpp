// A small blocking HTTP/1.1 client for the LMCache fleet coordinator
// (app/coordinator_member): one request per connection ("Connection:
// close"), plain http:// only, a deadline over connect, send and receive,
// and at most http_client_max_answer bytes of answer. Every failure is an
// error naming what went wrong (no answer, a malformed status line, an
// answer too large, a chunked body) -- the coordinator is a peer like any
// other.
#pragma once

#include "core/error.hpp"

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

namespace kvs {

inline constexpr size_t http_client_max_answer = 1 << 20;

struct http_reply {
  int status = 0;
  std::string body;
};

/// `method` `path` on `base_url` ("http://host:port"), with a JSON body
/// when `body` is not empty.
expected<http_reply> http_call(const std::string& base_url, std::string_view method,
                               const std::string& path, const std::string& body,
                               std::chrono::milliseconds timeout);

/// At most 120 bytes of `body` for a log line, bytes outside printable
/// ASCII as '?' (a garbage answer must not garble the log).
std::string printable_excerpt(std::string_view body);

} // namespace kvs
