// control_plane: what the HTTP server asks about the paths it does not serve
// itself (everything but /metrics, /healthz and /readyz). LMCache's HTTP API
// implements it (admin/admin_plane.hpp); the server knows nothing of it.
#pragma once

#include "http/http_answer.hpp"

#include <functional>
#include <optional>
#include <string_view>
#include <variant>

namespace kvs {

class http_control_plane {
public:
  /// Work that makes an answer; run on the server's "http-admin" thread, one
  /// at a time, so it may wait (up to its own deadline) without holding the
  /// probes or the scrapes.
  using deferred = std::function<http_answer()>;

  virtual ~http_control_plane() = default;

  /// Asked first for every request, the server's own paths included:
  /// nullopt lets it through, else the answer (a 401).
  virtual std::optional<http_answer> admit(std::string_view path, std::string_view authorization,
                                           std::string_view api_key) const = 0;

  /// A request for another path, on the server's loop thread (must not
  /// block): the answer at once, or the work that makes it.
  virtual std::variant<http_answer, deferred> route(std::string_view method, std::string_view path,
                                                    std::string_view query, std::string_view body,
                                                    std::string_view authorization) = 0;
};

} // namespace kvs
