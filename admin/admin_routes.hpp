// admin_routes: LMCache's HTTP control plane (the routers of its MP
// http_server, lmcache/v1/multiprocess/http_apis/ in 0.5.6 and 0.5.7), as
// the paths and bodies kvsidecar's HTTP server accepts. Pure: a request
// (method, path, query, body, Authorization) becomes either an admin_call
// (messages/admin_calls.hpp: one type per operation) for the backend
// (admin/admin_actor.cpp asks the other actors) or a finished answer -- a 400
// naming the bad parameter, a 401, a 404/405, or a 501 for what kvsidecar
// does not have (DAX reconfiguration, run_script, Python thread dumps...).
// Fuzzed with the JSON body reader (tests/fuzz/fuzz_http_admin).
//
// Answers use LMCache's JSON shapes: FastAPI's {"detail": ...} for unknown
// paths and methods, the routers' own {"error": ...} elsewhere (our errors
// carry both keys, so the `lmcache` CLI, which prints "message" or
// "error", shows the reason).
//
// Authorization: when the listener is not loopback, every request that is
// not GET or HEAD (clear, quota changes, deletes, prefetches, metrics
// reset: everything that changes state) needs "Authorization: Bearer
// <http.admin_token>" (or one of the API keys); without a configured token
// or key such calls are refused. With API keys configured (LMCache 0.5.7's
// --api-key-file), every path but the public ones needs a key first
// (check_api_key, which the HTTP server applies to /metrics as well).
#pragma once

#include "messages/admin_calls.hpp"
#include "http/http_answer.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace kvs {

struct admin_policy {
  /// The listener is a loopback address: no token is asked.
  bool loopback = true;
  /// http.admin_token (or KVSIDECAR_ADMIN_TOKEN); "" = none configured.
  std::string token;
  /// LMCache 0.5.7's API keys (http.api_key_files, LMCACHE_API_KEY...:
  /// app/api_keys.hpp). Any: every path but the public ones needs one of
  /// them (or the admin token), as a bearer token or X-LMCache-API-Key; a
  /// key also opens the state changes the admin token opens.
  std::vector<std::string> api_keys;
};

/// Paths open without a key when API keys are configured: LMCache's
/// public ones (/, /healthcheck) and kvsidecar's probes (/healthz, /readyz).
bool public_path(std::string_view path);

/// nullopt when the request may proceed; else LMCache's 401
/// ({"detail": "Invalid or missing API key"}). Every path, /metrics
/// included, when `policy` has API keys; nothing is asked otherwise.
std::optional<http_answer> check_api_key(std::string_view path, std::string_view authorization,
                                         std::string_view api_key, const admin_policy& policy);

/// A call for the backend, or the answer already.
using admin_route = std::variant<admin_call, http_answer>;

/// Routes one request. `path` is the target up to '?', `query` the rest.
admin_route route_admin(std::string_view method, std::string_view path, std::string_view query,
                        std::string_view body, std::string_view authorization,
                        const admin_policy& policy);

/// Answers admin calls (admin/admin_client.hpp: hands them to the admin
/// actor and waits); called on the HTTP server's
/// admin thread, one call at a time; may block up to its own deadline.
class admin_backend {
public:
  virtual ~admin_backend() = default;
  virtual http_answer serve(const admin_call& call) = 0;
};

} // namespace kvs
