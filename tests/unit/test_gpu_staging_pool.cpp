// The staging pool of an engine-driven instance (gpu/staging_pool.hpp):
// a real POSIX shared-memory object the sidecar creates, that a client
// opens by name; slots handed out and given back; copies to and from L1
// checked before a byte moves and guarded against the engine truncating
// the object; the object is unlinked with the pool.
#include <doctest/doctest.h>

#include "gpu/staging_pool.hpp"

#include <algorithm>
#include <cstring>
#include <fcntl.h>
#include <set>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace kvs;

namespace {

bool shm_exists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

} // namespace

TEST_CASE("staging pool: a private object the client maps by name, slots of one chunk") {
  const std::string name = staging_pool_name(42);
  CHECK(name.rfind("/kvsidecar." + std::to_string(getpid()) + ".ed.42.", 0) == 0);
  CHECK(staging_pool_name(42) != name);  // unguessable suffix, fresh each time
  auto pool = staging_pool::create(name, 4096, 4, std::nullopt);
  REQUIRE_MESSAGE(pool.has_value(), pool.error_value().detail);
  auto& p = *pool.value();
  CHECK(p.size() == 4 * 4096);
  CHECK(p.free_slots() == 4);

  // What a client sees: the object, 0600, owned by us, fully sized.
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  REQUIRE(fd >= 0);
  struct stat sb {};
  REQUIRE(fstat(fd, &sb) == 0);
  CHECK((sb.st_mode & 0777) == 0600);
  CHECK(sb.st_uid == geteuid());
  CHECK(sb.st_size == 4 * 4096);
  CHECK(sb.st_blocks * 512 >= 4 * 4096);  // reserved (posix_fallocate), not sparse
  auto* client = static_cast<uint8_t*>(mmap(nullptr, 4 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  REQUIRE(client != MAP_FAILED);
  close(fd);

  auto a = p.take(3);
  REQUIRE(a.size() == 3);
  CHECK(std::set<uint64_t>(a.begin(), a.end()).size() == 3);
  for (uint64_t o : a) CHECK(o % 4096 == 0);
  CHECK(p.take(5).size() == 1);  // only one left: fewer than asked
  CHECK(p.take(1).empty());

  // The client writes a chunk into slot a[1]; commit copies it into L1.
  std::memset(client + a[1], 0x5a, 4096);
  std::vector<uint8_t> l1(4096, 0);
  REQUIRE(p.copy({a[1]}, {l1.data()}, true).has_value());
  CHECK(std::all_of(l1.begin(), l1.end(), [](uint8_t b) { return b == 0x5a; }));
  // And the other way: L1 into slot a[2], which the client reads.
  std::vector<uint8_t> chunk(4096);
  for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<uint8_t>(i * 7);
  REQUIRE(p.copy({a[2]}, {chunk.data()}, false).has_value());
  CHECK(std::memcmp(client + a[2], chunk.data(), 4096) == 0);
  // A hybrid instance's slots hold its groups' chunks: a copy moves each
  // slot's own length, never more than a slot, and the lengths must match.
  std::vector<uint8_t> half(4096, 0x11);
  std::memset(client + a[1], 0x22, 4096);
  REQUIRE(p.copy({a[1]}, {half.data()}, true, {1024}).has_value());
  CHECK(std::count(half.begin(), half.end(), 0x22) == 1024);
  CHECK(half[1024] == 0x11);
  auto over = p.copy({a[1]}, {half.data()}, true, {4097});
  REQUIRE_FALSE(over.has_value());
  CHECK(over.error_value().detail.find("4097 bytes into slots of 4096") != std::string::npos);
  CHECK_FALSE(p.copy({a[1]}, {half.data()}, true, {16, 16}).has_value());

  // Only handed-out slots, each once, and the counts must agree.
  CHECK(p.give({a[0], a[0]}).error_value().detail.find("given twice") != std::string::npos);
  CHECK(p.give({1}).error_value().kind == "staging");
  auto bad = p.copy({a[0] + 1}, {l1.data()}, true);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error_value().detail.find("not a slot handed out") != std::string::npos);
  CHECK_FALSE(p.copy({a[0], a[1]}, {l1.data()}, true).has_value());
  REQUIRE(p.give({a[0], a[2]}).has_value());
  CHECK(p.free_slots() == 2);
  CHECK_FALSE(p.copy({a[0]}, {l1.data()}, true).has_value());  // given back: no longer copyable
  munmap(client, 4 * 4096);

  pool.value().reset();
  CHECK_FALSE(shm_exists(name));  // unlinked with the pool
}

TEST_CASE("staging pool: an engine that truncates the object fails that copy, not the process") {
  const std::string name = staging_pool_name(7);
  auto pool = staging_pool::create(name, 8192, 2, std::nullopt);
  REQUIRE(pool.has_value());
  auto slots = pool.value()->take(2);
  REQUIRE(slots.size() == 2);
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 4096) == 0);  // the client shrinks it behind our back
  close(fd);
  std::vector<uint8_t> l1(8192, 1);
  auto r = pool.value()->copy({slots[1]}, {l1.data()}, false);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error_value().kind == "shm_truncated");
  CHECK(pool.value()->copy({slots[0]}, {l1.data()}, true).has_value() == false);  // half of slot 0 is gone too
}

