// L2 tier throughput against plain baselines, side by side (BENCHMARKS.md):
//   disk  <dir> <objects> <MiB>      lru_folder put/get vs plain write/read of
//                                    the same sizes in files (no rename, no
//                                    header), then put with fsync vs plain
//                                    write + fdatasync
//   redis <port> <requests> <bytes> <pipeline> <keys> [set|get|get-fresh] [connections]
//                                    redis_client alone: set or get batches
//                                    of <pipeline> keys per connection over
//                                    redis-benchmark -r <keys>'s key space
//                                    (compare with redis-benchmark -c
//                                    <connections> -P <pipeline> -r <keys>;
//                                    tests/bench/l2_redis_side_by_side.py)
// Prints one line per measurement: name, GB/s or ops/s.
#include "l2/lru_folder.hpp"
#include "l2/redis_client.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace kvs;
using clk = std::chrono::steady_clock;

namespace {

double secs(clk::time_point t0) {
  return std::chrono::duration<double>(clk::now() - t0).count();
}

void rm_rf(const std::string& d) {
  std::string cmd = "rm -rf '" + d + "'";
  if (std::system(cmd.c_str()) != 0)
    std::fprintf(stderr, "could not remove %s\n", d.c_str());
}

void plain_write(const std::string& dir, size_t n, const std::string& buf, bool sync) {
  for (size_t i = 0; i < n; ++i) {
    auto name = dir + "/plain" + std::to_string(i);
    int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    size_t off = 0;
    while (off < buf.size()) {
      auto w = ::write(fd, buf.data() + off, buf.size() - off);
      if (w <= 0)
        std::abort();
      off += static_cast<size_t>(w);
    }
    if (sync)
      ::fdatasync(fd);
    ::close(fd);
  }
}

void plain_read(const std::string& dir, size_t n, std::string& buf) {
  for (size_t i = 0; i < n; ++i) {
    auto name = dir + "/plain" + std::to_string(i);
    int fd = ::open(name.c_str(), O_RDONLY);
    size_t off = 0;
    while (off < buf.size()) {
      auto r = ::read(fd, buf.data() + off, buf.size() - off);
      if (r <= 0)
        std::abort();
      off += static_cast<size_t>(r);
    }
    ::close(fd);
  }
}

int disk(const std::string& dir, size_t n, size_t mib) {
  std::string buf(mib << 20, '\0');
  for (size_t i = 0; i < buf.size(); ++i)
    buf[i] = static_cast<char>(i * 31);
  double gb = static_cast<double>(n * buf.size()) / 1e9;
  auto plain_dir = dir + "/plain", tier_dir = dir + "/tier";
  rm_rf(dir);
  std::string cmd = "mkdir -p '" + plain_dir + "'";
  if (std::system(cmd.c_str()) != 0)
    return 1;
  lru_folder_options o;
  o.path = tier_dir;
  o.size = uint64_t{1} << 40;
  auto opened = lru_folder::open(o, make_kvsidecar_naming());
  if (!opened) {
    std::fprintf(stderr, "%s\n", opened.error_value().detail.c_str());
    return 1;
  }
  auto tier = std::move(*opened);
  auto id = [](size_t i) {
    l2_key k;
    k.hash = i + 1;
    k.fingerprint = 7;
    k.layout = 1;
    return k;
  };
  auto naming = make_kvsidecar_naming();
  auto erase_all = [&](lru_folder& t) {
    std::vector<std::string> names;
    for (size_t i = 0; i < n; ++i)
      names.push_back(*naming->file_name(id(i)));
    t.erase(names);
  };

  // Each write phase starts with no dirty pages (sync) and ends with its own
  // sync, so neither pays for the other's write-back; best of two rounds,
  // alternating.
  double pw = 0, tw = 0;
  for (int round = 0; round < 2; ++round) {
    ::sync();
    auto t0 = clk::now();
    plain_write(plain_dir, n, buf, false);
    ::sync();
    pw = std::max(pw, gb / secs(t0));
    if (round == 0)
      erase_all(*tier);
    ::sync();
    t0 = clk::now();
    for (size_t i = 0; i < n; ++i)
      if (tier->put_one(id(i), buf) != lru_folder::put_result::stored)
        std::abort();
    ::sync();
    tw = std::max(tw, gb / secs(t0));
    if (round == 0)
      erase_all(*tier);
  }
  std::string in(buf.size(), '\0');
  std::string out;
  double pr = 0, tr = 0;
  for (int round = 0; round < 3; ++round) { // from the page cache; best of three, alternating
    auto t0 = clk::now();
    plain_read(plain_dir, n, in);
    pr = std::max(pr, gb / secs(t0));
    t0 = clk::now();
    for (size_t i = 0; i < n; ++i)
      if (!tier->get_one(id(i), &out))
        std::abort();
    tr = std::max(tr, gb / secs(t0));
  }
  if (out != buf)
    std::abort();
  std::printf("disk write  plain %.2f GB/s  lru_folder %.2f GB/s  ratio %.2f\n", pw, tw, tw / pw);
  std::printf("disk read   plain %.2f GB/s  lru_folder %.2f GB/s  ratio %.2f\n", pr, tr, tr / pr);

  // fsync cost: a quarter of the objects, durable.
  size_t ns = std::max<size_t>(1, n / 4);
  double gbs = static_cast<double>(ns * buf.size()) / 1e9;
  rm_rf(dir);
  cmd = "mkdir -p '" + plain_dir + "'";
  if (std::system(cmd.c_str()) != 0)
    return 1;
  o.fsync = true;
  auto synced_tier = lru_folder::open(o, make_kvsidecar_naming());
  if (!synced_tier) {
    std::fprintf(stderr, "%s\n", synced_tier.error_value().detail.c_str());
    return 1;
  }
  auto synced = std::move(*synced_tier);
  ::sync();
  auto t0 = clk::now();
  plain_write(plain_dir, ns, buf, true);
  double psw = gbs / secs(t0);
  t0 = clk::now();
  for (size_t i = 0; i < ns; ++i)
    synced->put_one(id(i), buf);
  double tsw = gbs / secs(t0);
  std::printf("disk write+fdatasync  plain %.2f GB/s  lru_folder(fsync) %.2f GB/s  ratio %.2f"
              "  (fsync off vs on: %.1fx)\n", psw, tsw, tsw / psw, tw / tsw);
  rm_rf(dir);
  return 0;
}

double cpu_secs() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto t = [](const timeval& tv) { return static_cast<double>(tv.tv_sec) + tv.tv_usec / 1e6; };
  return t(u.ru_utime) + t(u.ru_stime);
}

