// The Redis client against real redis-server processes started here on
// loopback (skipped when redis-server is not installed): a single node with
// AUTH and TTL, and a 3-master cluster for slot routing, MOVED, ASK and a
// node going down.
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "l2/l2_naming.hpp"
#include "l2/l2_quota.hpp"
#include "l2/lmcache_object_name.hpp"
#include "l2/redis_backend.hpp"
#include "l2/redis_client.hpp"

using namespace kvs;
using namespace std::chrono_literals;

namespace {

bool have_redis() {
  return std::system("command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1") == 0;
}

bool port_free(int port) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(s);
  return ok;
}

/// A free port below 55535 whose cluster bus port (+10000) is free too.
int free_port() {
  static unsigned seed = static_cast<unsigned>(::getpid()) * 7919u;
  for (;;) {
    seed = seed * 1103515245u + 12345u;
    int p = 20000 + static_cast<int>((seed >> 8) % 30000);
    if (port_free(p) && port_free(p + 10000))
      return p;
  }
}

/// One redis-server child; killed (SIGKILL) and reaped on destruction.
struct redis_proc {
  pid_t pid = -1;
  int port = 0;
  std::string dir;
  explicit redis_proc(std::vector<std::string> extra, int at_port = 0) {
    port = at_port ? at_port : free_port();
    char tmpl[] = "/tmp/kvs-redis-XXXXXX";
    dir = ::mkdtemp(tmpl);
    std::vector<std::string> args = {"redis-server", "--port", std::to_string(port),
                                     "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                     "--dir", dir, "--logfile", dir + "/log"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid = ::fork();
    if (pid == 0) {
      std::vector<char*> argv;
      for (auto& a : args)
        argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execvp("redis-server", argv.data());
      ::_exit(127);
    }
    wait_ready();
  }
  void wait_ready() {
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
      auto r = cli("PING");
      if (r == "PONG" || r.find("NOAUTH") != std::string::npos)
        return;
      std::this_thread::sleep_for(20ms);
    }
    kill();
    FAIL("redis-server on port " << port << " did not start");
  }
  std::string cli(const std::string& args, const std::string& auth = "") const {
    std::string cmd = "redis-cli -p " + std::to_string(port)
                      + (auth.empty() ? "" : " -a " + auth + " --no-auth-warning") + " " + args
                      + " 2>/dev/null";
    std::string out;
    if (FILE* f = ::popen(cmd.c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0)
        out.append(buf, n);
      ::pclose(f);
    }
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r'))
      out.pop_back();
    return out;
  }
  void kill() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
  ~redis_proc() {
    kill();
    std::system(("rm -rf '" + dir + "'").c_str());
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port); }
};

/// Three masters, no replicas; full coverage not required so one dead master
/// only loses its own slots.
struct redis_cluster {
  std::vector<std::unique_ptr<redis_proc>> nodes;
  redis_cluster() {
    std::string create = "redis-cli --cluster create";
    for (int i = 0; i < 3; ++i) {
      nodes.push_back(std::make_unique<redis_proc>(std::vector<std::string>{
        "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
        "--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no"}));
      create += " " + nodes.back()->endpoint();
    }
    create += " --cluster-yes >/dev/null 2>&1";
    REQUIRE(std::system(create.c_str()) == 0);
    auto deadline = std::chrono::steady_clock::now() + 20s;
    while (std::chrono::steady_clock::now() < deadline) {
      bool ok = true;
      for (auto& n : nodes)
        ok = ok && n->cli("CLUSTER INFO").find("cluster_state:ok") != std::string::npos;
      if (ok)
        return;
      std::this_thread::sleep_for(50ms);
    }
    FAIL("cluster never reached cluster_state:ok");
  }
  /// The node owning `slot` (by CLUSTER SLOTS of node 0).
  redis_proc* owner(uint16_t slot) {
    for (auto& n : nodes) {
      // GET on the owner answers (nil), elsewhere MOVED.
      auto r = n->cli("GET " + key_in_slot(slot));
      if (r.rfind("MOVED", 0) != 0)
        return n.get();
    }
    return nullptr;
  }
  static std::string key_in_slot(uint16_t slot) {
    for (int i = 0;; ++i) {
      auto k = "k" + std::to_string(i);
      if (redis_key_slot(k) == slot)
        return k;
    }
  }
};

} // namespace

