// admin_routes and json_text: LMCache's control-plane paths, their bodies,
// their validation and the bearer-token rule; the flat JSON reader.
#include "admin/admin_routes.hpp"
#include "http/http_request.hpp"
#include "http/json_text.hpp"

#include <doctest/doctest.h>

using namespace kvs;

namespace {

const admin_policy loopback{};
const admin_policy exposed{false, "0123456789abcdef", {}};

/// The call a request routes to, which must be a T (the operation).
template <class T>
T call(std::string_view method, std::string_view path, std::string_view body = {},
       const admin_policy& p = loopback, std::string_view auth = {}) {
  auto r = route_admin(method, path, {}, body, auth, p);
  auto* c = std::get_if<admin_call>(&r);
  REQUIRE_MESSAGE(c, std::get<http_answer>(r).body);
  auto* t = std::get_if<T>(c);
  REQUIRE_MESSAGE(t, path);
  return *t;
}

http_answer answer(std::string_view method, std::string_view path, std::string_view body = {},
                   const admin_policy& p = loopback, std::string_view auth = {}) {
  auto r = route_admin(method, path, {}, body, auth, p);
  auto* a = std::get_if<http_answer>(&r);
  REQUIRE_MESSAGE(a, path);
  return *a;
}

} // namespace

TEST_CASE("the paths the lmcache CLI calls become calls") {
  call<admin_req::root>("GET", "/");
  call<admin_req::healthcheck>("GET", "/healthcheck");
  call<admin_req::status>("HEAD", "/status");
  call<admin_req::config>("GET", "/config");
  call<admin_req::config_adapters>("GET", "/config/adapters");
  for (auto v : {"/version", "/lmc_version", "/commit_id"}) {
    auto c = call<admin_req::version>("GET", v);
    CHECK(c.path == v);
  }
  call<admin_req::quota_list>("GET", "/quota");
  auto g = call<admin_req::quota_get>("GET", "/quota/_default");
  CHECK(g.salt.empty()); // LMCache's sentinel for the un-salted traffic
  auto s = call<admin_req::quota_set>("PUT", "/quota/tenant%2Da", R"({"limit_gb": 1.5})");
  CHECK(s.salt == "tenant-a");
  CHECK(s.limit_gb == 1.5);
  CHECK(s.limit_bytes == 1610612736u);
  CHECK(call<admin_req::quota_set>("PUT", "/quota/t", R"({"limit_gb": 0})").limit_bytes == 0);
  call<admin_req::quota_delete>("DELETE", "/quota/t");
  auto clear = call<admin_req::cache_clear>("POST", "/cache/clear", R"({"tier": "l1"})");
  CHECK(clear.tier == "l1");
  call<admin_req::cache_clear>("POST", "/cache/clear"); // no body: l1
  call<admin_req::cache_clear>("POST", "/cache/clear", R"({"tier": "l1", "force": false})");
}

TEST_CASE("bad parameters are answered with what was wrong") {
  auto a = answer("PUT", "/quota/a@b", R"({"limit_gb": 1})");
  CHECK(a.status == 400);
  CHECK(a.body.find("'@'") != std::string::npos);
  CHECK(answer("PUT", "/quota/a%40b", R"({"limit_gb": 1})").status == 400); // decoded first
  CHECK(answer("PUT", "/quota/a%4", R"({"limit_gb": 1})").status == 400);
  CHECK(answer("PUT", "/quota/a%zz", R"({"limit_gb": 1})").status == 400);
  CHECK(answer("GET", "/quota/" + std::string(129, 'x')).status == 400);
  CHECK(answer("GET", "/quota/a/b").status == 404);
  CHECK(answer("GET", "/quota/").status == 404);
  CHECK(answer("PUT", "/quota/t", "").body.find("invalid JSON body") != std::string::npos);
  CHECK(answer("PUT", "/quota/t", "{}").body.find("limit_gb") != std::string::npos);
  CHECK(answer("PUT", "/quota/t", R"({"limit_gb": "1"})").body.find("numeric")
        != std::string::npos);
  CHECK(answer("PUT", "/quota/t", R"({"limit_gb": -1})").body.find("non-negative")
        != std::string::npos);
  CHECK(answer("PUT", "/quota/t", R"({"limit_gb": 1e400})").body.find("finite")
        != std::string::npos);
  CHECK(answer("PUT", "/quota/t", R"({"limit_gb": 1e300})").status == 400);
  CHECK(answer("PUT", "/quota/t", R"({"limit_gb": [1]})").status == 400);
  // Every tier LMCache names is a call; the backend says what it cleared.
  CHECK(call<admin_req::cache_clear>("POST", "/cache/clear", R"({"tier": "l2"})").tier == "l2");
  CHECK(call<admin_req::cache_clear>("POST", "/cache/clear", R"({"tier": "all"})").tier == "all");
  CHECK(call<admin_req::cache_clear>("POST", "/cache/clear").tier == "l1");
  CHECK(answer("POST", "/cache/clear", R"({"tier": "gpu"})").status == 422);
  CHECK(answer("POST", "/cache/clear", R"({"tier": 1})").status == 422);
  CHECK(answer("POST", "/cache/clear", R"({"force": "yes"})").status == 422);
  CHECK(answer("POST", "/cache/clear", R"({"force": true})").status == 501);
  CHECK(answer("POST", "/cache/clear", R"({"tierr": "l1"})").status == 422);
}

