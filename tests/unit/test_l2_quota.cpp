// L2 quotas (l2.quota_mode = "isolated"): a folder's per-salt usage and
// IsolatedLRU passes give what LMCache 0.5.6's own classes give for the
// same writes, reads and quotas. The expected victims and survivors below
// were printed by the 0.5.6 wheel's IsolatedLRUEvictionPolicy and
// QuotaManager driven as its L2EvictionController's per-salt pass drives
// them (watermark 0.8, ratio 0.2; each put a batch, entered last first).
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "l2/l2_quota.hpp"
#include "l2/lmcache_object_name.hpp"
#include "l2/lru_folder.hpp"

using namespace kvs;

namespace {

struct temp_dir {
  std::string path;
  temp_dir() {
    char tmpl[] = "/tmp/kvs-l2-quota-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~temp_dir() { std::system(("rm -rf '" + path + "'").c_str()); }
};

/// Object i of `salt`: LMCache's chunk hash is 32 bytes of i, 1000 bytes.
struct object {
  std::string hash, salt;
  l2_key key() const {
    l2_key k;
    k.model = "m";
    k.lmcache_hash = hash;
    k.salt = salt;
    k.layout = 1000;
    return k;
  }
};

object obj(uint8_t i, const char* salt) {
  return {std::string(32, static_cast<char>(i)), salt};
}

/// (first hash byte, salt) of a file name.
std::pair<int, std::string> what(const std::string& name) {
  auto f = parse_lmcache_file_name(name);
  REQUIRE(f);
  return {static_cast<uint8_t>(f->chunk_hash[0]), f->salt};
}

void put_batch(lru_folder& t, const std::vector<object>& batch) {
  std::vector<l2_key> keys;
  std::vector<std::string> names;
  for (auto& o : batch) {
    keys.push_back(o.key());
    names.push_back(*t.name(keys.back()));
  }
  const std::string bytes(1000, 'x');
  std::vector<l2_backend::put_item> items;
  for (size_t i = 0; i < keys.size(); ++i)
    items.push_back({&names[i], &keys[i], bytes});
  auto ok = t.put(items);
  for (bool b : ok)
    REQUIRE(b);
}

} // namespace

TEST_CASE("L2 quotas: usage by salt and IsolatedLRU passes as LMCache 0.5.6 computes them") {
  temp_dir d;
  lru_folder_options o;
  o.path = d.path;
  o.size = 1 << 20;
  auto opened = lru_folder::open(o, make_lmcache_naming());
  REQUIRE(opened);
  auto& t = **opened;
  std::vector<object> a1, b, a2, c;
  for (uint8_t i = 0; i < 6; ++i) a1.push_back(obj(i, "a"));
  for (uint8_t i = 10; i < 15; ++i) b.push_back(obj(i, "b"));
  for (uint8_t i = 20; i < 26; ++i) a2.push_back(obj(i, "a"));
  for (uint8_t i = 30; i < 32; ++i) c.push_back(obj(i, "c"));
  for (auto* batch : {&a1, &b, &a2, &c})
    put_batch(t, *batch);
  std::string out;
  REQUIRE(t.get_one(obj(3, "a").key(), &out)); // LMCache: on_keys_touched([2, 3])
  REQUIRE(t.get_one(obj(2, "a").key(), &out));
  CHECK(t.usage().bytes("a") == 12000);
  CHECK(t.usage().bytes("b") == 5000);
  CHECK(t.usage().bytes("c") == 2000);

  l2_quota_limits limits{{"a", 5000}, {"b", 10000}}; // "c" has none: limit 0
  const l2_quota_rule rule{0.8, 0.2};
  const std::vector<std::vector<std::pair<int, std::string>>> lmcache_cycles = {
    {{5, "a"}, {4, "a"}, {31, "c"}, {30, "c"}},
    {{1, "a"}, {0, "a"}},
    {{25, "a"}},
    {{24, "a"}},
    {{23, "a"}},
    {{22, "a"}},
    {{21, "a"}},
    {},
  };
  for (size_t n = 0; n < lmcache_cycles.size(); ++n) {
    CAPTURE(n);
    auto victims = l2_quota_victims(t.usage(), limits, rule);
    std::vector<std::pair<int, std::string>> got;
    for (auto& v : victims)
      got.push_back(what(v));
    CHECK(got == lmcache_cycles[n]);
    CHECK(t.erase(victims) == victims.size());
  }
  // LMCache's usage {'a': 3000, 'b': 5000}; survivors a: 2, 3, 20; b: all.
  CHECK(t.usage().bytes_by_salt() == std::map<std::string, uint64_t, std::less<>>{{"a", 3000},
                                                                                    {"b", 5000}});
  std::vector<std::pair<int, std::string>> left;
  for (auto& name : t.lru_order())
    left.push_back(what(name));
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::pair<int, std::string>>{{2, "a"}, {3, "a"}, {10, "b"},
                                                         {11, "b"}, {12, "b"}, {13, "b"},
                                                         {14, "b"}, {20, "a"}});
}

TEST_CASE("L2 usage: counted as objects are written, erased, evicted and found at start-up") {
  temp_dir d;
  lru_folder_options o;
  o.path = d.path;
  o.size = 5 * 1000;
  {
    auto t = lru_folder::open(o, make_lmcache_naming());
    REQUIRE(t);
    put_batch(**t, {obj(1, "a"), obj(2, "a"), obj(3, "b")});
    CHECK((*t)->usage().bytes("a") == 2000);
    CHECK((*t)->usage().bytes("b") == 1000);
    put_batch(**t, {obj(4, "b"), obj(5, "b"), obj(6, "")}); // evicts 1 (the folder's LRU)
    CHECK((*t)->stats().evictions == 1);
    CHECK((*t)->usage().bytes("a") == 1000);
    CHECK((*t)->usage().bytes("b") == 3000);
    CHECK((*t)->usage().bytes("") == 1000);
    CHECK((*t)->erase({*(*t)->name(obj(2, "a").key())}) == 1);
    CHECK((*t)->usage().bytes_by_salt().count("a") == 0); // a bucket at zero is dropped
  }
  auto t = lru_folder::open(o, make_lmcache_naming()); // found at start-up, by the names' salts
  REQUIRE(t);
  CHECK((*t)->stats().recovered == 4);
  CHECK((*t)->usage().bytes_by_salt()
        == std::map<std::string, uint64_t, std::less<>>{{"", 1000}, {"b", 3000}});
  CHECK((*t)->usage().objects("b") == 3);
}

TEST_CASE("L2 usage: kvsidecar's layout counts payload bytes, its salt in the file name") {
  temp_dir d;
  lru_folder_options o;
  o.path = d.path;
  o.size = 1 << 20;
  l2_key k;
  k.hash = 7;
  k.model = "m";
  k.salt = "tenant";
  k.layout = 4096;
  const std::string bytes(4096, 'y');
  {
    auto t = lru_folder::open(o, make_kvsidecar_naming());
    REQUIRE(t);
    REQUIRE((*t)->put_one(k, bytes) == lru_folder::put_result::stored);
    CHECK((*t)->lru_order() == std::vector<std::string>{"00000000@0000000000000007@tenant.kvl2"});
    CHECK((*t)->usage().bytes("tenant") == 4096);
  }
  auto t = lru_folder::open(o, make_kvsidecar_naming());
  REQUIRE(t);
  CHECK((*t)->stats().recovered == 1);
  CHECK((*t)->usage().bytes("tenant") == 4096);
  std::string out;
  CHECK((*t)->get_one(k, &out));
  CHECK(out == bytes);
}
