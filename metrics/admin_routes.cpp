#include "metrics/admin_routes.hpp"

#include "core/cache_salt.hpp"
#include "metrics/json_text.hpp"

#include <cmath>
#include <optional>

namespace kvs {

namespace {

http_answer detail(int status, std::string_view what) {
  json_writer w;
  w.begin_object().str("detail", what).end_object();
  return {status, w.take()};
}

/// Compares without stopping at the first difference, so the answer's
/// timing does not tell how much of a guessed token was right.
bool same_token(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

/// nullopt when the request may change state; else the 401.
std::optional<http_answer> check_token(std::string_view auth, const admin_policy& p) {
  if (p.loopback)
    return std::nullopt;
  if (p.token.empty())
    return admin_error(401, "this call changes state and the HTTP listener is not loopback: "
                            "set http.admin_token (or KVSIDECAR_ADMIN_TOKEN) and send "
                            "'Authorization: Bearer <token>'");
  constexpr std::string_view scheme = "Bearer ";
  if (auth.size() <= scheme.size() || auth.substr(0, scheme.size()) != scheme)
    return admin_error(401, "this call changes state: send 'Authorization: Bearer <token>' "
                            "(http.admin_token)");
  if (!same_token(auth.substr(scheme.size()), p.token))
    return admin_error(401, "wrong bearer token (http.admin_token)");
  return std::nullopt;
}

/// What kvsidecar answers for LMCache routes it does not serve.
std::optional<std::string_view> unsupported(std::string_view path) {
  auto starts = [&](std::string_view p) { return path.substr(0, p.size()) == p; };
  if (starts("/reconfigure/"))
    return "kvsidecar has no DAX L1 or reconfigurable L2 adapters: its tiers are set in "
           "its config ([cache], [l2]) and change with a restart";
  if (path == "/run_script")
    return "kvsidecar never runs scripts sent over HTTP";
  if (path == "/threads" || starts("/periodic-threads"))
    return "kvsidecar is not a Python process: no thread dumps; see /metrics and its log";
  if (path == "/env")
    return "kvsidecar does not publish its environment; GET /config shows its effective "
           "configuration (secrets redacted)";
  if (path == "/loglevel")
    return "kvsidecar's log level is sidecar.log_level in its config";
  if (path == "/metrics/reset")
    return "kvsidecar's Prometheus counters are monotonic and never reset; use rate() or "
           "increase() in queries";
  if (path == "/cache/objects")
    return "listing and deleting cache objects by key is not supported by kvsidecar yet; "
           "POST /cache/clear drops L1";
  if (path == "/cache/checksums")
    return "checksums of GPU KV blocks need the engine's tensors, which kvsidecar's HTTP "
           "side does not read";
  return std::nullopt;
}

http_answer bad_body(const std::string& why) {
  return admin_error(400, "invalid JSON body: " + why);
}

admin_route route_clear(std::string_view body) {
  admin_call c;
  c.op = admin_op::cache_clear;
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos)
    return c; // no body: {"tier": "l1", "force": false}
  auto o = parse_json_object(body);
  if (!o.error.empty())
    return bad_body(o.error);
  for (auto& [name, v] : o.members)
    if (name != "tier" && name != "force")
      return admin_error(422, "unknown field \"" + name.substr(0, 64)
                                + "\": expected {\"tier\": \"l1\"|\"l2\"|\"all\", "
                                  "\"force\": bool}");
  if (auto t = o.get("tier")) {
    if (t->k != json_value::kind::string
        || (t->s != "l1" && t->s != "l2" && t->s != "all"))
      return admin_error(422, "tier must be \"l1\", \"l2\" or \"all\"");
    c.tier = t->s;
  }
  if (auto f = o.get("force")) {
    if (f->k != json_value::kind::boolean)
      return admin_error(422, "force must be true or false");
    c.force = f->b;
  }
  if (c.tier != "l1")
    return admin_error(400, "tier '" + c.tier + "' not supported; only 'l1'");
  if (c.force)
    return admin_error(501, "force=true is not supported: kvsidecar never drops chunks a "
                            "reader has locked or a copy is writing");
  return c;
}

admin_route route_quota_set(admin_call c, std::string_view body) {
  auto o = parse_json_object(body);
  if (!o.error.empty())
    return admin_error(400, "invalid JSON body: " + o.error);
  auto v = o.get("limit_gb");
  if (!v)
    return admin_error(400, "body must be {'limit_gb': <float>}");
  if (v->k != json_value::kind::number)
    return admin_error(400, "limit_gb must be numeric");
  if (!std::isfinite(v->n))
    return admin_error(400, "limit_gb must be finite");
  if (v->n < 0)
    return admin_error(400, "limit_gb must be non-negative");
  // 2^24 GiB (16 PiB) is far past any L1; above it the byte count would
  // lose its meaning (and 2^64 overflow).
  if (v->n > 16777216.0)
    return admin_error(400, "limit_gb must be at most 16777216 (16 PiB)");
  c.limit_gb = v->n;
  c.limit_bytes = static_cast<uint64_t>(v->n * 1073741824.0);
  return c;
}

/// LMCache's PrefetchRequest: model_name, world_size, token_ids, cache_salt
/// (""), source_tier ("l2"), target_tier ("l1").
admin_route route_prefetch(std::string_view body) {
  auto o = parse_json_object(body);
  if (!o.error.empty())
    return bad_body(o.error);
  for (auto& [name, v] : o.members)
    if (name != "model_name" && name != "world_size" && name != "token_ids"
        && name != "cache_salt" && name != "source_tier" && name != "target_tier")
      return admin_error(422, "unknown field \"" + name.substr(0, 64) + "\"");
  admin_call c;
  c.op = admin_op::prefetch_submit;
  auto m = o.get("model_name");
  if (!m || m->k != json_value::kind::string || m->s.empty() || m->s.size() > 1024)
    return admin_error(422, "model_name must be a non-empty string of at most 1024 bytes");
  c.model = m->s;
  auto w = o.get("world_size");
  if (!w || w->k != json_value::kind::number || w->n != static_cast<double>(
                                                  static_cast<int64_t>(w->n))
      || w->n < 1 || w->n > 1024)
    return admin_error(422, "world_size must be an integer in 1..1024");
  c.world_size = static_cast<int64_t>(w->n);
  auto t = o.get("token_ids");
  if (!t || t->k != json_value::kind::int_array)
    return admin_error(422, "token_ids must be an array of integers");
  c.tokens = t->ints;
  if (auto s = o.get("cache_salt")) {
    if (s->k != json_value::kind::string)
      return admin_error(422, "cache_salt must be a string");
    if (auto why = check_cache_salt(s->s))
      return admin_error(400, why);
    c.salt = s->s;
  }
  std::string from = "l2", to = "l1";
  for (auto [key, out] : {std::pair{"source_tier", &from}, std::pair{"target_tier", &to}})
    if (auto v = o.get(key)) {
      if (v->k != json_value::kind::string
          || (v->s != "l1" && v->s != "l2" && v->s != "all"))
        return admin_error(422, std::string{key} + " must be \"l1\", \"l2\" or \"all\"");
      *out = v->s;
    }
  if (from != "l2" || to != "l1")
    return admin_error(400, "unsupported prefetch direction '" + from + "'->'" + to
                              + "'; only 'l2'->'l1'");
  return c;
}

} // namespace

http_answer admin_error(int status, std::string_view why) {
  json_writer w;
  w.begin_object().str("error", why).str("detail", why).end_object();
  return {status, w.take()};
}

bool percent_decode(std::string_view in, std::string& out) {
  out.clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out += in[i];
      continue;
    }
    if (i + 2 >= in.size())
      return false;
    int h = hex_digit(in[i + 1]), l = hex_digit(in[i + 2]);
    if (h < 0 || l < 0)
      return false;
    out += static_cast<char>(h * 16 + l);
    i += 2;
  }
  return true;
}

