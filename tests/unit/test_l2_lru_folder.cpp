// The L2 folder in kvsidecar's layout (l2/lru_folder with the kvsidecar
// naming): objects round-trip, LRU inside the size, the index survives a
// reopen, per-salt usage is counted as objects come and go, and faults
// (ENOSPC, EIO, corrupt or foreign files, files deleted behind its back) are
// misses or skips, counted.
#include <doctest/doctest.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "l2/lru_folder.hpp"
#include "l2/object_header.hpp"

using namespace kvs;

namespace {

struct temp_dir {
  std::string path;
  temp_dir() {
    char tmpl[] = "/tmp/kvs-l2-disk-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~temp_dir() { std::system(("rm -rf '" + path + "'").c_str()); }
};

l2_object_id id_of(uint64_t hash, int32_t rank = 0) {
  return l2_object_id{hash, rank, l2_model_fingerprint("m", ""), 4096};
}

l2_key key_of(uint64_t hash, int32_t rank = 0) {
  l2_key k;
  k.hash = hash;
  k.rank = rank;
  k.fingerprint = l2_model_fingerprint("m", "");
  k.layout = 4096;
  k.model = "m";
  return k;
}

std::string name_of(uint64_t hash, int32_t rank = 0) {
  return *make_kvsidecar_naming()->file_name(key_of(hash, rank));
}

/// The folder's LRU order as (hash, rank).
std::vector<std::pair<uint64_t, int32_t>> order_of(const lru_folder& t) {
  std::vector<std::pair<uint64_t, int32_t>> out;
  auto naming = make_kvsidecar_naming();
  for (auto& n : t.lru_order()) {
    auto f = naming->parse_file_name(n);
    out.emplace_back(*f->hash, f->rank);
  }
  return out;
}

std::string payload(uint64_t seed, size_t n = 4096) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i)
    s[i] = static_cast<char>((seed * 131 + i * 7) & 0xff);
  return s;
}

std::vector<std::string> files(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  while (auto* e = ::readdir(d))
    if (e->d_name[0] != '.')
      out.push_back(e->d_name);
  ::closedir(d);
  return out;
}

std::unique_ptr<lru_folder> open_tier(const std::string& path, uint64_t size,
                                      decltype(lru_folder_options::writev) w = {}) {
  lru_folder_options o;
  o.path = path;
  o.size = size;
  o.writev = std::move(w);
  auto t = lru_folder::open(o, make_kvsidecar_naming());
  REQUIRE_MESSAGE(t, (t ? "" : t.error_value().detail));
  return std::move(*t);
}

} // namespace

TEST_CASE("object header: round trip and every rejection") {
  uint8_t h[l2_header_bytes];
  auto id = id_of(0xabcdef, 3);
  encode_l2_header(id, 100, h);
  uint64_t n = 0;
  CHECK(check_l2_header(h, 164, id, &n) == l2_header_check::ok);
  CHECK(n == 100);
  CHECK(check_l2_header(h, 163, id) == l2_header_check::wrong_size);
  CHECK(check_l2_header(h, 10, id) == l2_header_check::short_object);
  CHECK(check_l2_header(h, 164, id_of(0xabcdef, 2)) == l2_header_check::wrong_key);
  auto other_model = id;
  other_model.model = l2_model_fingerprint("m2", "");
  CHECK(check_l2_header(h, 164, other_model) == l2_header_check::wrong_model);
  auto other_layout = id;
  other_layout.layout = 8192;
  CHECK(check_l2_header(h, 164, other_layout) == l2_header_check::wrong_layout);
  h[20] ^= 1; // inside the checksummed fields
  CHECK(check_l2_header(h, 164, id) == l2_header_check::bad_checksum);
  h[0] = 'X';
  CHECK(check_l2_header(h, 164, id) == l2_header_check::bad_magic);
}

TEST_CASE("LMCache 0.5.6 key schema") {
  CHECK(l2_key_string("", "meta-llama/Llama-3.1-8B", 1, 0, 0x00ab, "")
        == "meta-llama/Llama-3.1-8B@00000001@0@00000000000000ab");
  CHECK(l2_key_string("kvs:", "m", 255, 10, 0xffffffffffffffffull, "tenant")
        == "kvs:m@000000ff@a@ffffffffffffffff@tenant");
}

