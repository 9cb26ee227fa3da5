// libFuzzer target: the control plane's request parsing -- the request head
// (with Content-Length and Authorization), the route and its path
// parameters (%-decoding, cache_salt rules), the query of GET /cache/objects,
// and the JSON body reader.
// Whatever the bytes: a route is a call or an answer with a status the
// server knows and a JSON body; a call's salt passes LMCache's rules; a
// parsed JSON object has no error and at most json_max_members members.
#include "tests/fuzz/fuzz_fail.hpp"
#include "core/cache_salt.hpp"
#include "admin/admin_routes.hpp"
#include "http/http_request.hpp"
#include "http/json_text.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace {

void check_route(std::string_view method, std::string_view path, std::string_view body,
                 std::string_view auth, const kvs::admin_policy& p,
                 std::string_view query = {}) {
  auto r = kvs::route_admin(method, path, query, body, auth, p);
  if (auto* a = std::get_if<kvs::http_answer>(&r)) {
    switch (a->status) {
    case 400: case 401: case 404: case 405: case 422: case 501:
      break;
    default:
      KVS_FUZZ_FAIL();
    }
    if (a->body.empty() || a->body.front() != '{' || a->body.back() != '}')
      KVS_FUZZ_FAIL();
    auto o = kvs::parse_json_object(a->body); // our own answers parse
    if (!o.error.empty())
      KVS_FUZZ_FAIL();
    return;
  }
  if (!p.loopback && method != "GET" && method != "HEAD" && auth != "Bearer 0123456789abcdef")
    KVS_FUZZ_FAIL(); // a state change without the token
  namespace req = kvs::admin_req;
  auto& call = std::get<kvs::admin_call>(r);
  auto salt_ok = [](const std::string& s) { return kvs::check_cache_salt(s) == nullptr; };
  if (auto* q = std::get_if<req::quota_get>(&call); q && !salt_ok(q->salt))
    KVS_FUZZ_FAIL();
  if (auto* q = std::get_if<req::quota_set>(&call); q && !salt_ok(q->salt))
    KVS_FUZZ_FAIL();
  if (auto* q = std::get_if<req::quota_delete>(&call); q && !salt_ok(q->salt))
    KVS_FUZZ_FAIL();
  if (auto* c = std::get_if<req::prefetch_submit>(&call); c && !salt_ok(c->salt))
    KVS_FUZZ_FAIL();
  if (auto* c = std::get_if<req::cache_clear>(&call);
      c && c->tier != "l1" && c->tier != "l2" && c->tier != "all")
    KVS_FUZZ_FAIL(); // a clear names a tier kvsidecar has (force=true is refused: 501)
  if (auto* c = std::get_if<req::objects_list>(&call)) {
    if (!salt_ok(c->salt))
      KVS_FUZZ_FAIL();
    if (c->page_size < 1 || c->page_size > kvs::objects_max_page)
      KVS_FUZZ_FAIL(); // a page is always bounded
    if (c->tier != "l1" && c->tier != "l2")
      KVS_FUZZ_FAIL(); // objects: tier l2 (LMCache's default) or l1
    if (c->tier == "l1" && !c->adapter.empty())
      KVS_FUZZ_FAIL(); // an adapter is L2's
  }
  if (auto* c = std::get_if<req::objects_delete>(&call)) {
    if (!salt_ok(c->salt))
      KVS_FUZZ_FAIL();
    for (auto& k : c->keys)
      if (!salt_ok(k.salt) || k.rank < 0)
        KVS_FUZZ_FAIL();
    if (!c->by_keys && !c->by_model && !c->by_salt)
      KVS_FUZZ_FAIL(); // a delete always names what (a clear is another call)
    if (!c->by_keys && c->tier != "l1")
      KVS_FUZZ_FAIL(); // L2 is deleted from by LMCache's keys only
    if (c->tier != "l1" && c->tier != "l2" && c->tier != "all")
      KVS_FUZZ_FAIL(); // objects: tier l2 (LMCache's default), l1, or all for a delete
    if (c->tier == "l1" && !c->adapter.empty())
      KVS_FUZZ_FAIL(); // an adapter is L2's
  }
  if (auto* c = std::get_if<req::chunk_checksums>(&call)) {
    if (!salt_ok(c->salt))
      KVS_FUZZ_FAIL();
    if (c->kv_rank < 0 || c->kv_rank >= c->world_size)
      KVS_FUZZ_FAIL();
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  // 1. The bytes as a JSON body.
  auto o = kvs::parse_json_object(in);
  if (!o.error.empty() && !o.members.empty())
    KVS_FUZZ_FAIL();
  if (o.members.size() > kvs::json_max_members)
    KVS_FUZZ_FAIL();
  // 2. The bytes as a whole request: head, then the body it announces.
  auto h = kvs::parse_http_head(in, 8192);
  if (h.st == kvs::http_head::state::complete) {
    if (h.head_size == 0 || h.head_size > in.size())
      KVS_FUZZ_FAIL();
    auto body = in.substr(h.head_size, h.content_length);
    for (const auto& p : {kvs::admin_policy{true, "", {}}, kvs::admin_policy{false, "0123456789abcdef", {}}})
      check_route(h.method, h.path, body, h.authorization, p, h.query);
  }
  // 3. The bytes as a path under /quota/ and as a body of each body route.
  std::string path = "/quota/";
  path.append(in.substr(0, 300));
  kvs::admin_policy local{true, "", {}};
  for (auto m : {"GET", "PUT", "DELETE"})
    check_route(m, path, in, {}, local);
  check_route("POST", "/cache/clear", in, {}, local);
  check_route("DELETE", "/cache/objects", in, {}, local);
  check_route("POST", "/cache/checksums", in, {}, local);
  check_route("GET", "/cache/objects", {}, {}, local, in.substr(0, 2048)); // as a query
  return 0;
}
