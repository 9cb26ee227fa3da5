#include "admin/admin_routes.hpp"

#include "core/cache_salt.hpp"
#include "core/hex.hpp"
#include "http/json_text.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <initializer_list>
#include <optional>

namespace kvs {

namespace {

/// Decodes %XX escapes (a path segment); false on a malformed escape.
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

/// The admin token or one of the API keys (each compared in full, so the
/// time taken does not tell which came close).
bool known_key(std::string_view t, const admin_policy& p) {
  bool ok = !p.token.empty() && same_token(t, p.token);
  for (auto& k : p.api_keys)
    ok |= same_token(t, k);
  return ok;
}

/// nullopt when the request may change state; else the 401.
std::optional<http_answer> check_token(std::string_view auth, const admin_policy& p) {
  if (p.loopback)
    return std::nullopt;
  if (p.token.empty() && p.api_keys.empty())
    return http_error(401, "this call changes state and the HTTP listener is not loopback: "
                            "set http.admin_token (or KVSIDECAR_ADMIN_TOKEN) or an API key "
                            "(http.api_key_files) and send 'Authorization: Bearer <token>'");
  constexpr std::string_view scheme = "Bearer ";
  if (auth.size() <= scheme.size() || auth.substr(0, scheme.size()) != scheme)
    return http_error(401, "this call changes state: send 'Authorization: Bearer <token>' "
                            "(http.admin_token or an API key)");
  if (!known_key(auth.substr(scheme.size()), p))
    return http_error(401, "wrong bearer token (http.admin_token or an API key)");
  return std::nullopt;
}

/// LMCache's bearer_token(): "<scheme> <token>", the scheme any case.
std::string_view bearer_token(std::string_view auth) {
  auto space = auth.find(' ');
  if (space == std::string_view::npos || space + 1 == auth.size())
    return {};
  auto scheme = auth.substr(0, space);
  constexpr std::string_view bearer = "bearer";
  if (scheme.size() != bearer.size())
    return {};
  for (size_t i = 0; i < bearer.size(); ++i)
    if ((scheme[i] | 0x20) != bearer[i])
      return {};
  return auth.substr(space + 1);
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
  return std::nullopt;
}

http_answer bad_body(const std::string& why) {
  return http_error(400, "invalid JSON body: " + why);
}

admin_route route_clear(std::string_view body) {
  admin_req::cache_clear c;
  bool force = false;
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos)
    return c; // no body: {"tier": "l1", "force": false}
  auto o = parse_json_object(body);
  if (!o.error.empty())
    return bad_body(o.error);
  for (auto& [name, v] : o.members)
    if (name != "tier" && name != "force")
      return http_error(422, "unknown field \"" + name.substr(0, 64)
                                + "\": expected {\"tier\": \"l1\"|\"l2\"|\"all\", "
                                  "\"force\": bool}");
  if (auto t = o.get("tier")) {
    if (t->k != json_value::kind::string
        || (t->s != "l1" && t->s != "l2" && t->s != "all"))
      return http_error(422, "tier must be \"l1\", \"l2\" or \"all\"");
    c.tier = t->s;
  }
  if (auto f = o.get("force")) {
    if (f->k != json_value::kind::boolean)
      return http_error(422, "force must be true or false");
    force = f->b;
  }
  if (force)
    return http_error(501, "force=true is not supported: kvsidecar never drops chunks a "
                            "reader has locked or a copy is writing");
  return c;
}

admin_route route_quota_set(admin_req::quota_set c, std::string_view body) {
  auto o = parse_json_object(body);
  if (!o.error.empty())
    return http_error(400, "invalid JSON body: " + o.error);
  auto v = o.get("limit_gb");
  if (!v)
    return http_error(400, "body must be {'limit_gb': <float>}");
  if (v->k != json_value::kind::number)
    return http_error(400, "limit_gb must be numeric");
  if (!std::isfinite(v->n))
    return http_error(400, "limit_gb must be finite");
  if (v->n < 0)
    return http_error(400, "limit_gb must be non-negative");
  // 2^24 GiB (16 PiB) is far past any L1; above it the byte count would
  // lose its meaning (and 2^64 overflow).
  if (v->n > 16777216.0)
    return http_error(400, "limit_gb must be at most 16777216 (16 PiB)");
  c.limit_gb = v->n;
  c.limit_bytes = static_cast<uint64_t>(v->n * 1073741824.0);
  return c;
}

/// model_name, world_size, token_ids and cache_salt of a body that names
/// chunks by their tokens (LMCache's PrefetchRequest; our checksum body).
std::optional<http_answer> token_fields(const json_object& o, admin_req::token_chunks& c) {
  auto m = o.get("model_name");
  if (!m || m->k != json_value::kind::string || m->s.empty() || m->s.size() > 1024)
    return http_error(422, "model_name must be a non-empty string of at most 1024 bytes");
  c.model = m->s;
  auto w = o.get("world_size");
  if (!w || w->k != json_value::kind::number || w->n != static_cast<double>(
                                                  static_cast<int64_t>(w->n))
      || w->n < 1 || w->n > 1024)
    return http_error(422, "world_size must be an integer in 1..1024");
  c.world_size = static_cast<int64_t>(w->n);
  auto t = o.get("token_ids");
  if (!t || t->k != json_value::kind::int_array)
    return http_error(422, "token_ids must be an array of integers");
  c.tokens = t->ints;
  if (auto s = o.get("cache_salt")) {
    if (s->k != json_value::kind::string)
      return http_error(422, "cache_salt must be a string");
    if (auto why = check_cache_salt(s->s))
      return http_error(400, why);
    c.salt = s->s;
  }
  return std::nullopt;
}

std::optional<http_answer> unknown_field(const json_object& o,
                                         std::initializer_list<std::string_view> known);

/// A body naming chunks by their tokens, with no members but `known`;
/// `o` is the parsed body, for the caller's own members.
template <class Call>
std::variant<Call, http_answer> token_request(std::string_view body,
                                              std::initializer_list<std::string_view> known,
                                              json_object& o) {
  o = parse_json_object(body);
  if (!o.error.empty())
    return bad_body(o.error);
  if (auto bad = unknown_field(o, known))
    return *bad;
  Call c;
  if (auto bad = token_fields(o, c))
    return *bad;
  return c;
}

std::optional<http_answer> unknown_field(const json_object& o,
                                         std::initializer_list<std::string_view> known) {
  for (auto& [name, v] : o.members)
    if (std::find(known.begin(), known.end(), name) == known.end())
      return http_error(422, "unknown field \"" + name.substr(0, 64) + "\"");
  return std::nullopt;
}

/// LMCache's PrefetchRequest: model_name, world_size, token_ids, cache_salt
/// (""), source_tier ("l2"), target_tier ("l1").
admin_route route_prefetch(std::string_view body) {
  json_object o;
  auto r = token_request<admin_req::prefetch_submit>(
    body, {"model_name", "world_size", "token_ids", "cache_salt", "source_tier", "target_tier"},
    o);
  auto* c = std::get_if<admin_req::prefetch_submit>(&r);
  if (!c)
    return std::get<http_answer>(std::move(r));
  std::string from = "l2", to = "l1";
  for (auto [key, out] : {std::pair{"source_tier", &from}, std::pair{"target_tier", &to}})
    if (auto v = o.get(key)) {
      if (v->k != json_value::kind::string
          || (v->s != "l1" && v->s != "l2" && v->s != "all"))
        return http_error(422, std::string{key} + " must be \"l1\", \"l2\" or \"all\"");
      *out = v->s;
    }
  if (from != "l2" || to != "l1")
    return http_error(400, "unsupported prefetch direction '" + from + "'->'" + to
                              + "'; only 'l2'->'l1'");
  return std::move(*c);
}

/// Decimal digits only, at most 18 of them (no sign, no overflow).
bool small_uint(std::string_view v, uint64_t& out) {
  if (v.empty() || v.size() > 18 || v.find_first_not_of("0123456789") != std::string_view::npos)
    return false;
  out = std::stoull(std::string{v});
  return true;
}

/// An L2 adapter's name as the query or body gives it.
std::optional<http_answer> adapter_name(std::string_view v, std::string& out) {
  if (v.empty() || v.size() > 64)
    return http_error(422, "adapter must be an L2 adapter's type_name (GET /config/adapters)");
  out = std::string{v};
  return std::nullopt;
}

/// GET /cache/objects: LMCache's query (tier, adapter, model_name,
/// page_size, page_token), plus cache_salt; `limit` / `cursor` are taken
/// as page_size / page_token. tier=l2 (the default, as LMCache's) lists an
/// L2 adapter's objects; tier=l1, kvsidecar's L1 chunks.
admin_route route_objects_list(std::string_view query) {
  admin_req::objects_list c;
  while (!query.empty()) {
    auto amp = query.find('&');
    auto pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (pair.empty())
      continue;
    auto eq = pair.find('=');
    auto raw_name = pair.substr(0, eq);
    auto raw_value = eq == std::string_view::npos ? std::string_view{} : pair.substr(eq + 1);
    std::string name, value;
    if (!percent_decode(raw_name, name) || !percent_decode(raw_value, value))
      return http_error(400, "query: malformed %-escape");
    for (auto& ch : value)
      if (ch == '+')
        ch = ' ';
    uint64_t n = 0;
    if (name == "tier") {
      if (value == "all")
        return http_error(400, "tier 'all' not supported; only 'l2' (or 'l1': L1's chunks)");
      if (value != "l1" && value != "l2")
        return http_error(422, "tier must be \"l1\", \"l2\" or \"all\"");
      c.tier = value;
    } else if (name == "adapter") {
      if (auto bad = adapter_name(value, c.adapter))
        return *bad;
    } else if (name == "model_name") {
      if (value.empty() || value.size() > 1024)
        return http_error(422, "model_name must be a non-empty string of at most 1024 bytes");
      c.by_model = true;
      c.model = value;
    } else if (name == "cache_salt") {
      if (auto why = check_cache_salt(value))
        return http_error(400, why);
      c.by_salt = true;
      c.salt = std::string{cache_salt_from_name(value)};
    } else if (name == "page_size" || name == "limit") {
      if (!small_uint(value, n) || n < 1 || n > objects_max_page)
        return http_error(422, name + " must be an integer in 1.."
                                  + std::to_string(objects_max_page));
      c.page_size = static_cast<uint32_t>(n);
    } else if (name == "page_token" || name == "cursor") {
      if (!small_uint(value, n))
        return http_error(400, "malformed " + name + ": pass next_page_token verbatim");
      c.cursor = n;
    } else {
      return http_error(422, "unknown query parameter \"" + name.substr(0, 64)
                                + "\": expected tier, adapter, model_name, cache_salt, "
                                  "page_size, page_token");
    }
  }
  if (c.tier == "l1" && !c.adapter.empty())
    return http_error(400, "adapter selects an L2 adapter; tier=l1 lists L1's chunks");
  return c;
}

/// One EncodedObjectKey: chunk_hash_hex, model_name, kv_rank,
/// object_group_id (0), cache_salt (""). The hash is any even count of hex
/// digits (LMCache's are 64); an L1 key's is kvsidecar's 64-bit hash
/// (route_objects_delete checks that for tier l1). `model_optional`: "" is
/// taken (an L2 key of kvsidecar's format).
std::optional<http_answer> object_key(const json_object& o, size_t at, admin_object_key& k,
                                      bool model_optional) {
  auto where = "keys[" + std::to_string(at) + "]: ";
  for (auto& [name, v] : o.members)
    if (name != "chunk_hash_hex" && name != "model_name" && name != "kv_rank"
        && name != "object_group_id" && name != "cache_salt")
      return http_error(422, where + "unknown field \"" + name.substr(0, 64) + "\"");
  auto h = o.get("chunk_hash_hex");
  if (!h || h->k != json_value::kind::string || h->s.empty() || h->s.size() > 128
      || h->s.size() % 2 != 0 || h->s.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
    return http_error(400, where + "chunk_hash_hex must be 2 to 128 hex digits, an even count");
  k.hash_hex = h->s;
  for (auto& ch : k.hash_hex)
    ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (h->s.size() <= 16)
    k.hash = std::stoull(h->s, nullptr, 16);
  auto m = o.get("model_name");
  if (!m || m->k != json_value::kind::string || (m->s.empty() && !model_optional)
      || m->s.size() > 1024)
    return http_error(422, where + "model_name must be a non-empty string of at most 1024 bytes");
  if (m->s.find('@') != std::string::npos)
    return http_error(400, where + "model_name must not contain '@'");
  k.model = m->s;
  auto r = o.get("kv_rank");
  if (!r || r->k != json_value::kind::number || r->n != static_cast<double>(
                                                  static_cast<int64_t>(r->n))
      || r->n < 0 || r->n > 2147483647.0)
    return http_error(422, where + "kv_rank must be a non-negative integer");
  k.rank = static_cast<int32_t>(r->n);
  if (auto g = o.get("object_group_id")) {
    if (g->k != json_value::kind::number || g->n != static_cast<double>(static_cast<int64_t>(g->n))
        || g->n < 0 || g->n > 4294967295.0)
      return http_error(422, where + "object_group_id must be a non-negative integer");
    k.group = static_cast<uint32_t>(g->n);
  }
  if (auto s = o.get("cache_salt")) {
    if (s->k != json_value::kind::string)
      return http_error(422, where + "cache_salt must be a string");
    if (auto why = check_cache_salt(s->s))
      return http_error(400, where + why);
    k.salt = s->s;
  }
  return std::nullopt;
}

/// DELETE /cache/objects: LMCache's body ({"keys": [EncodedObjectKey...],
/// "tier" ("l2" by default, as LMCache's), "force", "adapter"}), or, for
/// tier "l1", kvsidecar's filter ({"model_name"?, "cache_salt"?}) instead
/// of the keys.
admin_route route_objects_delete(std::string_view body) {
  auto o = parse_json_object(body);
  if (!o.error.empty())
    return bad_body(o.error);
  if (auto bad = unknown_field(o, {"keys", "model_name", "cache_salt", "tier", "force",
                                   "adapter"}))
    return *bad;
  admin_req::objects_delete c;
  if (auto t = o.get("tier")) {
    if (t->k != json_value::kind::string
        || (t->s != "l1" && t->s != "l2" && t->s != "all"))
      return http_error(422, "tier must be \"l1\", \"l2\" or \"all\"");
    c.tier = t->s;
  }
  if (auto ks = o.get("keys")) {
    if (o.get("model_name") || o.get("cache_salt"))
      return http_error(422, "send either \"keys\" or a model_name/cache_salt filter");
    if (ks->k == json_value::kind::int_array && !ks->ints.empty())
      return http_error(422, "keys must be a list of {\"chunk_hash_hex\", \"model_name\", "
                              "\"kv_rank\", \"cache_salt\"} objects");
    if (ks->k != json_value::kind::object_array && ks->k != json_value::kind::int_array)
      return http_error(422, "keys must be a list of objects");
    c.by_keys = true;
    for (size_t i = 0; i < ks->objects.size(); ++i) {
      c.keys.emplace_back();
      auto& k = c.keys.back();
      // kvsidecar-format L2 file names carry no model: their listed keys
      // have model_name "", and delete as listed.
      if (auto bad = object_key(ks->objects[i], i, k, c.tier == "l2"))
        return *bad;
      if (c.tier != "l2" && (k.hash_hex.size() > 16 || k.group != 0))
        return http_error(400, "keys[" + std::to_string(i) + "]: an L1 chunk's key has a "
                                "64-bit chunk_hash_hex (at most 16 hex digits) and "
                                "object_group_id 0");
    }
  }
  if (auto m = o.get("model_name")) {
    if (m->k != json_value::kind::string || m->s.empty() || m->s.size() > 1024)
      return http_error(422, "model_name must be a non-empty string of at most 1024 bytes");
    c.by_model = true;
    c.model = m->s;
  }
  if (auto s = o.get("cache_salt")) {
    if (s->k != json_value::kind::string)
      return http_error(422, "cache_salt must be a string");
    if (auto why = check_cache_salt(s->s))
      return http_error(400, why);
    c.by_salt = true;
    c.salt = std::string{cache_salt_from_name(s->s)};
  }
  if (!c.by_keys && !c.by_model && !c.by_salt)
    return http_error(400, "name what to delete: \"keys\", or, for tier \"l1\", "
                            "\"model_name\" and/or \"cache_salt\" (POST /cache/clear drops "
                            "everything)");
  if (!c.by_keys && c.tier != "l1")
    return http_error(400, "a delete by model_name/cache_salt is L1's (\"tier\": \"l1\"); "
                            "name the \"keys\" for tier '" + c.tier + "'");
  if (auto a = o.get("adapter")) {
    if (a->k != json_value::kind::string)
      return http_error(422, "adapter must be a string");
    if (c.tier == "l1")
      return http_error(400, "adapter selects an L2 adapter; tier 'l1' deletes L1's chunks");
    if (auto bad = adapter_name(a->s, c.adapter))
      return *bad;
  }
  if (auto f = o.get("force")) {
    if (f->k != json_value::kind::boolean)
      return http_error(422, "force must be true or false");
    if (f->b && c.tier != "l2")
      return http_error(501, "force=true is not supported: kvsidecar never drops chunks a "
                              "reader has locked or a copy is writing");
  }
  return c;
}

/// An integer member in [lo, hi], or the 422 naming it.
std::optional<http_answer> int_member(const json_object& o, const char* name, int64_t lo,
                                      int64_t hi, int64_t& out) {
  auto v = o.get(name);
  if (!v)
    return std::nullopt;
  if (v->k != json_value::kind::number || v->n != static_cast<double>(static_cast<int64_t>(v->n))
      || v->n < static_cast<double>(lo) || v->n > static_cast<double>(hi))
    return http_error(422, std::string{name} + " must be an integer in " + std::to_string(lo)
                              + ".." + std::to_string(hi));
  out = static_cast<int64_t>(v->n);
  return std::nullopt;
}

/// LMCache's ChecksumRequest: {"block_ids", "chunk_size" (blocks per
/// chunk), "instance_id", "layerwise"}, each defaulted as LMCache's
/// dataclass defaults them; the emptiness and positivity checks are the
/// backend's (LMCache makes them after looking up the instance).
admin_route route_block_checksums(const json_object& o) {
  if (auto bad = unknown_field(o, {"block_ids", "chunk_size", "instance_id", "layerwise"}))
    return *bad;
  admin_req::block_checksums c;
  if (auto b = o.get("block_ids")) {
    if (b->k != json_value::kind::int_array)
      return http_error(422, "block_ids must be an array of integers");
    c.block_ids = b->ints;
  }
  constexpr int64_t big = int64_t{1} << 53;
  if (auto bad = int_member(o, "chunk_size", -big, big, c.chunk_blocks))
    return *bad;
  if (auto bad = int_member(o, "instance_id", -big, big, c.instance_id))
    return *bad;
  if (auto l = o.get("layerwise")) {
    if (l->k != json_value::kind::boolean)
      return http_error(422, "layerwise must be true or false");
    c.layerwise = l->b;
  }
  return c;
}

/// POST /cache/checksums. LMCache's body names the engine's KV blocks of a
/// registered instance (route_block_checksums). kvsidecar also takes one
/// naming L1 chunks by their tokens, as a prefetch does, plus the kv_rank
/// (0) whose chunks to hash; a body with none of LMCache's members is that.
admin_route route_checksums(std::string_view body) {
  {
    auto o = parse_json_object(body);
    if (!o.error.empty())
      return bad_body(o.error);
    for (auto name : {"block_ids", "chunk_size", "instance_id", "layerwise"})
      if (o.get(name))
        return route_block_checksums(o);
  }
  json_object o;
  auto r = token_request<admin_req::chunk_checksums>(
    body, {"model_name", "world_size", "token_ids", "cache_salt", "kv_rank"}, o);
  auto* c = std::get_if<admin_req::chunk_checksums>(&r);
  if (!c)
    return std::get<http_answer>(std::move(r));
  if (auto k = o.get("kv_rank")) {
    if (k->k != json_value::kind::number || k->n != static_cast<double>(
                                                    static_cast<int64_t>(k->n))
        || k->n < 0 || k->n >= static_cast<double>(c->world_size))
      return http_error(422, "kv_rank must be an integer in 0..world_size-1");
    c->kv_rank = static_cast<int64_t>(k->n);
  }
  return std::move(*c);
}

} // namespace

bool public_path(std::string_view path) {
  return path == "/" || path == "/healthcheck" || path == "/healthz" || path == "/readyz";
}

std::optional<http_answer> check_api_key(std::string_view path, std::string_view authorization,
                                         std::string_view api_key, const admin_policy& p) {
  if (p.api_keys.empty() || public_path(path))
    return std::nullopt;
  // Either header may carry it; either valid one suffices (LMCache's middleware).
  auto bearer = bearer_token(authorization);
  if ((!bearer.empty() && known_key(bearer, p)) || (!api_key.empty() && known_key(api_key, p)))
    return std::nullopt;
  return detail(401, "Invalid or missing API key");
}

admin_route route_admin(std::string_view method, std::string_view path, std::string_view query,
                        std::string_view body, std::string_view authorization,
                        const admin_policy& policy) {
  bool read = method == "GET" || method == "HEAD";
  if (!read) {
    if (auto refused = check_token(authorization, policy))
      return *refused;
  }
  // A read-only call (GET or HEAD), else 405.
  auto only = [&](bool ok, admin_call c) -> admin_route {
    if (!ok)
      return detail(405, "Method Not Allowed");
    return c;
  };
  if (path == "/")
    return only(read, admin_req::root{});
  if (path == "/healthcheck")
    return only(read, admin_req::healthcheck{});
  if (path == "/status")
    return only(read, admin_req::status{});
  if (path == "/config")
    return only(read, admin_req::config{});
  if (path == "/config/adapters")
    return only(read, admin_req::config_adapters{});
  if (path == "/version" || path == "/lmc_version" || path == "/commit_id")
    return only(read, admin_req::version{std::string{path}});
  if (path == "/cache/clear") {
    if (method != "POST")
      return detail(405, "Method Not Allowed");
    return route_clear(body);
  }
  if (path == "/quota")
    return only(read, admin_req::quota_list{});
  if (path == "/cache/prefetches") {
    if (method != "POST")
      return detail(405, "Method Not Allowed");
    return route_prefetch(body);
  }
  if (path == "/cache/objects") {
    if (read)
      return route_objects_list(query);
    if (method == "DELETE")
      return route_objects_delete(body);
    return detail(405, "Method Not Allowed");
  }
  if (path == "/cache/checksums") {
    if (method != "POST")
      return detail(405, "Method Not Allowed");
    return route_checksums(body);
  }
  constexpr std::string_view prefetch_prefix = "/cache/prefetches/";
  if (path.substr(0, prefetch_prefix.size()) == prefetch_prefix) {
    auto id = path.substr(prefetch_prefix.size());
    if (!read)
      return detail(405, "Method Not Allowed");
    if (id.empty() || id.size() > 64
        || id.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
             != std::string_view::npos)
      return http_error(404, "unknown prefetch request_id (ids are letters, digits and '-')");
    return admin_call{admin_req::prefetch_status{std::string{id}}};
  }
  constexpr std::string_view quota_prefix = "/quota/";
  if (path.substr(0, quota_prefix.size()) == quota_prefix) {
    auto name = path.substr(quota_prefix.size());
    std::string decoded;
    if (name.empty() || name.find('/') != std::string_view::npos)
      return detail(404, "Not Found");
    if (!percent_decode(name, decoded))
      return http_error(400, "cache_salt: malformed %-escape in the path");
    if (auto why = check_cache_salt(decoded))
      return http_error(400, why);
    auto salt = std::string{cache_salt_from_name(decoded)};
    if (read)
      return admin_call{admin_req::quota_get{std::move(salt)}};
    if (method == "PUT") {
      admin_req::quota_set c;
      c.salt = std::move(salt);
      return route_quota_set(std::move(c), body);
    }
    if (method == "DELETE")
      return admin_call{admin_req::quota_delete{std::move(salt)}};
    return detail(405, "Method Not Allowed");
  }
  if (auto why = unsupported(path))
    return http_error(501, *why);
  return detail(404, "Not Found");
}

} // namespace kvs
