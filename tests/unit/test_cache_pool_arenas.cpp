// Arenas of the L1 pool (cache/slot_pool.hpp): extents of one anonymous
// region remapped from per-client shared-memory objects, so an engine-driven
// client writes L1 slots in place while no client maps another's chunks.
#include <doctest/doctest.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "cache/arena_heal.hpp"
#include "cache/chunk_index.hpp"
#include "cache/slot_pool.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace kvs;

namespace {

constexpr size_t k_page = 4096;
constexpr size_t k_extent = 16 * k_page; // 64 KiB

std::unique_ptr<slot_pool> make(size_t extents, size_t extent = k_extent) {
  pool_options o;
  o.capacity_bytes = extents * extent;
  o.hugepages = false;
  o.slot_align = 256;
  o.extent_bytes = extent;
  auto p = slot_pool::create(o);
  REQUIRE(p);
  return std::move(*p);
}

std::string name_for(int n) {
  return "/kvs_test_arena_" + std::to_string(getpid()) + "_" + std::to_string(n);
}

/// What a client sees: the arena's object, mapped whole, as an engine does.
struct client_view {
  uint8_t* base = nullptr;
  size_t size = 0;
  explicit client_view(const std::string& name) {
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    REQUIRE(fd >= 0);
    struct stat st {};
    REQUIRE(fstat(fd, &st) == 0);
    size = static_cast<size_t>(st.st_size);
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    REQUIRE(p != MAP_FAILED);
    base = static_cast<uint8_t*>(p);
  }
  ~client_view() { munmap(base, size); }
};

bool all_bytes(const uint8_t* p, size_t n, uint8_t v) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != v) return false;
  return true;
}

/// Evict only what a new slot needs (watermarks 1.0).
index_options full_watermarks() {
  index_options io;
  io.evict_high = 1.0;
  io.evict_low = 1.0;
  return io;
}

/// Arena 0 of a 4-extent pool full of quarter-extent chunks, hashes 1..16
/// oldest first: extent e holds chunks 4e+1 .. 4e+4.
void fill_with_quarters(chunk_index& idx, cache_clock::time_point now) {
  for (uint64_t h = 1; h <= 16; ++h) {
    REQUIRE(idx.reserve({h, 0}, k_extent / 4, now).status == reserve_status::reserved);
    REQUIRE(idx.commit({h, 0}));
  }
}

} // namespace

TEST_CASE("an arena's slot is the same bytes in L1 and in the client's mapping, at its offset") {
  auto pool = make(4);
  auto a = pool->open_arena(name_for(1));
  REQUIRE(a);
  CHECK(*a != anonymous_arena);
  client_view engine(name_for(1));
  CHECK(engine.size >= pool->capacity_bytes());

  const slot_id s = pool->alloc(5000, *a);
  REQUIRE(s != invalid_slot);
  CHECK(pool->arena_of(s) == *a);
  CHECK(pool->arena_extents(*a) == 1);
  CHECK(pool->offset(s) % k_extent == 0); // carved from the start of its extent
  // The engine writes at the offset it is handed; L1 holds those bytes.
  std::memset(engine.base + pool->offset(s), 0x5a, 5000);
  CHECK(all_bytes(reinterpret_cast<uint8_t*>(pool->data(s)), 5000, 0x5a));
  // And the other way round (a retrieve handed out in place).
  std::memset(pool->data(s), 0x33, 5000);
  CHECK(all_bytes(engine.base + pool->offset(s), 5000, 0x33));
}