TEST_CASE("unknown paths 404, wrong methods 405, what kvsidecar lacks 501 with a reason") {
  auto nf = answer("GET", "/nope");
  CHECK(nf.status == 404);
  CHECK(nf.body == R"({"detail":"Not Found"})"); // FastAPI's shape
  CHECK(answer("POST", "/status").status == 405);
  CHECK(answer("GET", "/cache/clear").status == 405);
  CHECK(answer("POST", "/quota/t/x").status == 404);
  CHECK(answer("PATCH", "/quota/t").status == 405);
  for (auto p : {"/reconfigure/dax/l1/status", "/run_script", "/threads", "/periodic-threads",
                 "/periodic-threads-health", "/env", "/loglevel", "/metrics/reset"}) {
    auto a = answer(std::string_view{p} == "/run_script" ? "POST" : "GET", p);
    CHECK_MESSAGE(a.status == 501, p);
    CHECK(a.body.find("\"error\"") != std::string::npos);
  }
}

TEST_CASE("prefetches: LMCache's PrefetchRequest, validated; status by request id") {
  auto p = call<admin_req::prefetch_submit>("POST", "/cache/prefetches",
                R"({"model_name": "m/x", "world_size": 2, "token_ids": [1, 2, 3],
                    "cache_salt": "t", "source_tier": "l2", "target_tier": "l1"})");
  CHECK(p.model == "m/x");
  CHECK(p.world_size == 2);
  CHECK(p.tokens == std::vector<int64_t>{1, 2, 3});
  CHECK(p.salt == "t");
  CHECK(call<admin_req::prefetch_submit>("POST", "/cache/prefetches",
             R"({"model_name": "m", "world_size": 1, "token_ids": []})").tokens.empty());
  auto s = call<admin_req::prefetch_status>("GET", "/cache/prefetches/pf-12");
  CHECK(s.request_id == "pf-12");
  CHECK(answer("GET", "/cache/prefetches/a_b").status == 404);
  CHECK(answer("GET", "/cache/prefetches").status == 405);
  CHECK(answer("POST", "/cache/prefetches/pf-1").status == 405);
  for (auto bad : {R"({"world_size": 1, "token_ids": [1]})",
                   R"({"model_name": "", "world_size": 1, "token_ids": [1]})",
                   R"({"model_name": "m", "world_size": 0, "token_ids": [1]})",
                   R"({"model_name": "m", "world_size": 1.5, "token_ids": [1]})",
                   R"({"model_name": "m", "world_size": 1, "token_ids": "1"})",
                   R"({"model_name": "m", "world_size": 1, "token_ids": [1], "x": 1})"})
    CHECK_MESSAGE(answer("POST", "/cache/prefetches", bad).status == 422, bad);
  auto frac = answer("POST", "/cache/prefetches",
                     R"({"model_name": "m", "world_size": 1, "token_ids": [1.5]})");
  CHECK(frac.status == 400); // the body reader refuses it: integers only
  CHECK(frac.body.find("only integers") != std::string::npos);
  CHECK(answer("POST", "/cache/prefetches",
               R"({"model_name": "m", "world_size": 1, "token_ids": [1], "cache_salt": "a@b"})")
          .status == 400);
  auto dir = answer("POST", "/cache/prefetches",
                    R"({"model_name": "m", "world_size": 1, "token_ids": [1],
                        "source_tier": "l1", "target_tier": "l2"})");
  CHECK(dir.status == 400);
  CHECK(dir.body.find("only 'l2'->'l1'") != std::string::npos);
}

