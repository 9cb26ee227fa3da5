// The HTTP request-head reader (http/http_request): what completes a
// head, what is judged bad at once, and the size limit.
#include "http/http_request.hpp"

#include <doctest/doctest.h>

#include <string>

using namespace kvs;
using st = http_head::state;

namespace {
constexpr size_t max_head = 8192;
} // namespace

TEST_CASE("http head: request line and headers, CRLF or bare LF, query cut off") {
  auto h = parse_http_head("GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n", max_head);
  REQUIRE(h.st == st::complete);
  CHECK(h.method == "GET");
  CHECK(h.path == "/metrics");
  h = parse_http_head("HEAD /readyz?verbose=1 HTTP/1.0\n\n", max_head);
  REQUIRE(h.st == st::complete);
  CHECK(h.method == "HEAD");
  CHECK(h.path == "/readyz");
  // A body after the head is not the parser's business.
  h = parse_http_head("POST /metrics HTTP/1.1\r\nContent-Length: 1\r\n\r\nx", max_head);
  REQUIRE(h.st == st::complete);
  CHECK(h.method == "POST");
}

TEST_CASE("http head: Authorization and X-LMCache-API-Key are kept, names in any case") {
  auto h = parse_http_head("GET /status HTTP/1.1\r\nauthorization: Bearer k1\r\n"
                           "X-LMCACHE-API-KEY: k2\r\n\r\n", max_head);
  REQUIRE(h.st == st::complete);
  CHECK(h.authorization == "Bearer k1");
  CHECK(h.api_key == "k2");
  h = parse_http_head("GET /status HTTP/1.1\r\n\r\n", max_head);
  CHECK(h.authorization.empty());
  CHECK(h.api_key.empty());
}

TEST_CASE("http head: incomplete until the blank line, byte by byte") {
  std::string req = "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";
  for (size_t n = 0; n < req.size(); ++n)
    CHECK_MESSAGE(parse_http_head(req.substr(0, n), max_head).st == st::incomplete, n);
  CHECK(parse_http_head(req, max_head).st == st::complete);
}

TEST_CASE("http head: malformed request lines are 400 with the reason") {
  struct bad_case {
    const char* bytes;
    const char* why;
  };
  for (auto& c : {
         bad_case{"\r\n\r\n", "expected METHOD SP TARGET SP HTTP/1.x"},
         bad_case{"GET\r\n\r\n", "expected METHOD SP TARGET SP HTTP/1.x"},
         bad_case{"GET  HTTP/1.1\r\n\r\n", "expected METHOD SP TARGET SP HTTP/1.x"},
         bad_case{"GET /x HTTP/2\r\n\r\n", "version is not HTTP/1.0 or HTTP/1.1"},
         bad_case{"GET /x\r\n\r\n", "expected METHOD SP TARGET SP HTTP/1.x"},
         bad_case{"GET x HTTP/1.1\r\n\r\n", "target must be a path starting with '/'"},
         bad_case{"G(T /x HTTP/1.1\r\n\r\n", "method is not a token"},
         bad_case{"GET /a\x01 HTTP/1.1\r\n\r\n", "target has a control or non-ASCII byte"},
         bad_case{"GET /\xc3\xa9 HTTP/1.1\r\n\r\n", "target has a control or non-ASCII byte"},
       }) {
    auto h = parse_http_head(c.bytes, max_head);
    CHECK_MESSAGE(h.st == st::bad, c.bytes);
    CHECK(h.status == 400);
    CHECK(std::string{h.why}.find(c.why) != std::string::npos);
  }
}

TEST_CASE("http head: binary garbage is bad on the first bytes, not after the timeout") {
  auto h = parse_http_head(std::string("\x16\x03\x01\x02\x00", 5), max_head); // a TLS hello
  CHECK(h.st == st::bad);
  CHECK(h.status == 400);
  // A method still arriving is fine.
  CHECK(parse_http_head("GE", max_head).st == st::incomplete);
}

TEST_CASE("http head: at the limit without a blank line, or a head past it, is 431") {
  std::string big = "GET /" + std::string(max_head, 'a');
  auto h = parse_http_head(big, max_head);
  CHECK(h.st == st::bad);
  CHECK(h.status == 431);
  std::string long_head = "GET / HTTP/1.1\r\nX: " + std::string(max_head, 'b') + "\r\n\r\n";
  CHECK(parse_http_head(long_head, max_head).status == 431);
  std::string fits = "GET / HTTP/1.1\r\nX: " + std::string(max_head - 40, 'c') + "\r\n\r\n";
  REQUIRE(fits.size() <= max_head);
  CHECK(parse_http_head(fits, max_head).st == st::complete);
}
