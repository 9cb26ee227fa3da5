// Which shared-memory objects a client may register (gpu/shm_policy.hpp).
#include "gpu/shm_policy.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

using namespace kvs;

namespace {
const std::vector<std::string> defaults{"/lmcache_kv_", "/kvs_"};

// The reason a name is refused; an allowed name fails the test.
std::string refusal(const status& s) {
  REQUIRE_FALSE(s);
  CHECK(s.error_value().kind == "shm_name");
  return s.error_value().detail;
}
}

TEST_CASE("names: allowed prefixes, with or without the leading slash") {
  CHECK(check_shm_name("/lmcache_kv_123_0", defaults));
  CHECK(check_shm_name("lmcache_kv_123_0", defaults));
  CHECK(check_shm_name("/kvs_pool_9_1", defaults));
  CHECK(refusal(check_shm_name("/psm_victim", defaults)) ==
        "shared-memory name does not start with an allowed prefix "
        "(cache.shm_allow_prefixes = ['/lmcache_kv_', '/kvs_'])");
  CHECK_FALSE(check_shm_name("/kvs", defaults)); // shorter than the prefix
  CHECK_FALSE(check_shm_name("/anything", {}));  // an empty list allows nothing
  CHECK(check_shm_name("/anything", {""}));
}

TEST_CASE("names: sem.*, NUL, control characters, '/', length are always refused") {
  const std::vector<std::string> any{""};
  CHECK(refusal(check_shm_name("/sem.kvs_lock", any)) ==
        "shared-memory name starts with 'sem.' (POSIX semaphores are never registered)");
  CHECK(refusal(check_shm_name(std::string_view{"/kvs_a\0b", 8}, defaults)) ==
        "shared-memory name contains a NUL byte");
  CHECK(refusal(check_shm_name("/kvs_a\nINFO forged", defaults)) ==
        "shared-memory name contains a control character");
  CHECK(refusal(check_shm_name("/kvs_a/../../etc/passwd", defaults)) ==
        "shared-memory name contains '/' after the leading one");
  CHECK_FALSE(check_shm_name("//kvs_a", any));
  CHECK_FALSE(check_shm_name("/..", any));
  CHECK(refusal(check_shm_name("/", any)) == "empty shared-memory name");
  CHECK(check_shm_name("/kvs_" + std::string(251, 'x'), defaults));
  CHECK(refusal(check_shm_name("/kvs_" + std::string(252, 'x'), defaults)) ==
        "shared-memory name of 256 bytes (at most 255)");
}

TEST_CASE("owner: the object must belong to the given uid") {
  std::string name = "/kvs_test_policy_" + std::to_string(getpid());
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 4096) == 0);
  CHECK(check_shm_owner(name, static_cast<uint32_t>(geteuid())));
  auto why = check_shm_owner(name, geteuid() + 1);
  REQUIRE_FALSE(why);
  CHECK(why.error_value().kind == "shm_owner");
  CHECK(why.error_value().detail.find("owned by uid " + std::to_string(geteuid())) == 0);
  close(fd);
  shm_unlink(name.c_str());
  why = check_shm_owner(name, static_cast<uint32_t>(geteuid()));
  REQUIRE_FALSE(why);
  CHECK(why.error_value().detail == "shm_open: No such file or directory");
}
