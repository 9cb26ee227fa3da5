// The one error model (core/error.hpp): expected<T>, status and to_string.
#include "core/error.hpp"

#include <doctest/doctest.h>

#include <memory>
#include <string>

using namespace kvs;

namespace {

expected<int> half(int n) {
  if (n % 2 != 0)
    return make_error("bad_field", "n: " + std::to_string(n) + " is odd");
  return n / 2;
}

status check_positive(int n) {
  if (n <= 0)
    return make_error("bad_field", "n must be > 0");
  return {};
}

// An error passes up through a caller with a different value type.
expected<std::string> describe_half(int n) {
  auto h = half(n);
  if (!h)
    return h.error_value();
  return "half is " + std::to_string(*h);
}

} // namespace

TEST_CASE("expected<T> holds a value or an error, never both") {
  auto ok = half(8);
  REQUIRE(ok.has_value());
  CHECK(static_cast<bool>(ok));
  CHECK(*ok == 4);
  CHECK(ok.value() == 4);

  auto bad = half(3);
  REQUIRE_FALSE(bad.has_value());
  CHECK_FALSE(static_cast<bool>(bad));
  CHECK(bad.error_value().kind == "bad_field");
  CHECK(bad.error_value().detail == "n: 3 is odd");
}

TEST_CASE("expected<T> gives access to and moves out its value") {
  expected<std::string> s{std::string("abc")};
  CHECK(s->size() == 3);
  s.value() += "d";
  CHECK(*s == "abcd");
  std::string taken = std::move(s).value();
  CHECK(taken == "abcd");

  // Move-only values work (backends return unique_ptrs).
  expected<std::unique_ptr<int>> p{std::make_unique<int>(7)};
  REQUIRE(p);
  std::unique_ptr<int> owned = std::move(*p);
  CHECK(*owned == 7);
}

TEST_CASE("errors propagate across value types unchanged") {
  CHECK(*describe_half(10) == "half is 5");
  auto e = describe_half(5);
  REQUIRE_FALSE(e);
  CHECK(e.error_value().kind == "bad_field");
  CHECK(e.error_value().detail == "n: 5 is odd");
}

TEST_CASE("status: success by default, failure from an error") {
  status fine;
  CHECK(fine.has_value());
  CHECK(check_positive(1));
  auto s = check_positive(0);
  REQUIRE_FALSE(s);
  CHECK(s.error_value().kind == "bad_field");
  CHECK(s.error_value().detail == "n must be > 0");
  s.error_value().detail += " (got 0)";
  CHECK(s.error_value().detail == "n must be > 0 (got 0)");
}

TEST_CASE("to_string: kind and detail, or whichever is set") {
  CHECK(to_string(make_error("io", "open('/x'): No such file")) == "io: open('/x'): No such file");
  CHECK(to_string(make_error("io", "")) == "io");
  CHECK(to_string(make_error("", "just the detail")) == "just the detail");
  CHECK(to_string(error{}).empty());
}
