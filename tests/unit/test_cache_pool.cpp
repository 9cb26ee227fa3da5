#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cache/slot_pool.hpp"

#include <sys/mman.h>
#include <unistd.h>

using namespace kvs;

namespace {
std::unique_ptr<slot_pool> make(size_t cap, bool hugepages = false,
                                bool populate = false, size_t align = 256) {
  pool_options o;
  o.capacity_bytes = cap;
  o.hugepages = hugepages;
  o.populate = populate;
  o.slot_align = align;
  auto p = slot_pool::create(o);
  INFO((p ? "" : p.error_value().detail));
  REQUIRE(p);
  return std::move(*p);
}
} // namespace

TEST_CASE("slots are carved on demand, rounded to the alignment, from the start") {
  auto p = make(10000);
  CHECK(p->slots_used() == 0);
  CHECK(p->largest_free_run() == 9984);  // 10000 rounded down to 256
  slot_id a = p->alloc(1000);
  REQUIRE(a != invalid_slot);
  CHECK(p->slot_bytes(a) == 1000);
  CHECK(p->slot_stride(a) == 1024);
  CHECK(p->offset(a) == 0);
  slot_id b = p->alloc(1);
  CHECK(p->offset(b) == 1024);
  CHECK(p->slot_stride(b) == 256);
  CHECK(p->bytes_used() == 1280);
  CHECK(p->slots_used() == 2);
  CHECK(p->data(b) == p->base() + 1024);
  CHECK(p->alloc(0) == invalid_slot);
  CHECK(p->alloc(9984 - 1280 + 1) == invalid_slot);  // one byte too many
  CHECK(p->alloc(9984 - 1280) != invalid_slot);       // exactly the rest
  CHECK(p->largest_free_run() == 0);
}

TEST_CASE("free merges with both neighbours; double free and bad ids are refused") {
  auto p = make(4096);
  slot_id s[4];
  for (auto& x : s) x = p->alloc(1024);
  CHECK(p->largest_free_run() == 0);
  CHECK(p->run_if_freed(s[1]) == 1024);
  REQUIRE(p->free(s[0]));
  CHECK(p->run_if_freed(s[1]) == 2048);  // joins s[0]'s run
  REQUIRE(p->free(s[2]));
  CHECK(p->run_if_freed(s[1]) == 3072);  // both sides
  CHECK_FALSE(p->free(s[0]));
  CHECK_FALSE(p->free(invalid_slot));
  CHECK_FALSE(p->free(99));
  REQUIRE(p->free(s[1]));
  CHECK(p->largest_free_run() == 3072);  // one run, not three
  slot_id big = p->alloc(3072);
  CHECK(p->offset(big) == 0);
  CHECK(p->run_if_freed(big) == 3072);
}

TEST_CASE("best fit: a hole of the right size is reused before a larger run is cut") {
  auto p = make(8192);
  slot_id a = p->alloc(1024), b = p->alloc(2048), c = p->alloc(1024);
  (void)c;
  REQUIRE(p->free(a));  // hole of 1024 at 0; hole of 4096 at the end
  slot_id d = p->alloc(1000);
  CHECK(p->offset(d) == 0);
  REQUIRE(p->free(b));  // hole of 2048 at 1024
  slot_id e = p->alloc(2048);
  CHECK(p->offset(e) == 1024);
  CHECK(p->largest_free_run() == 4096);
}

TEST_CASE("high_water: the end of the highest slot ever handed out; reused holes keep it") {
  auto p = make(8192);
  CHECK(p->high_water() == 0);
  slot_id a = p->alloc(1000), b = p->alloc(2048);
  CHECK(p->high_water() == 1024 + 2048);
  REQUIRE(p->free(b));
  CHECK(p->high_water() == 3072);  // freeing never lowers it: those pages were written
  slot_id c = p->alloc(512);        // best fit: the start of the freed run
  CHECK(p->offset(c) == 1024);
  CHECK(p->high_water() == 3072);
  REQUIRE(p->free(a));
  slot_id d = p->alloc(4096);       // no hole fits: cut from the run past c
  CHECK(p->offset(d) == 1536);
  CHECK(p->high_water() == 1536 + 4096);
}