TEST_CASE("CRC16 hash slots match Redis Cluster's") {
  CHECK(redis_key_slot("123456789") == (0x31C3 & 16383));
  CHECK(redis_key_slot("foo") == 12182);
  CHECK(redis_key_slot("{user1000}.following") == redis_key_slot("user1000"));
  CHECK(redis_key_slot("foo{}{bar}") == redis_key_slot("foo{}{bar}")); // empty tag: whole key
  CHECK(redis_key_slot("{}x") != redis_key_slot(""));
}

TEST_CASE("single node: pipelined SET/GET/EXISTS, binary values, AUTH, TTL") {
  if (!have_redis())
    return;
  redis_proc srv({"--requirepass", "s3cret"});
  redis_options o;
  o.endpoints = {srv.endpoint()};
  o.password = "s3cret";
  o.ttl = 60000ms;
  redis_client c(o);
  std::vector<std::string> keys, values;
  std::vector<std::string_view> views;
  for (int i = 0; i < 50; ++i) {
    keys.push_back("m@00000000@0@" + std::to_string(i));
    values.push_back(std::string(1000 + i, static_cast<char>(i)) + std::string("\0\r\n", 3));
  }
  for (auto& v : values)
    views.push_back(v);
  auto ok = c.set(keys, views);
  CHECK(std::count(ok.begin(), ok.end(), true) == 50);
  auto got = c.get(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(got[i]);
    CHECK(*got[i] == values[i]);
  }
  auto ex = c.exists({keys[0], "absent"});
  CHECK(ex == std::vector<bool>{true, false});
  auto ttl = std::atoll(srv.cli("PTTL " + keys[0], "s3cret").c_str());
  CHECK(ttl > 50000);
  CHECK(ttl <= 60000);
  CHECK(c.stats().connects == 1);

  // A wrong password: every op fails as a miss, the reason is kept.
  o.password = "wrong";
  redis_client bad(o);
  CHECK_FALSE(bad.get({keys[0]})[0]);
  CHECK(bad.last_error().find("AUTH") != std::string::npos);
}

TEST_CASE("redis backend: usage by salt as written, read and erased; LMCache's keys listed") {
  if (!have_redis())
    return;
  redis_proc srv({});
  redis_options o;
  o.endpoints = {srv.endpoint()};
  redis_backend b(o, "", make_lmcache_naming());
  std::vector<std::string> hashes;
  std::vector<l2_key> keys;
  for (int i = 0; i < 4; ++i)
    hashes.push_back(std::string(32, static_cast<char>(i + 1)));
  for (int i = 0; i < 4; ++i) {
    l2_key k;
    k.model = "org/m";
    k.lmcache_hash = hashes[static_cast<size_t>(i)];
    k.salt = i < 3 ? "a" : "b";
    k.layout = 1000;
    keys.push_back(k);
  }
  std::vector<std::string> names;
  for (auto& k : keys)
    names.push_back(*b.name(k));
  const std::string bytes(1000, 'z');
  std::vector<l2_backend::put_item> items;
  for (size_t i = 0; i < keys.size(); ++i)
    items.push_back({&names[i], &keys[i], bytes});
  CHECK(b.put(items) == std::vector<bool>(4, true));
  CHECK(b.usage().bytes("a") == 3000);
  CHECK(b.usage().bytes("b") == 1000);
  // One write's objects: its last is its salt's oldest (IsolatedLRU's order).
  CHECK(b.usage().oldest("a", 3) == std::vector<std::string>{names[2], names[1], names[0]});
  std::vector<std::string> values(1);
  std::vector<uint32_t> skip;
  CHECK(b.get({{&names[2], &keys[2]}}, values, skip) == std::vector<bool>{true});
  CHECK(b.usage().oldest("a", 1) == std::vector<std::string>{names[1]}); // read: newest
  // A quota pass (a's limit 2000: 3000 >= 0.8 x 2000) erases a's oldest.
  auto victims = l2_quota_victims(b.usage(), {{"a", 2000}, {"b", 10000}}, {0.8, 0.2});
  CHECK(victims == std::vector<std::string>{names[1]});
  CHECK(b.erase(victims) == 1);
  CHECK(srv.cli("EXISTS " + names[1]) == "0");
  CHECK(b.usage().bytes("a") == 2000);
  // Listed with LMCache's key fields, read back from the Redis key.
  auto page = b.list(0, 10);
  CHECK(page.total == 3);
  REQUIRE(page.objects.size() == 3);
  for (auto& e : page.objects) {
    auto f = b.fields_of(e.name);
    REQUIRE(f);
    CHECK(f->model == "org/m");
    CHECK(f->kv_rank == lmcache_kv_rank(1, 0));
    CHECK(f->chunk_hash.size() == 32);
    CHECK(*b.name_of(*f) == e.name);
  }
}

