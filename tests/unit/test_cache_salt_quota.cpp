// salt_quota: exact per-salt accounting, limits, and which chunks go.
#include "cache/salt_quota.hpp"
#include "core/cache_salt.hpp"

#include <doctest/doctest.h>

using namespace kvs;

namespace {
chunk_key key(uint64_t h, int32_t r = 0) {
  return chunk_key{h, r};
}
} // namespace

TEST_CASE("salt_quota counts bytes and chunks per salt exactly") {
  salt_quota q;
  q.committed(key(1), "a", 100);
  q.committed(key(2), "a", 50);
  q.committed(key(2, 1), "a", 50); // another rank of the same chunk
  q.committed(key(3), "", 70);
  CHECK(q.usage("a").bytes == 200);
  CHECK(q.usage("a").chunks == 3);
  CHECK(q.usage("").bytes == 70);
  CHECK(q.bytes() == 270);
  q.committed(key(1), "a", 120); // a re-commit replaces the record
  CHECK(q.usage("a").bytes == 220);
  q.removed(key(2));
  q.removed(key(99)); // never committed: no-op
  CHECK(q.usage("a").bytes == 170);
  CHECK(q.usage("a").chunks == 2);
  q.removed(key(1));
  q.removed(key(2, 1));
  CHECK(q.usage("a").bytes == 0);
  CHECK(q.salts() == 1); // "a" has nothing left: its bucket is gone
  CHECK(q.bytes() == 70);
}

TEST_CASE("salt_quota limits are recorded but not enforced unless isolated") {
  salt_quota q;
  CHECK(q.set_limit("a", 100));
  q.committed(key(1), "a", 80);
  q.committed(key(2), "a", 80);
  CHECK(q.limit("a") == 100u);
  CHECK(!q.enforced_limit("a"));
  CHECK(q.over_limit("a").empty());
  CHECK(q.usage("a").limit == 100u);
  CHECK(q.remove_limit("a"));
  CHECK(!q.remove_limit("a"));
  CHECK(!q.limit("a"));
}

TEST_CASE("isolated: a salt over its limit gives up its own oldest chunks, never another's") {
  salt_quota q{true};
  q.set_limit("a", 150);
  q.set_limit("b", 1000);
  q.committed(key(1), "a", 50);
  q.committed(key(10), "b", 500);
  q.committed(key(2), "a", 50);
  q.committed(key(3), "a", 50);
  q.touched(key(1)); // 1 is now the most recent of a's
  q.committed(key(4), "a", 50); // a: 200 > 150
  auto go = q.over_limit("a");
  REQUIRE(go.size() == 1);
  CHECK(go[0] == key(2)); // the least recently used of a's, not b's older chunk
  q.removed(go[0]);
  CHECK(q.over_limit("a").empty());
  CHECK(q.over_limit("b").empty());
  CHECK(q.usage("b").bytes == 500);
  q.set_limit("a", 60); // lowered: 150 bytes of a must shrink to 50
  go = q.over_limit("a");
  CHECK(go == std::vector<chunk_key>{key(3), key(1)});
}

TEST_CASE("isolated allowlist: without a quota a salt's limit is 0 once quotas are in use") {
  salt_quota q{true};
  q.committed(key(1), "x", 10);
  CHECK(!q.enforced_limit("x")); // no quota anywhere: nothing enforced
  CHECK(q.over_limit("x").empty());
  q.set_limit("a", 100);
  CHECK(q.enforced_limit("x") == 0u);
  CHECK(q.over_limit("x") == std::vector<chunk_key>{key(1)});
  q.set_limit("x", 10);
  CHECK(q.over_limit("x").empty()); // exactly at the limit stays
}

TEST_CASE("salt_quota bounds the number of limits and ranks salts for metrics") {
  salt_quota q;
  for (size_t i = 0; i < salt_quota_max_limits; ++i)
    REQUIRE(q.set_limit("s" + std::to_string(i), 1));
  CHECK(!q.set_limit("one-more", 1));
  CHECK(q.set_limit("s0", 2)); // updating an existing one still works
  CHECK(q.limited().size() == salt_quota_max_limits);
  CHECK(q.limited()[1].salt == "s1"); // in the order first set, not by name ("s10" < "s2")
  CHECK(q.limited()[2].salt == "s2");

  salt_quota m;
  m.committed(key(1), "big", 300);
  m.committed(key(2), "mid", 200);
  m.committed(key(3), "small", 100);
  m.committed(key(4), "tiny", 10);
  salt_usage others;
  auto t = m.top(2, others);
  REQUIRE(t.size() == 2);
  CHECK(t[0].salt == "big");
  CHECK(t[1].salt == "mid");
  CHECK(others.bytes == 110);
  CHECK(others.chunks == 2);
}

TEST_CASE("cache_salt rules match LMCache's") {
  CHECK(check_cache_salt("") == nullptr);
  CHECK(check_cache_salt("tenant-a") == nullptr);
  CHECK(check_cache_salt(std::string(128, 'x')) == nullptr);
  CHECK(check_cache_salt(std::string(129, 'x')) != nullptr);
  std::string e_acute = "\xc3\xa9";
  std::string s;
  for (int i = 0; i < 128; ++i)
    s += e_acute; // 128 characters, 256 bytes
  CHECK(check_cache_salt(s) == nullptr);
  for (auto bad : {"a@b", "a/b", "a\\b"})
    CHECK(check_cache_salt(bad) != nullptr);
  CHECK(check_cache_salt(std::string_view{"a\0b", 3}) != nullptr);
  CHECK(cache_salt_from_name("_default").empty());
  CHECK(cache_salt_name("") == "_default");
}