TEST_CASE("put, get, contains; a second put of the same chunk is skipped") {
  temp_dir d;
  auto t = open_tier(d.path, 1 << 20);
  auto p = payload(1);
  CHECK(t->put_one(key_of(1), {p.data(), p.size()}) == lru_folder::put_result::stored);
  CHECK(t->put_one(key_of(1), {p.data(), p.size()}) == lru_folder::put_result::exists);
  CHECK(t->contains_one(name_of(1)));
  CHECK_FALSE(t->contains_one(name_of(1, 1)));
  std::string out;
  REQUIRE(t->get_one(key_of(1), &out));
  CHECK(out == p);
  CHECK_FALSE(t->get_one(key_of(2), &out));
  CHECK(t->stats().objects == 1);
  CHECK(t->stats().bytes == p.size() + l2_header_bytes);
  // Only the final file is left: no temp files.
  CHECK(files(d.path) == std::vector<std::string>{"00000000@0000000000000001.kvl2"});
}

TEST_CASE("LRU eviction inside the size; a get refreshes recency") {
  temp_dir d;
  const uint64_t obj = 4096 + l2_header_bytes;
  auto t = open_tier(d.path, 3 * obj);
  std::vector<uint64_t> removed;
  t->on_removed = [&](const l2_removed& r) { removed.push_back(*r.fields.hash); };
  for (uint64_t h = 1; h <= 3; ++h)
    REQUIRE(t->put_one(key_of(h), {payload(h).data(), 4096}) == lru_folder::put_result::stored);
  std::string out;
  REQUIRE(t->get_one(key_of(1), &out)); // 1 is now the most recent
  REQUIRE(t->put_one(key_of(4), {payload(4).data(), 4096}) == lru_folder::put_result::stored);
  CHECK(removed == std::vector<uint64_t>{2});
  CHECK_FALSE(t->contains_one(name_of(2)));
  CHECK(t->stats().evictions == 1);
  CHECK(t->stats().bytes == 3 * obj);
  CHECK(files(d.path).size() == 3);
  // Bigger than the whole tier: skipped, nothing evicted.
  std::string big(4 * obj, 'x');
  CHECK(t->put_one(key_of(9), {big.data(), big.size()}) == lru_folder::put_result::too_large);
  CHECK(t->stats().too_large == 1);
  CHECK(t->stats().objects == 3);
}

TEST_CASE("the index survives a reopen, in LRU order; stray temp files go") {
  temp_dir d;
  {
    auto t = open_tier(d.path, 1 << 20);
    for (uint64_t h = 1; h <= 3; ++h) {
      REQUIRE(t->put_one(key_of(h, 2), {payload(h).data(), 4096}) == lru_folder::put_result::stored);
      // mtime resolution: make the write order visible to the rescan.
      struct timespec ts[2] = {{0, UTIME_OMIT}, {static_cast<time_t>(1000 + h), 0}};
      char name[64];
      std::snprintf(name, sizeof name, "/00000002@%016llx.kvl2", static_cast<unsigned long long>(h));
      ::utimensat(AT_FDCWD, (d.path + name).c_str(), ts, 0);
    }
  }
  std::ofstream(d.path + "/00000000@0000000000000007.kvl2.tmp") << "half";
  std::ofstream(d.path + "/unrelated.txt") << "not ours";
  auto t = open_tier(d.path, 1 << 20);
  CHECK(t->stats().recovered == 3);
  CHECK(t->stats().dropped_at_open == 1);
  CHECK(order_of(*t) == std::vector<std::pair<uint64_t, int32_t>>{{1, 2}, {2, 2}, {3, 2}});
  std::string out;
  REQUIRE(t->get_one(key_of(2, 2), &out));
  CHECK(out == payload(2));
  // Foreign files are left alone.
  CHECK(::access((d.path + "/unrelated.txt").c_str(), F_OK) == 0);
  // A smaller size at reopen trims the oldest.
  t.reset();
  auto small = open_tier(d.path, 2 * (4096 + l2_header_bytes));
  CHECK(order_of(*small) == std::vector<std::pair<uint64_t, int32_t>>{{2, 2}, {3, 2}});
}