TEST_CASE("single node: large and small values in one pipeline, headers, get_into reuse") {
  if (!have_redis())
    return;
  redis_proc srv({});
  redis_options o;
  o.endpoints = {srv.endpoint()};
  redis_client c(o);
  // Sizes around the writer's by-reference threshold (16 KiB) and the
  // reader's buffer (64 KiB), and far beyond; each value distinct.
  std::vector<size_t> sizes = {0, 1, 16383, 16384, 65535, 65536, 65537, 3 << 20, 7, 1 << 20};
  std::vector<std::string> keys, values, heads;
  std::vector<std::string_view> vv, hv;
  for (size_t i = 0; i < sizes.size(); ++i) {
    keys.push_back("mix" + std::to_string(i));
    std::string v(sizes[i], '\0');
    for (size_t b = 0; b < v.size(); ++b)
      v[b] = static_cast<char>(b * 7 + i);
    values.push_back(std::move(v));
    heads.push_back(i % 2 ? std::string(64, static_cast<char>('A' + i)) : std::string());
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    vv.push_back(values[i]);
    hv.push_back(heads[i]);
  }
  auto ok = c.set(keys, vv, hv);
  CHECK(std::count(ok.begin(), ok.end(), true) == static_cast<long>(sizes.size()));
  // The server holds head + value, byte for byte.
  CHECK(std::atoll(srv.cli("STRLEN mix7").c_str()) == static_cast<long long>(64 + (3 << 20)));
  std::vector<std::string> got;
  auto ask = keys;
  ask.insert(ask.begin() + 3, "absent"); // a nil among the bulks
  auto hit = c.get_into(ask, got);
  REQUIRE(got.size() == ask.size());
  for (size_t i = 0, k = 0; i < ask.size(); ++i) {
    if (ask[i] == "absent") {
      CHECK_FALSE(hit[i]);
      CHECK(got[i].empty());
      continue;
    }
    CHECK(hit[i]);
    CHECK(got[i] == heads[k] + values[k]);
    ++k;
  }
  // Read again into the same strings: the large one is overwritten in
  // place, not reallocated.
  auto* before = got[8].data(); // mix7, 3 MiB + 64
  hit = c.get_into(ask, got);
  CHECK(hit[8]);
  CHECK(got[8].data() == before);
  CHECK(got[8] == heads[7] + values[7]);
  CHECK(c.stats().errors == 0);
  CHECK(c.stats().connects == 1);
}

TEST_CASE("single node: one pipeline of more pieces than one sendmsg takes (IOV_MAX)") {
  if (!have_redis())
    return;
  redis_proc srv({});
  redis_options o;
  o.endpoints = {srv.endpoint()};
  redis_client c(o);
  // 700 values sent by reference, each between two copied pieces: > 1024
  // iovecs, so the writer splits them over several sendmsg calls, and 11 MB
  // is more than one call sends (partial writes).
  std::vector<std::string> keys, values;
  std::vector<std::string_view> views;
  for (int i = 0; i < 700; ++i) {
    keys.push_back("iov" + std::to_string(i));
    values.push_back(std::string(16384 + i, static_cast<char>(i)) + std::to_string(i));
  }
  for (auto& v : values)
    views.push_back(v);
  auto ok = c.set(keys, views);
  CHECK(std::count(ok.begin(), ok.end(), true) == 700);
  auto got = c.get(keys);
  size_t same = 0;
  for (size_t i = 0; i < keys.size(); ++i)
    same += got[i] == values[i];
  CHECK(same == 700);
  CHECK(c.stats().errors == 0);
}