admin_req::objects_list list(std::string_view query) {
  auto r = route_admin("GET", "/cache/objects", query, {}, {}, loopback);
  auto* c = std::get_if<admin_call>(&r);
  REQUIRE_MESSAGE(c, std::get<http_answer>(r).body);
  auto* l = std::get_if<admin_req::objects_list>(c);
  REQUIRE(l);
  return *l;
}

int list_status(std::string_view query) {
  auto r = route_admin("GET", "/cache/objects", query, {}, {}, loopback);
  auto* a = std::get_if<http_answer>(&r);
  REQUIRE_MESSAGE(a, query);
  return a->status;
}

TEST_CASE("GET /cache/objects: LMCache's query, paged and bounded; L2 by default, L1 on request") {
  auto d = list("");
  CHECK(d.tier == "l2"); // LMCache's default tier
  CHECK(d.adapter.empty()); // the first adapter
  CHECK(d.page_size == objects_default_page);
  CHECK(objects_default_page == 500); // LMCache's _DEFAULT_PAGE_SIZE / _MAX_PAGE_SIZE
  CHECK(objects_max_page == 5000);
  CHECK(d.cursor == 0);
  CHECK(!d.by_model);
  CHECK(!d.by_salt);
  auto q = list("tier=l1&model_name=org%2Fm&cache_salt=_default&page_size=5000&page_token=42");
  CHECK(q.tier == "l1");
  CHECK(q.page_size == 5000);
  CHECK(q.cursor == 42);
  CHECK(q.by_model);
  CHECK(q.model == "org/m");
  CHECK(q.by_salt);
  CHECK(q.salt.empty()); // "_default" is the empty salt
  CHECK(list("limit=7&cursor=9").page_size == 7); // aliases
  CHECK(list("cache_salt=t%2Da&").salt == "t-a");
  auto a = list("tier=l2&adapter=redis");
  CHECK(a.tier == "l2");
  CHECK(a.adapter == "redis");
  for (auto bad : {"page_size=0", "page_size=5001", "page_size=-1", "page_size=1e3",
                   "limit=", "tier=l3", "model_name=", "x=1", "adapter="})
    CHECK_MESSAGE(list_status(bad) == 422, bad);
  for (auto bad : {"tier=all", "tier=l1&adapter=disk", "page_token=abc",
                   "page_token=99999999999999999999", "cache_salt=a%40b", "cache_salt=%4"})
    CHECK_MESSAGE(list_status(bad) == 400, bad);
  CHECK(answer("POST", "/cache/objects", "{}").status == 405);
}