TEST_CASE("corrupt, truncated and foreign objects are misses, removed and counted") {
  temp_dir d;
  auto t = open_tier(d.path, 1 << 20);
  for (uint64_t h = 1; h <= 3; ++h)
    REQUIRE(t->put_one(key_of(h), {payload(h).data(), 4096}) == lru_folder::put_result::stored);
  auto name = [&](uint64_t h) {
    char n[64];
    std::snprintf(n, sizeof n, "/00000000@%016llx.kvl2", static_cast<unsigned long long>(h));
    return d.path + n;
  };
  // 1: header byte flipped; 2: truncated payload; 3: a different layout asked.
  {
    int fd = ::open(name(1).c_str(), O_WRONLY);
    uint8_t x = 0xff;
    REQUIRE(::pwrite(fd, &x, 1, 17) == 1);
    ::close(fd);
  }
  REQUIRE(::truncate(name(2).c_str(), 100) == 0);
  std::string out;
  CHECK_FALSE(t->get_one(key_of(1), &out));
  CHECK_FALSE(t->get_one(key_of(2), &out));
  auto wrong_layout = key_of(3);
  wrong_layout.layout = 123;
  CHECK_FALSE(t->get_one(wrong_layout, &out));
  CHECK(t->stats().rejected == 3);
  CHECK(t->stats().objects == 0);
  CHECK(files(d.path).empty());
  // Deleted behind our back: a miss, forgotten.
  REQUIRE(t->put_one(key_of(4), {payload(4).data(), 4096}) == lru_folder::put_result::stored);
  ::unlink(name(4).c_str());
  CHECK_FALSE(t->get_one(key_of(4), &out));
  CHECK_FALSE(t->contains_one(name_of(4)));
  // A corrupt file found at open is dropped there.
  REQUIRE(t->put_one(key_of(5), {payload(5).data(), 4096}) == lru_folder::put_result::stored);
  t.reset();
  REQUIRE(::truncate(name(5).c_str(), 64 + 10) == 0);
  auto again = open_tier(d.path, 1 << 20);
  CHECK(again->stats().recovered == 0);
  CHECK(again->stats().dropped_at_open == 1);
}

TEST_CASE("ENOSPC and EIO while writing are skips: no file, nothing indexed") {
  temp_dir d;
  int fail_with = ENOSPC;
  size_t calls = 0;
  auto t = open_tier(d.path, 1 << 20, [&](int fd, const iovec* iov, int n) -> ssize_t {
    ++calls;
    if (fail_with == 0)
      return ::writev(fd, iov, n);
    if (calls % 2 == 1) // a short write first, then the error
      return ::write(fd, iov[0].iov_base, 10);
    errno = fail_with;
    return -1;
  });
  auto p = payload(1);
  CHECK(t->put_one(key_of(1), {p.data(), p.size()}) == lru_folder::put_result::no_space);
  fail_with = EIO;
  CHECK(t->put_one(key_of(2), {p.data(), p.size()}) == lru_folder::put_result::io_error);
  CHECK(t->stats().no_space == 1);
  CHECK(t->stats().io_errors == 1);
  CHECK(t->stats().objects == 0);
  CHECK(files(d.path).empty());
  // Short writes are resumed where they stopped.
  fail_with = 0;
  size_t before = calls;
  auto chunky = open_tier(d.path, 1 << 20, [&](int fd, const iovec* iov, int) -> ssize_t {
    ++calls;
    return ::write(fd, iov[0].iov_base, std::min<size_t>(iov[0].iov_len, 1000));
  });
  REQUIRE(chunky->put_one(key_of(3), {p.data(), p.size()}) == lru_folder::put_result::stored);
  CHECK(calls - before > 4);
  std::string out;
  REQUIRE(chunky->get_one(key_of(3), &out));
  CHECK(out == p);
}

TEST_CASE("open refuses a path it cannot use") {
  lru_folder_options o;
  o.path = "/proc/self/kvs-not-creatable";
  o.size = 1;
  auto t = lru_folder::open(o, make_kvsidecar_naming());
  REQUIRE_FALSE(t);
  CHECK(t.error_value().kind == "io");
  CHECK(t.error_value().detail.find("/proc/self/kvs-not-creatable") != std::string::npos);
}

TEST_CASE("clear removes every object and file, each told to on_removed, none an eviction") {
  temp_dir d;
  auto t = open_tier(d.path, 1 << 20);
  std::vector<uint64_t> removed;
  t->on_removed = [&](const l2_removed& r) { removed.push_back(*r.fields.hash); };
  for (uint64_t h = 1; h <= 3; ++h) {
    auto p = payload(h);
    REQUIRE(t->put_one(key_of(h), {p.data(), p.size()}) == lru_folder::put_result::stored);
  }
  CHECK(t->clear() == 3);
  CHECK(removed == std::vector<uint64_t>{1, 2, 3});
  CHECK(files(d.path).empty());
  CHECK(t->stats().objects == 0);
  CHECK(t->stats().bytes == 0);
  CHECK(t->stats().evictions == 0);
  CHECK_FALSE(t->contains_one(name_of(2)));
  CHECK(t->clear() == 0);
  auto p = payload(9); // and it takes objects again
  CHECK(t->put_one(key_of(9), {p.data(), p.size()}) == lru_folder::put_result::stored);
}