TEST_CASE("arena slots stay inside the arena's extents; arena 0 never lands in them") {
  auto pool = make(4);
  auto a = pool->open_arena(name_for(2));
  REQUIRE(a);
  const slot_id x = pool->alloc(10000, *a);
  const slot_id y = pool->alloc(10000, *a);
  REQUIRE(x != invalid_slot);
  REQUIRE(y != invalid_slot);
  const size_t ext = pool->offset(x) / k_extent;
  CHECK(pool->offset(y) / k_extent == ext); // the same extent first
  // Arena 0 fills the other three extents and nothing more.
  std::vector<slot_id> anon;
  for (;;) {
    const slot_id s = pool->alloc(8192);
    if (s == invalid_slot) break;
    CHECK(pool->arena_of(s) == anonymous_arena);
    CHECK(pool->offset(s) / k_extent != ext);
    anon.push_back(s);
  }
  CHECK(anon.size() == 3 * (k_extent / 8192));
  // The arena's extent still has room for its own slots only.
  CHECK(pool->alloc(8192, *a) != invalid_slot);
  // A chunk longer than an extent never goes to an arena.
  CHECK(pool->alloc(k_extent + 256, *a) == invalid_slot);
}

TEST_CASE("an extent that changes arena shows neither arena's bytes to the other") {
  auto pool = make(1); // one extent: every arena competes for it
  auto a = pool->open_arena(name_for(3));
  auto b = pool->open_arena(name_for(4));
  REQUIRE(a);
  REQUIRE(b);
  client_view va(name_for(3));
  client_view vb(name_for(4));
  const slot_id s = pool->alloc(k_extent, *a);
  REQUIRE(s != invalid_slot);
  std::memset(pool->data(s), 0xa1, k_extent);
  CHECK(all_bytes(va.base, k_extent, 0xa1));
  // b cannot take it while a's chunk lives there.
  CHECK(pool->run_if_freed(s, *b) == k_extent);
  CHECK(pool->alloc(256, *b) == invalid_slot);
  REQUIRE(pool->free(s));
  // Emptied, a keeps it (its pages stay resident) until b needs it.
  CHECK(pool->arena_extents(*a) == 1);
  const slot_id t = pool->alloc(256, *b);
  REQUIRE(t != invalid_slot);
  CHECK(pool->arena_extents(*a) == 0);
  CHECK(pool->arena_extents(*b) == 1);
  // a's object lost those pages (its client reads zeros, not b's chunk);
  // b's slot starts as zeros, not a's chunk.
  std::memset(pool->data(t), 0xb2, 256);
  CHECK(all_bytes(va.base, k_extent, 0));
  CHECK(all_bytes(vb.base, 256, 0xb2));
  CHECK(all_bytes(vb.base + 256, k_extent - 256, 0));
}

TEST_CASE("arena 0 takes back emptied extents when it runs out; closed arenas first") {
  auto pool = make(3);
  auto a = pool->open_arena(name_for(5));
  auto b = pool->open_arena(name_for(6));
  REQUIRE(a);
  REQUIRE(b);
  const slot_id sa = pool->alloc(k_extent, *a);
  const slot_id sb = pool->alloc(k_extent, *b);
  const slot_id s0 = pool->alloc(k_extent);
  REQUIRE(sa != invalid_slot);
  REQUIRE(sb != invalid_slot);
  REQUIRE(s0 != invalid_slot);
  CHECK(pool->alloc(256) == invalid_slot);
  REQUIRE(pool->free(sa));
  REQUIRE(pool->free(sb));
  REQUIRE(pool->close_arena(*b));
  // A closed arena's emptied extent went back at once; the open one's stays.
  CHECK(pool->arena_extents(*a) == 1);
  // Its name is gone: no new client can map it.
  errno = 0;
  CHECK(shm_open(name_for(6).c_str(), O_RDWR, 0) < 0);
  CHECK(errno == ENOENT);
  const slot_id t = pool->alloc(k_extent);
  REQUIRE(t != invalid_slot);
  CHECK(pool->arena_of(t) == anonymous_arena);
  CHECK(pool->arena_extents(*a) == 1);
  // Now a's empty one.
  const slot_id u = pool->alloc(k_extent);
  REQUIRE(u != invalid_slot);
  CHECK(pool->arena_extents(*a) == 0);
  CHECK(pool->bytes_used() == 3 * k_extent);
}