TEST_CASE("DELETE /cache/objects: L2 by LMCache's keys by default; L1 by keys or filter") {
  auto d = call<admin_req::objects_delete>("DELETE", "/cache/objects", R"({"cache_salt": "t", "tier": "l1"})");
  CHECK(d.by_salt);
  CHECK(!d.by_model);
  CHECK(d.salt == "t");
  auto m = call<admin_req::objects_delete>("DELETE", "/cache/objects",
                R"({"model_name": "m", "cache_salt": "", "tier": "l1", "force": false})");
  CHECK(m.by_model);
  CHECK(m.model == "m");
  CHECK(m.by_salt);
  CHECK(m.salt.empty());
  for (auto [body, status] : std::initializer_list<std::pair<const char*, int>>{
         {R"({"tier": "l1"})", 400},                        // no filter: not a clear
         {R"({"cache_salt": "t"})", 400},                   // tier unsaid: l2, which takes keys
         {R"({"cache_salt": "t", "tier": "l2"})", 400},
         {R"({"cache_salt": "t", "tier": "all"})", 400},
         {R"({"keys": [{"chunk_hash_hex": "ab", "model_name": "m", "kv_rank": 0}],
              "tier": "all", "force": true})", 501},      // force: L1's locks
         {R"({"keys": [{"chunk_hash_hex": "ab", "model_name": "m", "kv_rank": 0}],
              "adapter": ""})", 422},
         {R"({"keys": [{"chunk_hash_hex": "ab", "model_name": "m", "kv_rank": 0,
              "object_group_id": -1}]})", 422},
         {R"({"cache_salt": "t", "tier": "x"})", 422},
         {R"({"cache_salt": "a@b", "tier": "l1"})", 400},
         {R"({"cache_salt": 1, "tier": "l1"})", 422},
         {R"({"model_name": "", "tier": "l1"})", 422},
         {R"({"cache_salt": "t", "tier": "l1", "force": true})", 501},
         {R"({"cache_salt": "t", "tier": "l1", "force": 1})", 422},
         {R"({"cache_salt": "t", "tier": "l1", "adapter": "fs"})", 400},
         {R"({"cache_salt": "t", "tier": "l1", "what": 1})", 422},
         {R"({"keys": [{"chunk_hash_hex": "abc", "model_name": "m", "kv_rank": 0}],
              "tier": "l1"})", 400},
         {R"({"keys": [{"chunk_hash_hex": "00112233445566778899", "model_name": "m",
              "kv_rank": 0}], "tier": "l1"})", 400},
         {R"({"keys": [{"chunk_hash_hex": "zz", "model_name": "m", "kv_rank": 0}],
              "tier": "l1"})", 400},
         {R"({"keys": [{"chunk_hash_hex": "ab", "model_name": "a@b", "kv_rank": 0}],
              "tier": "l1"})", 400},
         {R"({"keys": [{"chunk_hash_hex": "ab", "model_name": "m", "kv_rank": -1}],
              "tier": "l1"})", 422},
         {R"({"keys": [{"chunk_hash_hex": "ab", "model_name": "m", "kv_rank": 0,
              "cache_salt": "a/b"}], "tier": "l1"})", 400},
         {R"({"keys": [{"chunk_hash_hex": "ab", "model_name": "m", "kv_rank": 0,
              "object_group_id": 1}], "tier": "l1"})", 400},
         {R"({"keys": [{"chunk_hash_hex": "ab", "model_name": "m", "kv_rank": 0, "x": 1}],
              "tier": "l1"})", 422},
         {R"({"keys": [1, 2], "tier": "l1"})", 422},
         {R"({"keys": "ab", "tier": "l1"})", 422},
         {R"({"keys": [], "cache_salt": "t", "tier": "l1"})", 422},
         {"not json", 400}}) {
    const char* request = body; // clang 14: the message's lambda cannot name a structured binding
    CHECK_MESSAGE(answer("DELETE", "/cache/objects", request).status == status, request);
  }
  // LMCache's own body: a list of EncodedObjectKeys.
  auto k = call<admin_req::objects_delete>("DELETE", "/cache/objects",
                R"({"keys": [{"chunk_hash_hex": "00000000000000ff", "model_name": "org/m",
                              "kv_rank": 3, "object_group_id": 0, "cache_salt": "t"},
                             {"chunk_hash_hex": "AB", "model_name": "m", "kv_rank": 0}],
                    "tier": "l1", "force": false})");
  CHECK(k.by_keys);
  REQUIRE(k.keys.size() == 2);
  CHECK(k.keys[0].hash == 255);
  CHECK(k.keys[0].rank == 3);
  CHECK(k.keys[0].model == "org/m");
  CHECK(k.keys[0].salt == "t");
  CHECK(k.keys[1].hash == 0xab);
  CHECK(k.keys[1].hash_hex == "ab");
  CHECK(k.keys[1].salt.empty());
  // Tier unsaid: L2, as LMCache; its keys are LMCache's (32-byte hashes,
  // packed kv_rank, any object group), the adapter by type name.
  const std::string h64(64, 'c');
  auto l2 = call<admin_req::objects_delete>("DELETE", "/cache/objects",
                 R"({"keys": [{"chunk_hash_hex": ")" + h64 + R"(", "model_name": "org/m",
                               "kv_rank": 16777472, "object_group_id": 2, "cache_salt": "t"}],
                     "adapter": "disk", "force": true})");
  CHECK(l2.tier == "l2");
  CHECK(l2.adapter == "disk");
  REQUIRE(l2.keys.size() == 1);
  CHECK(l2.keys[0].hash_hex == h64);
  CHECK(l2.keys[0].rank == 16777472);
  CHECK(l2.keys[0].group == 2);
  // A kvsidecar-format L2 key as listed (its file name carries no model).
  auto nameless = call<admin_req::objects_delete>("DELETE", "/cache/objects",
                       R"({"keys": [{"chunk_hash_hex": "00000000000000ff", "model_name": "",
                                     "kv_rank": 0}]})");
  CHECK(nameless.keys.at(0).model.empty());
  CHECK(answer("DELETE", "/cache/objects",
               R"({"keys": [{"chunk_hash_hex": "ff", "model_name": "", "kv_rank": 0}],
                   "tier": "all"})").status == 422);
  CHECK(answer("DELETE", "/cache/objects",
               R"({"keys": [{"chunk_hash_hex": ")" + h64 + R"(", "model_name": "m",
                             "kv_rank": 0}], "tier": "l1"})").status == 400); // not an L1 key
  auto none = call<admin_req::objects_delete>("DELETE", "/cache/objects", R"({"keys": [], "tier": "l1"})");
  CHECK(none.by_keys);
  CHECK(none.keys.empty());
  // It changes state: off loopback it needs the token.
  CHECK(answer("DELETE", "/cache/objects", R"({"cache_salt": "t", "tier": "l1"})", exposed)
          .status == 401);
}

