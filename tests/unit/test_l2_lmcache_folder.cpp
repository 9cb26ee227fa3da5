// LMCache-format L2 (l2.format = "lmcache"): object names exactly as
// LMCache 0.5.6's fs and resp adapters write them (literals printed by the
// wheel's own _object_key_to_filename / _object_key_to_string), and the
// folder (l2/lru_folder with the LMCache naming): raw bytes round-trip, a file of another length is a miss,
// files another writer left (before open or since) are found, LRU inside
// the size, stale temporaries removed, LMCache's own temporaries untouched.
#include <doctest/doctest.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utime.h>
#include <vector>

#include "l2/lru_folder.hpp"
#include "l2/lmcache_object_name.hpp"

using namespace kvs;

namespace {

struct temp_dir {
  std::string path;
  temp_dir() {
    char tmpl[] = "/tmp/kvs-l2-lmc-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~temp_dir() { std::system(("rm -rf '" + path + "'").c_str()); }
};

std::string digest(uint8_t first) {
  std::string h(32, '\0');
  for (int i = 0; i < 32; ++i) h[static_cast<size_t>(i)] = static_cast<char>(first + i);
  return h;
}

std::string payload(uint64_t seed, size_t n = 4096) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((seed * 131 + i * 7) & 0xff);
  return s;
}

std::string name_of(uint8_t h, int32_t rank = 0, std::string_view salt = "") {
  static std::string hs[256];
  hs[h] = digest(h);
  return lmcache_file_name({"org/model", lmcache_kv_rank(2, rank), 0, hs[h], salt});
}

/// The key name_of(h, rank, salt) names, its payload `layout` bytes long.
l2_key lkey(uint8_t h, int32_t rank = 0, std::string_view salt = "", uint64_t layout = 4096) {
  static std::string hs[256];
  hs[h] = digest(h);
  l2_key k;
  k.model = "org/model";
  k.rank = rank;
  k.world_size = 2;
  k.lmcache_hash = hs[h];
  k.salt = salt;
  k.layout = layout;
  return k;
}

l2_key sized(l2_key k, uint64_t layout) {
  k.layout = layout;
  return k;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::vector<std::string> files(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  while (auto* e = ::readdir(d))
    if (e->d_name[0] != '.') out.push_back(e->d_name);
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::unique_ptr<lru_folder> open_dir(const std::string& path, uint64_t size) {
  lru_folder_options o;
  o.path = path;
  o.size = size;
  auto t = lru_folder::open(o, make_lmcache_naming());
  REQUIRE(t);
  return std::move(*t);
}

} // namespace

TEST_CASE("lmcache names: byte for byte what the 0.5.6 wheel writes") {
  const std::string h = digest(0);
  lmcache_object_key k{"meta-llama/Llama-3.1-8B", lmcache_kv_rank(1, 0), 0, h, ""};
  CHECK(lmcache_kv_rank(1, 0) == 0x01000100u);
  CHECK(lmcache_file_name(k)
        == "meta-llama-SEP-Llama-3.1-8B@0x01000100@0@"
           "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f.data");
  CHECK(lmcache_redis_key("", k)
        == "meta-llama/Llama-3.1-8B@01000100@0@"
           "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f");
  lmcache_object_key s{"meta-llama/Llama-3.1-8B", lmcache_kv_rank(2, 1), 3, h, "tenant-a"};
  CHECK(lmcache_file_name(s)
        == "meta-llama-SEP-Llama-3.1-8B@0x02010201@3@"
           "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f@tenant-a.data");
  CHECK(lmcache_redis_key("pfx:", s)
        == "pfx:meta-llama/Llama-3.1-8B@02010201@3@"
           "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f@tenant-a");
}

TEST_CASE("lmcache names: a model or salt that could read as another key names nothing") {
  CHECK(lmcache_nameable("meta-llama/Llama-3.1-8B", ""));
  CHECK(lmcache_nameable("m", "tenant-a"));
  CHECK(lmcache_nameable("m", std::string(128, 's')));
  CHECK_FALSE(lmcache_nameable("m", std::string(129, 's')));
  CHECK_FALSE(lmcache_nameable("", ""));
  CHECK_FALSE(lmcache_nameable("x@01000100@0@00ff", ""));
  CHECK_FALSE(lmcache_nameable(std::string("x\0y", 3), ""));
  for (const char* bad : {"a@b", "a/b", "a\\b", "../x"})
    CHECK_FALSE(lmcache_nameable("m", bad));
  CHECK_FALSE(lmcache_nameable("m", std::string("a\0b", 3)));
}

TEST_CASE("lmcache names: file names parse back; anything else does not") {
  const std::string h = digest(7);
  auto f = parse_lmcache_file_name(
    lmcache_file_name({"a/b/c", lmcache_kv_rank(4, 3), 0x1f, h, "salt"}));
  REQUIRE(f);
  CHECK(f->model == "a/b/c");
  CHECK(f->kv_rank == lmcache_kv_rank(4, 3));
  CHECK(f->group == 0x1f);
  CHECK(f->chunk_hash == h);
  CHECK(f->salt == "salt");
  CHECK_FALSE(parse_lmcache_file_name("m@0x01000100@0@00ff.tmp"));          // LMCache's temporary
  CHECK_FALSE(parse_lmcache_file_name("m@0x01000100@0@00ff.data.12.kvstmp")); // ours
  CHECK_FALSE(parse_lmcache_file_name("m@0x01000100@0@0ff.data"));  // odd hex
  CHECK_FALSE(parse_lmcache_file_name("m@0x0100zz00@0@00ff.data"));
  CHECK_FALSE(parse_lmcache_file_name("m@0x01000100@0.data"));
  CHECK_FALSE(parse_lmcache_file_name("m@1@2@00ff@s@t.data"));
  CHECK_FALSE(parse_lmcache_file_name("00000000@00000000000000ff.kvl2")); // kvsidecar's format
  CHECK(parse_lmcache_file_name("m@1@2@00ff.data"));
}

TEST_CASE("lmcache dir: raw bytes round-trip; another length is a miss, the file kept") {
  temp_dir d;
  auto t = open_dir(d.path, 1 << 20);
  auto p = payload(1);
  CHECK(t->put_one(lkey(1), {p.data(), p.size()}) == lru_folder::put_result::stored);
  CHECK(files(d.path) == std::vector<std::string>{name_of(1)});
  struct stat sb;
  REQUIRE(::stat((d.path + "/" + name_of(1)).c_str(), &sb) == 0);
  CHECK(sb.st_size == 4096); // no header
  std::string out;
  CHECK(t->get_one(sized(lkey(1), 4096), &out));
  CHECK(out == p);
  CHECK_FALSE(t->get_one(sized(lkey(1), 4095), &out));
  CHECK_FALSE(t->get_one(sized(lkey(1), 8192), &out));
  CHECK_FALSE(t->get_one(sized(lkey(1), 0), &out));
  CHECK(t->stats().rejected == 3); // a layout of 0 bytes accepts nothing
  CHECK(t->contains_one(name_of(1))); // left alone
  CHECK(t->put_one(lkey(1), {p.data(), p.size()}) == lru_folder::put_result::exists);
  CHECK_FALSE(t->get_one(sized(lkey(2), 4096), &out));
  CHECK_FALSE(t->contains_one(name_of(2)));
}

TEST_CASE("lmcache dir: files another writer put there, before open and since, are found") {
  temp_dir d;
  auto a = payload(10), b = payload(11), c = payload(12);
  write_file(d.path + "/" + name_of(10), a);
  write_file(d.path + "/" + name_of(11, 1, "tenant"), b);
  write_file(d.path + "/notes.txt", "not an object");
  write_file(d.path + "/" + name_of(13).substr(0, name_of(13).size() - 5) + ".tmp", "in flight");
  auto t = open_dir(d.path, 1 << 20);
  CHECK(t->stats().recovered == 2);
  CHECK(t->stats().bytes == 8192);
  std::string out;
  CHECK(t->get_one(sized(lkey(10), 4096), &out));
  CHECK(out == a);
  CHECK(t->get_one(sized(lkey(11, 1, "tenant"), 4096), &out));
  CHECK(out == b);
  CHECK_FALSE(t->get_one(sized(lkey(11, 1), 4096), &out)); // unsalted: another object
  CHECK_FALSE(t->get_one(sized(lkey(11, 0, "tenant"), 4096), &out)); // another rank
  write_file(d.path + "/" + name_of(12), c); // another node, after open
  CHECK(t->contains_one(name_of(12)));
  CHECK(t->stats().adopted == 1);
  CHECK(t->get_one(sized(lkey(12), 4096), &out));
  CHECK(out == c);
  CHECK(t->stats().bytes == 3 * 4096);
  // Files that are not objects, and LMCache's temporary, are never touched.
  auto left = files(d.path);
  CHECK(std::count(left.begin(), left.end(), "notes.txt") == 1);
  CHECK(left.size() == 5);
}

TEST_CASE("lmcache dir: LRU inside the size; reopen keeps the order; stale temporaries go") {
  temp_dir d;
  std::vector<std::string> removed;
  {
    auto t = open_dir(d.path, 3 * 4096);
    t->on_removed = [&](const l2_removed& r) { removed.push_back(r.name); };
    for (uint8_t i = 1; i <= 3; ++i) {
      auto p = payload(i);
      REQUIRE(t->put_one(lkey(i), {p.data(), p.size()}) == lru_folder::put_result::stored);
      ::usleep(10000); // distinct mtimes for the reopen's order
    }
    std::string out;
    CHECK(t->get_one(sized(lkey(1), 4096), &out)); // 1 is now the newest
    auto p = payload(4);
    CHECK(t->put_one(lkey(4), {p.data(), p.size()}) == lru_folder::put_result::stored);
    CHECK(removed == std::vector<std::string>{name_of(2)});
    CHECK(t->lru_order() == std::vector<std::string>{name_of(3), name_of(1), name_of(4)});
    auto big = payload(5, 4 * 4096);
    CHECK(t->put_one(lkey(5), {big.data(), big.size()}) == lru_folder::put_result::too_large);
  }
  const std::string stale = d.path + "/" + name_of(9) + ".123.kvstmp";
  const std::string fresh = d.path + "/" + name_of(8) + ".124.kvstmp";
  write_file(stale, "x");
  write_file(fresh, "y");
  struct utimbuf old{::time(nullptr) - 3600, ::time(nullptr) - 3600};
  REQUIRE(::utime(stale.c_str(), &old) == 0);
  // Smaller: the oldest go. A read does not touch a file (it may be
  // another node's), so the reopen's order is the writes' (3, 1, 4 -> 1, 3, 4).
  auto t = open_dir(d.path, 2 * 4096);
  CHECK(t->stats().recovered == 3);
  CHECK(t->stats().dropped_at_open == 1);
  CHECK(t->lru_order() == std::vector<std::string>{name_of(3), name_of(4)});
  CHECK(::access(stale.c_str(), F_OK) != 0);
  CHECK(::access(fresh.c_str(), F_OK) == 0); // another node's write may be in flight
}

TEST_CASE("lmcache dir: ENOSPC on write is a skip, nothing left behind") {
  temp_dir d;
  lru_folder_options o;
  o.path = d.path;
  o.size = 1 << 20;
  o.writev = [](int, const iovec*, int) -> ssize_t {
    errno = ENOSPC;
    return -1;
  };
  auto t = lru_folder::open(o, make_lmcache_naming());
  REQUIRE(t);
  auto p = payload(1);
  CHECK((*t)->put_one(lkey(1), {p.data(), p.size()}) == lru_folder::put_result::no_space);
  CHECK((*t)->stats().no_space == 1);
  CHECK(files(d.path).empty());
}