TEST_CASE("a closed arena's chunks stay readable; its extent returns when the last one goes") {
  auto pool = make(2);
  auto a = pool->open_arena(name_for(7));
  REQUIRE(a);
  const slot_id s = pool->alloc(1000, *a);
  REQUIRE(s != invalid_slot);
  std::memset(pool->data(s), 0x77, 1000);
  REQUIRE(pool->close_arena(*a));
  CHECK_FALSE(pool->arena_open(*a));
  CHECK(pool->alloc(1000, *a) == invalid_slot); // closed: no new slot
  CHECK(all_bytes(reinterpret_cast<uint8_t*>(pool->data(s)), 1000, 0x77));
  CHECK(pool->arena_extents(*a) == 1);
  REQUIRE(pool->free(s));
  CHECK(pool->arena_extents(*a) == 0);
  // The whole region is arena 0's again, one run.
  CHECK(pool->largest_free_run() == 2 * k_extent);
  // The arena id is reused by the next arena.
  auto b = pool->open_arena(name_for(8));
  REQUIRE(b);
  CHECK(*b == *a);
}

TEST_CASE("open_arena: a name taken is an error naming it") {
  auto pool = make(1);
  auto a = pool->open_arena(name_for(9));
  REQUIRE(a);
  auto again = pool->open_arena(name_for(9));
  REQUIRE_FALSE(again);
  CHECK(again.error_value().kind == "arena");
  CHECK(again.error_value().detail.find(name_for(9)) != std::string::npos);
}

TEST_CASE("run_if_freed: what freeing a slot opens for another arena") {
  auto pool = make(2);
  auto a = pool->open_arena(name_for(10));
  REQUIRE(a);
  const slot_id x = pool->alloc(k_extent / 2);  // arena 0: extent 0
  const slot_id y = pool->alloc(k_extent / 2);
  REQUIRE(x != invalid_slot);
  REQUIRE(y != invalid_slot);
  // Freeing x leaves half an extent free in extent 0: nothing for `a`.
  CHECK(pool->run_if_freed(x, *a) == 0);
  CHECK(pool->run_if_freed(x) == k_extent / 2); // y is in use right after it
  REQUIRE(pool->free(y));
  CHECK(pool->run_if_freed(x) == 2 * k_extent); // arena 0's runs span extents
  // Now x alone holds extent 0: freeing it opens a whole aligned extent.
  CHECK(pool->run_if_freed(x, *a) == k_extent);
}

TEST_CASE("the index evicts least recently used chunks until the arena has an extent") {
  auto pool = make(4);
  auto a = pool->open_arena(name_for(11));
  REQUIRE(a);
  chunk_index idx(*pool, full_watermarks());
  const auto now = cache_clock::now();
  fill_with_quarters(idx, now);
  auto r = idx.reserve({100, 0}, k_extent / 2, now, 0, *a);
  REQUIRE(r.status == reserve_status::reserved);
  CHECK(r.arena == *a);
  CHECK(pool->arena_of(r.slot) == *a);
  // The four oldest chunks (one extent) went, no more.
  REQUIRE(r.evicted.size() == 4);
  for (uint64_t k = 0; k < 4; ++k) CHECK(r.evicted[k].hash == k + 1);
  REQUIRE(idx.commit({100, 0}));
  auto info = idx.find({100, 0});
  REQUIRE(info);
  CHECK(info->arena == *a);
  CHECK(idx.check_invariants());
  // A chunk larger than an extent is refused for the arena, with why.
  auto big = idx.reserve({101, 0}, k_extent + 256, now, 0, *a);
  CHECK(big.status == reserve_status::no_space);
  CHECK(big.reason == no_space_reason::chunk_too_large);
  CHECK(big.detail.find("arena extent") != std::string::npos);
}