TEST_CASE("POST /cache/checksums: chunks by token ids, or LMCache's engine block ids") {
  auto c = call<admin_req::chunk_checksums>("POST", "/cache/checksums",
                R"({"model_name": "m", "world_size": 2, "token_ids": [1, 2], "cache_salt": "t",
                    "kv_rank": 1})");
  CHECK(c.world_size == 2);
  CHECK(c.kv_rank == 1);
  CHECK(c.salt == "t");
  CHECK(c.tokens == std::vector<int64_t>{1, 2});
  CHECK(call<admin_req::chunk_checksums>("POST", "/cache/checksums", R"({"model_name": "m", "world_size": 1,
                                             "token_ids": []})").kv_rank == 0);
  // LMCache's ChecksumRequest, as `lmcache bench server` sends it.
  auto b = call<admin_req::block_checksums>("POST", "/cache/checksums",
                R"({"block_ids": [4, 5, 6, 9], "chunk_size": 2, "instance_id": 7,
                    "layerwise": true})");
  CHECK(b.block_ids == std::vector<int64_t>{4, 5, 6, 9});
  CHECK(b.chunk_blocks == 2);
  CHECK(b.instance_id == 7);
  CHECK(b.layerwise);
  // Its dataclass defaults: emptiness and chunk_size are judged after the
  // instance lookup (the backend's, as LMCache orders them).
  auto d = call<admin_req::block_checksums>("POST", "/cache/checksums", R"({"instance_id": 3})");
  CHECK(d.block_ids.empty());
  CHECK(d.chunk_blocks == 0);
  CHECK_FALSE(d.layerwise);
  // The body reader takes arrays of integers only: anything else there is a 400.
  CHECK(answer("POST", "/cache/checksums", R"({"block_ids": [1, 2.5], "chunk_size": 1})")
          .status == 400);
  for (auto bad : {R"({"block_ids": "1", "chunk_size": 1})",
                   R"({"block_ids": [1], "chunk_size": 1.5})",
                   R"({"block_ids": [1], "chunk_size": 1, "instance_id": "a"})",
                   R"({"block_ids": [1], "chunk_size": 1, "layerwise": 1})",
                   R"({"block_ids": [1], "chunk_size": 1, "token_ids": [1]})"})
    CHECK_MESSAGE(answer("POST", "/cache/checksums", bad).status == 422, std::string{bad});
  for (auto bad : {R"({"model_name": "m", "world_size": 2, "token_ids": [1], "kv_rank": 2})",
                   R"({"model_name": "m", "world_size": 1, "token_ids": [1], "kv_rank": -1})",
                   R"({"model_name": "m", "world_size": 1, "token_ids": [1], "kv_rank": 0.5})",
                   R"({"model_name": "m", "world_size": 1, "token_ids": [1], "y": 0})",
                   R"({"world_size": 1, "token_ids": [1]})"})
    CHECK_MESSAGE(answer("POST", "/cache/checksums", bad).status == 422, bad);
  CHECK(answer("GET", "/cache/checksums").status == 405);
}