TEST_CASE("slot ids are recycled, data stays in place, slots do not overlap") {
  auto p = make(64 * 1024, false, false, 64);
  std::mt19937 rng(7);
  std::vector<slot_id> live;
  for (int round = 0; round < 4000; ++round) {
    if (!live.empty() && (rng() % 3 == 0 || p->largest_free_run() < 4096)) {
      size_t i = rng() % live.size();
      slot_id s = live[i];
      // The bytes written at alloc are still there.
      auto* d = reinterpret_cast<unsigned char*>(p->data(s));
      for (size_t k = 0; k < p->slot_bytes(s); ++k)
        REQUIRE(d[k] == static_cast<unsigned char>(s));
      REQUIRE(p->free(s));
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    size_t bytes = 1 + rng() % 4096;
    slot_id s = p->alloc(bytes);
    REQUIRE(s != invalid_slot);
    std::memset(p->data(s), static_cast<int>(s & 0xff), bytes);
    live.push_back(s);
  }
  // No two live slots overlap, and the accounting adds up.
  std::vector<std::pair<size_t, size_t>> spans;
  size_t used = 0;
  for (auto s : live) {
    spans.emplace_back(p->offset(s), p->offset(s) + p->slot_stride(s));
    used += p->slot_stride(s);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) REQUIRE(spans[i - 1].second <= spans[i].first);
  CHECK(p->bytes_used() == used);
  CHECK(p->slots_used() == live.size());
  CHECK(p->slot_ids() <= 4000);
  for (auto s : live) REQUIRE(p->free(s));
  CHECK(p->largest_free_run() == 64 * 1024);
}

TEST_CASE("hugepage-aligned region") {
  auto p = make(4 << 20, true);
  CHECK(reinterpret_cast<uintptr_t>(p->base()) % (2 << 20) == 0);
  CHECK(p->mapped_bytes() == (4u << 20));
  slot_id s = p->alloc(1 << 20);
  std::memset(p->data(s), 0xab, 1 << 20);
  CHECK(static_cast<unsigned char>(p->data(s)[12345]) == 0xab);
}

TEST_CASE("populated region") {
  auto p = make(1 << 20, false, true);
  slot_id s = p->alloc(4096);
  CHECK(s != invalid_slot);
}

namespace {
/// Pages of [p, p + len) resident now (mincore).
size_t resident_pages(const std::byte* p, size_t len) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> v((len + page - 1) / page);
  REQUIRE(::mincore(const_cast<std::byte*>(p), len, v.data()) == 0);
  return static_cast<size_t>(std::count_if(v.begin(), v.end(), [](unsigned char c) { return c & 1; }));
}
} // namespace

TEST_CASE("prefault maps pages in without changing a byte of a slot in use") {
  const size_t cap = 8 << 20;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  auto p = make(cap);
  slot_id s = p->alloc(1 << 20);
  std::memset(p->data(s), 0x5a, 1 << 20);
  const size_t before = resident_pages(p->base(), p->mapped_bytes());
  CHECK(before >= (1u << 20) / page); // the slot just written
  CHECK(before < p->mapped_bytes() / page);
  // In steps, as the background prefault does it; past the end is clipped.
  for (size_t off = 0; off < cap + (1 << 20); off += 3 << 20) {
    auto st = p->prefault(off, 3 << 20);
    if (!st && st.error_value().kind == "unsupported")
      return; // kernel before 5.14: nothing to check
    REQUIRE_MESSAGE(st, to_string(st.error_value()));
  }
  CHECK(resident_pages(p->base(), p->mapped_bytes()) == p->mapped_bytes() / page);
  for (size_t i = 0; i < (1u << 20); i += 4093)
    REQUIRE(static_cast<unsigned char>(p->data(s)[i]) == 0x5a);
  // Memory nobody wrote reads as zero, as before.
  slot_id t = p->alloc(1 << 20);
  CHECK(static_cast<unsigned char>(p->data(t)[777]) == 0);
}

TEST_CASE("create refuses a bad alignment; zero capacity has no slots") {
  pool_options o;
  o.capacity_bytes = 4096;
  o.slot_align = 100;
  auto bad = slot_pool::create(o);
  REQUIRE_FALSE(bad);
  CHECK(bad.error_value().kind == "bad_option");
  CHECK(bad.error_value().detail.find("power of two") != std::string::npos);

  auto z = make(0);
  CHECK(z->alloc(64) == invalid_slot);
  CHECK(z->largest_free_run() == 0);
}

TEST_CASE("small alignment packs slots tightly") {
  auto p = make(1000, false, false, 8);
  CHECK(p->stride_for(100) == 104);
  int n = 0;
  while (p->alloc(100) != invalid_slot) ++n;
  CHECK(n == 9);  // 1000 / 104
}
