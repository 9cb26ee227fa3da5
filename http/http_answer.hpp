// http_answer: what the HTTP server writes back for a request it did not
// answer itself (the control plane's calls), and the JSON error body every
// such answer uses.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvs {

/// The largest request body read (a quota or clear body is tens of bytes).
inline constexpr size_t http_max_body = 64 * 1024;

struct http_answer {
  int status = 200;
  std::string body; ///< JSON unless content_type says otherwise
  std::string content_type = "application/json";
};

/// {"error": why, "detail": why} with `status`: FastAPI's key and LMCache's
/// routers' own, so the `lmcache` CLI (which prints "error") shows the reason.
http_answer http_error(int status, std::string_view why);

} // namespace kvs