TEST_CASE("off loopback, state changes need the bearer token; reads stay open") {
  call<admin_req::objects_list>("GET", "/cache/objects", {}, exposed);
  call<admin_req::status>("GET", "/status", {}, exposed);
  call<admin_req::quota_get>("GET", "/quota/t", {}, exposed);
  auto none = answer("POST", "/cache/clear", {}, exposed);
  CHECK(none.status == 401);
  CHECK(none.body.find("Bearer") != std::string::npos);
  CHECK(answer("PUT", "/quota/t", R"({"limit_gb": 1})", exposed, "Bearer wrong-token-123456")
          .status == 401);
  CHECK(answer("DELETE", "/quota/t", {}, exposed, "0123456789abcdef").status == 401);
  CHECK(answer("POST", "/run_script", {}, exposed).status == 401); // before anything else
  call<admin_req::quota_set>("PUT", "/quota/t", R"({"limit_gb": 1})", exposed, "Bearer 0123456789abcdef");
  call<admin_req::cache_clear>("POST", "/cache/clear", {}, exposed, "Bearer 0123456789abcdef");
  // No token configured and not loopback: every state change is refused.
  admin_policy open{false, "", {}};
  auto a = answer("POST", "/cache/clear", {}, open, "Bearer ");
  CHECK(a.status == 401);
  CHECK(a.body.find("http.admin_token") != std::string::npos);
}

TEST_CASE("API keys (LMCache 0.5.7): every path but the public ones needs one, reads included") {
  admin_policy keyed{true, "", {"old-key-0123456789", "new-key-0123456789"}};
  auto denied = [&](std::string_view path, std::string_view auth, std::string_view key = {}) {
    return check_api_key(path, auth, key, keyed).has_value();
  };
  // Public: LMCache's / and /healthcheck, and kvsidecar's probes.
  for (auto path : {"/", "/healthcheck", "/healthz", "/readyz"}) {
    CHECK(public_path(path));
    CHECK_FALSE(denied(path, ""));
  }
  for (auto path : {"/status", "/config", "/quota", "/cache/objects", "/metrics", "/cache/clear",
                    "/version", "/nope", "/healthcheck/", "/HEALTHCHECK"}) {
    CHECK_MESSAGE(denied(path, ""), std::string{path});
    auto a = check_api_key(path, "Bearer wrong", {}, keyed);
    REQUIRE(a);
    CHECK(a->status == 401);
    CHECK(a->body == R"({"detail":"Invalid or missing API key"})");
  }
  // Both keys at once (rotation); the scheme in any case; the other header.
  CHECK_FALSE(denied("/status", "Bearer old-key-0123456789"));
  CHECK_FALSE(denied("/status", "Bearer new-key-0123456789"));
  CHECK_FALSE(denied("/status", "bEaReR new-key-0123456789"));
  CHECK_FALSE(denied("/metrics", "", "old-key-0123456789"));
  CHECK_FALSE(denied("/metrics", "Bearer wrong", "old-key-0123456789")); // either suffices
  CHECK(denied("/status", "Bearer old-key-012345678"));                  // a prefix is not it
  CHECK(denied("/status", "Bearer old-key-01234567890"));
  CHECK(denied("/status", "old-key-0123456789"));                        // no scheme
  CHECK(denied("/status", "Basic old-key-0123456789"));
  CHECK(denied("/status", "Bearer "));
  CHECK(denied("/status", "", "Bearer old-key-0123456789"));             // the header is the bare key
  // No keys: nothing is asked (the loopback default and admin_token rules as before).
  CHECK_FALSE(check_api_key("/status", "", "", loopback));
  CHECK_FALSE(check_api_key("/metrics", "", "", exposed));
  // The admin token is accepted as a key too.
  admin_policy both{false, "0123456789abcdef", {"a-key-0123456789"}};
  CHECK_FALSE(check_api_key("/status", "Bearer 0123456789abcdef", "", both));
  // Off loopback a key also opens the state changes; without any token or key they stay shut.
  call<admin_req::cache_clear>("POST", "/cache/clear", {}, both, "Bearer a-key-0123456789");
  call<admin_req::cache_clear>("POST", "/cache/clear", {}, both, "Bearer 0123456789abcdef");
  CHECK(answer("POST", "/cache/clear", {}, both, "Bearer a-key-012345678").status == 401);
  admin_policy keys_only{false, "", {"a-key-0123456789"}};
  call<admin_req::quota_set>("PUT", "/quota/t", R"({"limit_gb": 1})", keys_only, "Bearer a-key-0123456789");
}

