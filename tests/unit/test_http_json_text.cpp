// json_text's reader on simdjson: a bad body's error names what was wrong
// and where (the member, the byte), as the old hand-written reader did.
#include "http/json_text.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <string>

using namespace kvs;

namespace {
std::string error_of(std::string_view body) {
  auto o = parse_json_object(body);
  CHECK(o.members.empty());
  return o.error;
}
} // namespace

TEST_CASE("a bad body's error names the member and the byte") {
  CHECK(error_of(R"({"a":1} x)").find("at byte 8") != std::string::npos);
  CHECK(error_of(R"({"a":1}})") == "bytes after the object at byte 7");
  CHECK(error_of("[]") == "expected a JSON object at byte 0");
  CHECK(error_of(R"({"a":{}})") == "member \"a\": nested objects are not accepted at byte 5");
  CHECK(error_of(R"({"t":[1, 2.5]})")
        == "member \"t\": an array may hold only integers (at most 2^53) at byte 9");
  CHECK(error_of(R"({"k": [{}, 1]})")
        == "member \"k\": an array of objects holds only objects at byte 11");
  CHECK(error_of(R"({"a":1,"a":2})") == "member \"a\" given twice at byte 11");
  auto num = error_of(R"({"limit_gb": 01})");
  CHECK(num.find("member \"limit_gb\"") == 0);
  CHECK(num.find("number at byte 13") != std::string::npos);
  CHECK(error_of(R"({"a":"\x"})").find("member \"a\": Problem while parsing a string") == 0);
  CHECK(!error_of(R"({"a":"unterminated})").empty());
  CHECK(!error_of("{\"a\":\"\x01\"}").empty());
  CHECK(!error_of("{\"a\":\"\xff\"}").empty()); // not UTF-8
}

TEST_CASE("a number beyond a double reads as infinity, so routes can say it must be finite") {
  auto o = parse_json_object(R"({"limit_gb": 1e400, "n": -1e400})");
  REQUIRE_MESSAGE(o.error.empty(), o.error);
  CHECK(o.get("limit_gb")->n == HUGE_VAL);
  CHECK(o.get("n")->n == -HUGE_VAL);
  CHECK(!parse_json_object(R"({"t": [1e400]})").error.empty());
}

TEST_CASE("the parser kept per thread reads a small body after a large one") {
  std::string big = R"({"token_ids": [)";
  for (int i = 0; i < 5000; ++i)
    big += (i ? "," : "") + std::to_string(i);
  big += "]}";
  auto b = parse_json_object(big);
  REQUIRE_MESSAGE(b.error.empty(), b.error);
  CHECK(b.get("token_ids")->ints.size() == 5000);
  CHECK(b.get("token_ids")->ints.back() == 4999);
  auto s = parse_json_object(R"({"tier": "l1"})");
  REQUIRE_MESSAGE(s.error.empty(), s.error);
  CHECK(s.members.size() == 1);
  CHECK(s.get("tier")->s == "l1");
}

TEST_CASE("json_quote writes UTF-8 only: a byte that is not becomes U+FFFD") {
  CHECK(json_quote("caf\xc3\xa9") == "\"caf\xc3\xa9\"");
  CHECK(json_quote("P\xff\xffT") == "\"P\\ufffd\\ufffdT\"");
  CHECK(json_quote("a\xc3") == "\"a\\ufffd\"");           // cut short
  CHECK(json_quote("\xe2\x82\xac\xc0\xaf") == "\"\xe2\x82\xac\\ufffd\\ufffd\""); // overlong
  // What it writes, the reader reads back.
  auto o = parse_json_object("{\"m\": " + json_quote("POST\xff /x") + "}");
  REQUIRE_MESSAGE(o.error.empty(), o.error);
  CHECK(o.get("m")->s == "POST\xef\xbf\xbd /x");
}