TEST_CASE("single node: a restart is reconnected to by itself") {
  if (!have_redis())
    return;
  auto srv = std::make_unique<redis_proc>(std::vector<std::string>{});
  int port = srv->port;
  redis_options o;
  o.endpoints = {srv->endpoint()};
  o.timeout = 200ms;
  o.retry_after = 50ms;
  redis_client c(o);
  std::string v = "value";
  CHECK(c.set({"a"}, {v})[0]);
  srv.reset();                  // killed: the connection breaks
  CHECK_FALSE(c.get({"a"})[0]); // a miss, not a throw
  CHECK(c.stats().errors + c.stats().unreachable >= 1);
  CHECK_FALSE(c.get({"a"})[0]); // still down (connect refused or skipped)
  redis_proc back({}, port);    // same port, empty
  auto deadline = std::chrono::steady_clock::now() + 5s;
  bool stored = false;
  while (!stored && std::chrono::steady_clock::now() < deadline) {
    stored = c.set({"a"}, {v})[0];
    if (!stored)
      std::this_thread::sleep_for(10ms);
  }
  CHECK(stored);
  CHECK(c.get({"a"})[0] == v);
  CHECK(c.stats().connects == 2);
}

TEST_CASE("cluster: slot routing, MOVED, ASK, a dead master loses only its slots") {
  if (!have_redis())
    return;
  redis_cluster cl;
  redis_options o;
  o.endpoints = {cl.nodes[0]->endpoint()}; // one seed is enough
  o.cluster = true;
  o.timeout = 300ms;
  o.retry_after = 100ms;
  o.connections = 2;
  redis_client c(o);
  std::vector<std::string> keys, values;
  std::vector<std::string_view> views;
  for (int i = 0; i < 300; ++i) {
    keys.push_back("model@00000000@0@" + std::to_string(i));
    values.push_back("v" + std::to_string(i));
  }
  for (auto& v : values)
    views.push_back(v);
  auto ok = c.set(keys, views);
  CHECK(std::count(ok.begin(), ok.end(), true) == 300);
  CHECK(c.node_count() == 3);
  CHECK(c.stats().moved == 0); // the slot map was right from the start
  // Every node got some: the keys were spread by slot.
  for (auto& n : cl.nodes)
    CHECK(std::atoi(n->cli("DBSIZE").c_str()) > 0);
  auto got = c.get(keys);
  for (size_t i = 0; i < keys.size(); ++i)
    CHECK(got[i] == values[i]);

  // MOVED: hand an empty slot to another master behind the client's back.
  auto key = redis_cluster::key_in_slot(7);
  auto* from = cl.owner(7);
  REQUIRE(from);
  redis_proc* to = cl.nodes[0].get() == from ? cl.nodes[1].get() : cl.nodes[0].get();
  auto to_id = to->cli("CLUSTER MYID");
  for (auto& n : cl.nodes)
    n->cli("CLUSTER SETSLOT 7 NODE " + to_id);
  std::string v = "moved-value";
  CHECK(c.set({key}, {v})[0]);
  CHECK(c.stats().moved >= 1);
  CHECK(to->cli("GET " + key) == v);

  // ASK: slot 7 migrating from `to` to `from`; a new key goes to the importer.
  auto from_id = from->cli("CLUSTER MYID");
  from->cli("CLUSTER SETSLOT 7 IMPORTING " + to_id);
  to->cli("CLUSTER SETSLOT 7 MIGRATING " + from_id);
  std::string k2 = key;
  for (int i = 0;; ++i) { // another key of slot 7, not on `to`
    k2 = "x" + std::to_string(i);
    if (redis_key_slot(k2) == 7)
      break;
  }
  std::string v2 = "asked-value";
  CHECK(c.set({k2}, {v2})[0]);
  CHECK(c.stats().asked >= 1);
  CHECK(c.get({k2})[0] == v2);
  from->cli("CLUSTER SETSLOT 7 STABLE");
  to->cli("CLUSTER SETSLOT 7 STABLE");

  // A master dies: its keys are misses, the others still answer.
  auto* victim = cl.nodes[2].get();
  std::vector<bool> on_victim;
  for (auto& k : keys)
    on_victim.push_back(victim->cli("EXISTS " + k) == "1");
  victim->kill();
  auto after = c.get(keys);
  size_t hits = 0, lost = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (on_victim[i]) {
      CHECK_FALSE(after[i]);
      ++lost;
    } else {
      CHECK(after[i] == values[i]);
      ++hits;
    }
  }
  CHECK(lost > 0);
  CHECK(hits > 0);
}
