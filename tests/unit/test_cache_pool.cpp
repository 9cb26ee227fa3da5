#include <doctest/doctest.h>

#include <cstring>
#include <set>
#include <string>

#include "cache/slot_pool.hpp"

using namespace kvs;

namespace {
std::unique_ptr<slot_pool> make(size_t cap, bool hugepages = false,
                                bool populate = false, size_t align = 256) {
  pool_options o;
  o.capacity_bytes = cap;
  o.hugepages = hugepages;
  o.populate = populate;
  o.slot_align = align;
  std::string err;
  auto p = slot_pool::create(o, &err);
  INFO(err);
  REQUIRE(p);
  return p;
}
} // namespace

TEST_CASE("pool carves configured slots and hands them out in order") {
  auto p = make(10000);
  CHECK_FALSE(p->configured());
  CHECK(p->alloc() == invalid_slot);  // not configured yet
  std::string err;
  REQUIRE(p->configure(1000, &err));
  CHECK(p->slot_bytes() == 1000);
  CHECK(p->slot_stride() == 1024);       // rounded up to 256
  CHECK(p->slot_count() == 9);           // 10000 / 1024
  CHECK(p->mapped_bytes() == 12288);     // whole 4 KiB pages
  CHECK(p->slots_free() == 9);
  CHECK(p->alloc() == 0);
  CHECK(p->alloc() == 1);
  CHECK(p->offset(1) == 1024);
  CHECK(p->data(1) == p->base() + 1024);
  CHECK(p->slots_used() == 2);
}

TEST_CASE("pool alloc/free: all slots distinct, exhaustion, reuse, double free") {
  auto p = make(64 * 1024);
  REQUIRE(p->configure(4096, nullptr));
  REQUIRE(p->slot_count() == 16);
  std::set<slot_id> got;
  for (int i = 0; i < 16; ++i) got.insert(p->alloc());
  CHECK(got.size() == 16);
  CHECK(*got.rbegin() == 15);
  CHECK(p->alloc() == invalid_slot);
  CHECK(p->slots_free() == 0);
  CHECK(p->free(7));
  CHECK_FALSE(p->free(7));    // double free refused
  CHECK_FALSE(p->free(16));   // out of range refused
  CHECK_FALSE(p->in_use(7));
  CHECK(p->alloc() == 7);     // LIFO reuse
  CHECK(p->in_use(7));
}

TEST_CASE("pool memory is writable across every slot") {
  auto p = make(1 << 20, /*hugepages=*/true, /*populate=*/true);
  REQUIRE(p->configure(3000, nullptr));
  const size_t n = p->slot_count();
  CHECK(n == (1u << 20) / 3072);
  for (size_t i = 0; i < n; ++i) {
    slot_id s = p->alloc();
    std::memset(p->data(s), static_cast<int>(s & 0xff), p->slot_bytes());
  }
  for (size_t i = 0; i < n; ++i)
    CHECK(static_cast<unsigned char>(p->data(static_cast<slot_id>(i))[2999]) == (i & 0xff));
  // 2 MiB alignment for transparent huge pages.
  CHECK(reinterpret_cast<uintptr_t>(p->base()) % (2u << 20) == 0);
  CHECK(p->capacity_bytes() == (1u << 20));
  CHECK(p->mapped_bytes() == (2u << 20));  // rounded up to one huge page
}

TEST_CASE("slot size changes only while empty") {
  auto p = make(8192);
  std::string err;
  REQUIRE(p->configure(1024, &err));
  slot_id s = p->alloc();
  CHECK_FALSE(p->configure(2048, &err));
  CHECK(err.find("empty") != std::string::npos);
  CHECK(p->slot_bytes() == 1024);
  p->free(s);
  REQUIRE(p->configure(2048, &err));
  CHECK(p->slot_count() == 4);
}

TEST_CASE("configure refuses sizes that cannot work") {
  auto p = make(4096);
  std::string err;
  CHECK_FALSE(p->configure(0, &err));
  CHECK_FALSE(p->configure(4097, &err));
  CHECK(err.find("does not fit") != std::string::npos);
  CHECK(p->configure(4096, &err));
  CHECK(p->slot_count() == 1);
}

TEST_CASE("create refuses a bad alignment; zero capacity has no slots") {
  pool_options o;
  o.capacity_bytes = 4096;
  o.slot_align = 100;
  std::string err;
  CHECK(slot_pool::create(o, &err) == nullptr);
  CHECK(err.find("power of two") != std::string::npos);

  auto z = make(0);
  CHECK_FALSE(z->configure(64, &err));
  CHECK(z->alloc() == invalid_slot);
}

TEST_CASE("small alignment packs slots tightly") {
  auto p = make(1000, false, false, 8);
  REQUIRE(p->configure(100, nullptr));
  CHECK(p->slot_stride() == 104);
  CHECK(p->slot_count() == 9);
}