TEST_CASE("parse_json_object reads flat objects and names what is wrong") {
  auto o = parse_json_object(R"( {"a": "x\u00e9\n", "b": -1.5e2, "c": true, "d": null} )");
  REQUIRE(o.error.empty());
  CHECK(o.get("a")->s == "x\xc3\xa9\n");
  CHECK(o.get("b")->n == -150);
  CHECK(o.get("c")->b);
  CHECK(o.get("d")->k == json_value::kind::null);
  CHECK(parse_json_object("{}").error.empty());
  CHECK(parse_json_object(R"({"s": "\ud83d\ude00"})").get("s")->s == "\xf0\x9f\x98\x80");
  auto arr = parse_json_object(R"({"t": [1, -2, 9007199254740992], "e": [ ]})");
  REQUIRE(arr.error.empty());
  CHECK(arr.get("t")->ints == std::vector<int64_t>{1, -2, 9007199254740992});
  CHECK(arr.get("e")->k == json_value::kind::int_array);
  CHECK(!parse_json_object(R"({"t": [9007199254740993e0]})").error.empty());
  for (auto bad : {"", "[]", "{", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "{\"a\":1} x",
                   "{\"a\":{}}", "{\"a\":[1.5]}", "{\"a\":[\"x\"]}", "{\"a\":[1,]}", "{\"a\":[[1]]}", "{\"a\":01}", "{\"a\":1.}", "{\"a\":\"\\x\"}",
                   "{\"a\":\"\\ud800\"}", "{\"a\":1,\"a\":2}", "{\"a\":tru}", "{a:1}",
                   "{\"a\":\"unterminated}"}) {
    auto e = parse_json_object(bad);
    CHECK_MESSAGE(!e.error.empty(), bad);
    CHECK(e.members.empty());
  }
  std::string many = "{";
  for (size_t i = 0; i <= json_max_members; ++i)
    many += (i ? "," : "") + std::string{"\"k"} + std::to_string(i) + "\":1";
  many += "}";
  CHECK(parse_json_object(many).error.find("members") != std::string::npos);
}

TEST_CASE("parse_json_object reads arrays of flat objects, one level deep") {
  auto o = parse_json_object(R"({"keys": [ {"h": "ab", "r": 1}, {"h": "cd"} ], "t": "l1"})");
  REQUIRE_MESSAGE(o.error.empty(), o.error);
  auto* k = o.get("keys");
  REQUIRE(k->k == json_value::kind::object_array);
  REQUIRE(k->objects.size() == 2);
  CHECK(k->objects[0].get("h")->s == "ab");
  CHECK(k->objects[0].get("r")->n == 1);
  CHECK(k->objects[1].members.size() == 1);
  for (auto bad : {R"({"k": [{"a": [1]}]})", R"({"k": [{"a": {}}]})", R"({"k": [{}, 1]})",
                   R"({"k": [{"a": 1},]})", R"({"k": [{"a": 1, "a": 2}]})", R"({"k": [{]})",
                   R"({"k": [{"a": [{"b": 1}]}]})"})
    CHECK_MESSAGE(!parse_json_object(bad).error.empty(), bad);
  std::string many = R"({"k": [)";
  for (size_t i = 0; i <= json_max_objects; ++i)
    many += i ? ",{}" : "{}";
  many += "]}";
  CHECK(parse_json_object(many).error.find("objects in an array") != std::string::npos);
}

TEST_CASE("json_writer escapes and keeps floats floats") {
  json_writer w;
  w.begin_object().str("a\"", "x\\y\n\x01").num("f", 2).integer("i", 7).boolean("b", false)
    .begin_array("l").num("", 0.5).end_array().end_object();
  CHECK(w.take() == R"({"a\"":"x\\y\n\u0001","f":2.0,"i":7,"b":false,"l":[0.5]})");
}

TEST_CASE("the request head reader takes Content-Length, Authorization and the query") {
  std::string req = "PUT /quota/t?x=1 HTTP/1.1\r\nHost: h\r\ncontent-length: 17\r\n"
                    "Authorization: Bearer abc\r\n\r\n{\"limit_gb\": 1.0}";
  auto h = parse_http_head(req, 8192);
  REQUIRE(h.st == http_head::state::complete);
  CHECK(h.path == "/quota/t");
  CHECK(h.query == "x=1");
  CHECK(h.content_length == 17);
  CHECK(h.authorization == "Bearer abc");
  CHECK(req.substr(h.head_size) == "{\"limit_gb\": 1.0}");
  for (auto bad : {"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
                   "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                   "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                   "POST / HTTP/1.1\r\nno colon here\r\n\r\n"}) {
    auto b = parse_http_head(bad, 8192);
    CHECK_MESSAGE(b.st == http_head::state::bad, bad);
    CHECK(b.status == 400);
  }
}