/// The client alone (no actor): `requests` SETs or GETs in batches of
/// pipeline x connections keys, key i of the run being
/// "key:%012d" % (i mod keys) -- redis-benchmark -r's key format, so both
/// sides use the same key space on the same server. Modes: set; get (values
/// read into the previous batch's strings, get_into); get-fresh (get(): a
/// new string per value). One line: req/s, GB/s and client CPU per request.
int redis(int port, size_t requests, size_t bytes, size_t pipeline, size_t keyspace,
          const std::string& mode, int connections) {
  redis_options o;
  o.endpoints = {"127.0.0.1:" + std::to_string(port)};
  o.connections = connections;
  redis_client c(o);
  std::string value(bytes, 'v');
  size_t batch = pipeline * static_cast<size_t>(connections);
  std::vector<std::string> keys;
  std::vector<std::string_view> values(batch, value);
  std::vector<std::string> got;
  size_t batches = requests / batch;
  size_t next = 0;
  auto batch_keys = [&] {
    keys.clear();
    char k[32];
    for (size_t i = 0; i < batch; ++i) {
      std::snprintf(k, sizeof k, "key:%012zu", next++ % keyspace);
      keys.emplace_back(k);
    }
  };
  double cpu0 = cpu_secs();
  auto t0 = clk::now();
  for (size_t b = 0; b < batches; ++b) {
    batch_keys();
    if (mode == "set") {
      for (bool ok : c.set(keys, values))
        if (!ok)
          std::abort();
    } else if (mode == "get") {
      for (bool hit : c.get_into(keys, got))
        if (!hit)
          std::abort();
      for (auto& v : got)
        if (v.size() != bytes)
          std::abort();
    } else {
      for (auto& v : c.get(keys))
        if (!v || v->size() != bytes)
          std::abort();
    }
  }
  double wall = secs(t0);
  double n = static_cast<double>(batches * batch);
  std::printf("redis_client %s %.0f req/s (%.2f GB/s) cpu %.1f us/req  value %zu B, pipeline %zu, "
              "%d connection(s), %zu keys: %s\n",
              mode == "set" ? "SET" : "GET", n / wall, n * static_cast<double>(bytes) / wall / 1e9,
              (cpu_secs() - cpu0) / n * 1e6, bytes, pipeline, connections, keyspace,
              mode == "set" ? "values sent from the caller's memory"
                            : mode == "get" ? "values read into reused strings (get_into)"
                                            : "a new string per value (get)");
  if (c.stats().errors || c.stats().unreachable) {
    std::fprintf(stderr, "redis errors: %s\n", c.last_error().c_str());
    return 1;
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "disk") == 0)
    return disk(argv[2], std::strtoul(argv[3], nullptr, 10), std::strtoul(argv[4], nullptr, 10));
  if (argc >= 7 && argc <= 9 && std::strcmp(argv[1], "redis") == 0) {
    std::string mode = argc >= 8 ? argv[7] : "set";
    if (mode != "set" && mode != "get" && mode != "get-fresh") {
      std::fprintf(stderr, "mode must be set, get or get-fresh, not %s\n", mode.c_str());
      return 2;
    }
    size_t keyspace = std::strtoul(argv[6], nullptr, 10);
    int conns = argc == 9 ? std::atoi(argv[8]) : 1;
    if (keyspace == 0 || conns < 1)
      return 2;
    return redis(std::atoi(argv[2]), std::strtoul(argv[3], nullptr, 10),
                 std::strtoul(argv[4], nullptr, 10), std::strtoul(argv[5], nullptr, 10),
                 keyspace, mode, conns);
  }
  std::fprintf(stderr, "usage: bench_l2 disk <dir> <objects> <MiB> | redis <port> <requests> "
                       "<bytes> <pipeline> <keys> [set|get|get-fresh] [connections]\n");
  return 2;
}