TEST_CASE("a client shrinking its arena costs the sidecar nothing but that arena's bytes") {
  auto pool = make(2);
  auto a = pool->open_arena(name_for(12), std::nullopt, 2 * k_page);
  REQUIRE(a);
  CHECK(pool->arena_size(*a) == 2 * k_extent + 2 * k_page);
  const slot_id s = pool->alloc(8192, *a);
  const slot_id t = pool->alloc(8192); // arena 0: untouched by any of this
  REQUIRE(s != invalid_slot);
  REQUIRE(t != invalid_slot);
  std::memset(pool->data(s), 0x11, 8192);
  std::memset(pool->data(t), 0x22, 8192);
  {
    const int fd = shm_open(name_for(12).c_str(), O_RDWR, 0);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, 0) == 0); // what a hostile engine may do
    close(fd);
  }
  const uint64_t healed = arena_heal_count();
  // The sidecar reads the slot (an L2 write-back would): no SIGBUS, zeros.
  CHECK(all_bytes(reinterpret_cast<uint8_t*>(pool->data(s)), 8192, 0));
  CHECK(arena_heal_count() > healed);
  // The object is whole again; the sidecar can write the slot too.
  struct stat st {};
  const int fd = shm_open(name_for(12).c_str(), O_RDONLY, 0);
  REQUIRE(fd >= 0);
  REQUIRE(fstat(fd, &st) == 0);
  close(fd);
  CHECK(static_cast<uint64_t>(st.st_size) == pool->arena_size(*a));
  std::memset(pool->data(s), 0x33, 8192);
  CHECK(all_bytes(reinterpret_cast<uint8_t*>(pool->data(s)), 8192, 0x33));
  CHECK(all_bytes(reinterpret_cast<uint8_t*>(pool->data(t)), 8192, 0x22));
}

namespace {

/// Pages of [p, p+n) resident in this process's page tables.
size_t resident_pages(const void* p, size_t n) {
  std::vector<unsigned char> v((n + k_page - 1) / k_page);
  REQUIRE(mincore(const_cast<void*>(p), n, v.data()) == 0);
  size_t r = 0;
  for (unsigned char c : v) r += c & 1;
  return r;
}

} // namespace

TEST_CASE("claim_ahead: an arena's next extent is reserved before it is needed, from free space only") {
  auto pool = make(4);
  auto a = pool->open_arena(name_for(20));
  REQUIRE(a);
  CHECK_FALSE(pool->claim_ahead(anonymous_arena));
  // An open arena with no room gets a whole extent.
  auto first = pool->claim_ahead(*a);
  REQUIRE(first);
  CHECK(first->first % k_extent == 0);
  CHECK(first->second == k_extent);
  CHECK(pool->arena_extents(*a) == 1);
  // Its pages are the object's (reserved in /dev/shm at the claim).
  {
    const int fd = shm_open(name_for(20).c_str(), O_RDONLY, 0);
    REQUIRE(fd >= 0);
    struct stat st {};
    REQUIRE(fstat(fd, &st) == 0);
    close(fd);
    CHECK(static_cast<size_t>(st.st_blocks) * 512 >= k_extent);
  }
  // One extent of room: nothing more ahead.
  CHECK_FALSE(pool->claim_ahead(*a));
  CHECK(pool->arena_extents(*a) == 1);
  // The arena's next store lands in it; then the one after is claimed.
  const slot_id s = pool->alloc(k_extent, *a);
  REQUIRE(s != invalid_slot);
  CHECK(pool->offset(s) == first->first);
  auto second = pool->claim_ahead(*a);
  REQUIRE(second);
  CHECK(second->first != first->first);
  CHECK(pool->arena_extents(*a) == 2);
  // Arena 0 takes the rest, the extent claimed ahead included: an empty
  // extent goes back to arena 0 when it needs room. Then there is no free
  // extent, and claim_ahead evicts nothing and takes nothing: it gives up.
  std::vector<slot_id> anon;
  for (slot_id x; (x = pool->alloc(8192)) != invalid_slot;) anon.push_back(x);
  CHECK(anon.size() == 3 * (k_extent / 8192));
  CHECK(pool->arena_extents(*a) == 1);
  CHECK_FALSE(pool->claim_ahead(*a));
  CHECK(pool->arena_extents(*a) == 1);
  // Room again: another arena's claim ahead gets it.
  auto b = pool->open_arena(name_for(21));
  REQUIRE(b);
  for (slot_id x : anon) pool->free(x);
  auto third = pool->claim_ahead(*b);
  REQUIRE(third);
  CHECK(pool->arena_of(pool->alloc(k_extent, *b)) == *b);
}

