// The HTTP side of http_answer (messages/http_answer.hpp): the body limit,
// and the JSON error body every control-plane answer uses.
#pragma once

#include "messages/http_answer.hpp"

#include <cstddef>
#include <string_view>

namespace kvs {

/// The largest request body read (a quota or clear body is tens of bytes).
inline constexpr size_t http_max_body = 64 * 1024;

/// {"error": why, "detail": why} with `status`: FastAPI's key and LMCache's
/// routers' own, so the `lmcache` CLI (which prints "error") shows the reason.
http_answer http_error(int status, std::string_view why);

} // namespace kvs