admin_route route_admin(std::string_view method, std::string_view path, std::string_view query,
                        std::string_view body, std::string_view authorization,
                        const admin_policy& policy) {
  (void)query; // no route served here takes query parameters
  bool read = method == "GET" || method == "HEAD";
  if (!read) {
    if (auto refused = check_token(authorization, policy))
      return *refused;
  }
  auto only = [&](bool ok, admin_op op) -> admin_route {
    if (!ok)
      return detail(405, "Method Not Allowed");
    admin_call c;
    c.op = op;
    c.path = std::string{path};
    return c;
  };
  if (path == "/")
    return only(read, admin_op::root);
  if (path == "/healthcheck")
    return only(read, admin_op::healthcheck);
  if (path == "/status")
    return only(read, admin_op::status);
  if (path == "/config")
    return only(read, admin_op::config);
  if (path == "/config/adapters")
    return only(read, admin_op::config_adapters);
  if (path == "/version" || path == "/lmc_version" || path == "/commit_id")
    return only(read, admin_op::version);
  if (path == "/cache/clear") {
    if (method != "POST")
      return detail(405, "Method Not Allowed");
    return route_clear(body);
  }
  if (path == "/quota")
    return only(read, admin_op::quota_list);
  if (path == "/cache/prefetches") {
    if (method != "POST")
      return detail(405, "Method Not Allowed");
    return route_prefetch(body);
  }
  constexpr std::string_view prefetch_prefix = "/cache/prefetches/";
  if (path.substr(0, prefetch_prefix.size()) == prefetch_prefix) {
    auto id = path.substr(prefetch_prefix.size());
    if (!read)
      return detail(405, "Method Not Allowed");
    if (id.empty() || id.size() > 64
        || id.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
             != std::string_view::npos)
      return admin_error(404, "unknown prefetch request_id (ids are letters, digits and '-')");
    admin_call c;
    c.op = admin_op::prefetch_status;
    c.request_id = std::string{id};
    return c;
  }
  constexpr std::string_view quota_prefix = "/quota/";
  if (path.substr(0, quota_prefix.size()) == quota_prefix) {
    admin_call c;
    c.path = std::string{path};
    auto name = path.substr(quota_prefix.size());
    std::string decoded;
    if (name.empty() || name.find('/') != std::string_view::npos)
      return detail(404, "Not Found");
    if (!percent_decode(name, decoded))
      return admin_error(400, "cache_salt: malformed %-escape in the path");
    if (auto why = check_cache_salt(decoded))
      return admin_error(400, why);
    c.salt = std::string{cache_salt_from_name(decoded)};
    if (read) {
      c.op = admin_op::quota_get;
      return c;
    }
    if (method == "PUT") {
      c.op = admin_op::quota_set;
      return route_quota_set(std::move(c), body);
    }
    if (method == "DELETE") {
      c.op = admin_op::quota_delete;
      return c;
    }
    return detail(405, "Method Not Allowed");
  }
  if (auto why = unsupported(path))
    return admin_error(501, *why);
  return detail(404, "Not Found");
}

} // namespace kvs