TEST_CASE("prefault_extent faults an arena extent in without changing a byte; a shrunk object stops it") {
  auto pool = make(4);
  auto a = pool->open_arena(name_for(22));
  REQUIRE(a);
  auto ext = pool->claim_ahead(*a);
  REQUIRE(ext);
  client_view engine(name_for(22));
  // The engine writes the first page before the sidecar faults the extent in.
  std::memset(engine.base + ext->first, 0x77, k_page);
  const std::byte* in_l1 = pool->base() + ext->first;
  CHECK(resident_pages(in_l1, ext->second) < ext->second / k_page);
  REQUIRE(pool->prefault_extent(ext->first, ext->second));
  CHECK(resident_pages(in_l1, ext->second) == ext->second / k_page);
  CHECK(all_bytes(engine.base + ext->first, k_page, 0x77));
  CHECK(all_bytes(engine.base + ext->first + k_page, ext->second - k_page, 0));
  // A client shrinks its object: the next fault-in reports it (no SIGBUS).
  auto other = pool->claim_ahead(*a);
  REQUIRE(pool->alloc(k_extent, *a) != invalid_slot); // fill the first
  other = pool->claim_ahead(*a);
  REQUIRE(other);
  const int fd = shm_open(name_for(22).c_str(), O_RDWR, 0);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 0) == 0);
  close(fd);
  auto r = pool->prefault_extent(other->first, other->second);
  REQUIRE_FALSE(r);
  CHECK(r.error_value().kind == "mmap");
}

TEST_CASE("an arena's eviction frees a whole unpinned extent, and evicts nothing when every extent is pinned") {
  auto pool = make(4);
  auto a = pool->open_arena(name_for(30));
  REQUIRE(a);
  chunk_index idx(*pool, full_watermarks());
  const auto now = cache_clock::now();
  fill_with_quarters(idx, now);
  // A reader pins chunk 2 (extent 0) and chunk 7 (extent 1). The
  // watermark (1.0) makes room for the new half extent's bytes first: the
  // two oldest unlocked chunks, 1 and 3. Then the oldest unpinned extent
  // is 2, whose chunks 9..12 go — chunks 4, 5, 6, 8 stay although older
  // (evicting them would free no extent).
  REQUIRE(idx.lock({2, 0}, 1, now));
  REQUIRE(idx.lock({7, 0}, 1, now));
  auto r = idx.reserve({100, 0}, k_extent / 2, now, 0, *a);
  REQUIRE(r.status == reserve_status::reserved);
  CHECK(pool->arena_of(r.slot) == *a);
  std::vector<uint64_t> gone;
  for (const auto& k : r.evicted) gone.push_back(k.hash);
  CHECK(gone == std::vector<uint64_t>{1, 3, 9, 10, 11, 12});
  CHECK(pool->offset(r.slot) / k_extent == 2);
  REQUIRE(idx.commit({100, 0}));
  // Pin extent 3 too (chunk 16) and fill the arena's extent: a chunk that
  // needs another extent finds every extent pinned and evicts nothing.
  REQUIRE(idx.lock({16, 0}, 1, now));
  REQUIRE(idx.lock({100, 0}, 1, now));
  REQUIRE(idx.reserve({101, 0}, k_extent / 2, now, 0, *a).status == reserve_status::reserved);
  auto none = idx.reserve({102, 0}, k_extent / 2, now, 0, *a);
  CHECK(none.status == reserve_status::no_space);
  CHECK(none.reason == no_space_reason::all_pinned);
  CHECK(none.evicted.empty());
  CHECK_MESSAGE(none.detail.find("every extent holds a read-locked or reserved chunk") !=
                  std::string::npos, none.detail);
  for (uint64_t h : {4, 5, 6, 8, 13, 14, 15}) CHECK(idx.find({h, 0}));
  CHECK(idx.check_invariants());
}