TEST_CASE("staging pool: refused sizes and names") {
  CHECK_FALSE(staging_pool::create(staging_pool_name(1), 0, 4, std::nullopt).has_value());
  CHECK_FALSE(staging_pool::create(staging_pool_name(1), 4096, 0, std::nullopt).has_value());
  CHECK_FALSE(staging_pool::create(staging_pool_name(1), uint64_t{1} << 40, 1u << 20, std::nullopt).has_value());
  const std::string name = staging_pool_name(3);
  auto first = staging_pool::create(name, 4096, 1, std::nullopt);
  REQUIRE(first.has_value());
  auto again = staging_pool::create(name, 4096, 1, std::nullopt);  // O_EXCL: never adopt an object
  REQUIRE_FALSE(again.has_value());
  CHECK(again.error_value().detail.find("File exists") != std::string::npos);
  CHECK(shm_exists(name));  // the failed create did not unlink the first one's object
}

TEST_CASE("staging pool: objects of sidecars that are gone are removed, live ones kept") {
  // A pid that surely is no process any more: a child that has exited.
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) _exit(0);
  REQUIRE(waitpid(child, nullptr, 0) == child);
  const std::string dead = "/kvsidecar." + std::to_string(child) + ".ed.9.00000000deadbeef";
  const int fd = shm_open(dead.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  REQUIRE(fd >= 0);
  close(fd);
  const std::string other = "/kvsidecar_not_ours_" + std::to_string(child);
  const int fd2 = shm_open(other.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  REQUIRE(fd2 >= 0);
  close(fd2);
  auto live = staging_pool::create(staging_pool_name(10), 4096, 1, std::nullopt);
  REQUIRE(live.has_value());
  CHECK(remove_stale_staging_pools() >= 1);
  CHECK_FALSE(shm_exists(dead));
  CHECK(shm_exists(live.value()->name()));  // ours: alive
  CHECK(shm_exists(other));                 // not a staging name: never touched
  shm_unlink(other.c_str());
}

TEST_CASE("staging pool inside an L1 arena's object: offsets are the object's, the name not ours") {
  // What the store's open_arena leaves: an object longer than L1 (here
  // 1 MiB of "L1" then 4 slots of 64 KiB).
  const std::string name = staging_pool_name(7);
  const uint64_t origin = 1 << 20, slot = 64 << 10;
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, static_cast<off_t>(origin + 4 * slot)) == 0);
  {
    auto too_far = staging_pool::open_in(name, origin, slot, 5);
    REQUIRE_FALSE(too_far);
    CHECK(too_far.error_value().detail.find("shorter than its staging slots end") !=
          std::string::npos);
    auto pool = staging_pool::open_in(name, origin, slot, 4);
    REQUIRE(pool);
    auto& p = **pool;
    CHECK(p.origin() == origin);
    auto taken = p.take(4);
    REQUIRE(taken.size() == 4);
    for (auto off : taken) CHECK((off >= origin && (off - origin) % slot == 0));
    CHECK_FALSE(p.is_taken(0)); // an L1 offset is never a staging slot
    // L1 -> the slot; the engine sees it at that offset of the whole object.
    std::vector<uint8_t> l1(slot, 0x6b);
    REQUIRE(p.copy({taken[2]}, {l1.data()}, false));
    void* m = mmap(nullptr, origin + 4 * slot, PROT_READ, MAP_SHARED, fd, 0);
    REQUIRE(m != MAP_FAILED);
    CHECK(static_cast<uint8_t*>(m)[taken[2]] == 0x6b);
    CHECK(static_cast<uint8_t*>(m)[taken[2] + slot - 1] == 0x6b);
    munmap(m, origin + 4 * slot);
    REQUIRE(p.give(taken));
  }
  // The store owns the name: the pool leaves it.
  CHECK(shm_exists(name));
  close(fd);
  shm_unlink(name.c_str());
}
