// bench_cache_echo: the ceilings the KV cache server benchmark compares
// kvsidecar against (driven by tests/bench/bench_cache.py, run by
// tests/bench/run_cache_bench.sh).
//
//   echo    a raw libzmq ROUTER, one thread, no actors: it answers every
//           LMCache MP request with the reply kvsidecar sends for it, frame
//           for frame (identity, uid and op echoed, then the body or none),
//           without decoding, looking anything up or copying anything. The
//           same Python client sends it the same frames as it sends
//           kvsidecar, so the difference between the two round trips is the
//           server's own cost.
//              bench_cache_echo echo --endpoint tcp://127.0.0.1:PORT [--hits 8]
//           Runs until SIGTERM/SIGINT.
//
//   memcpy  the host backend's copies without the server: a store gathers
//           every K/V plane's pages of a chunk into one contiguous L1 chunk
//           ([2, L, chunk_tokens, token_bytes], LMCache KV_2LTD), a retrieve
//           scatters them back, one memcpy per page, exactly the pieces
//           gpu/host_backend.cpp copies. The engine planes are shared memory
//           (as the engine's pools are), the chunk buffer is anonymous
//           pre-faulted memory (as L1 is). Also one single memcpy of the same
//           byte count, the machine's plain copy bandwidth.
//              bench_cache_echo memcpy [--layers 32] [--page-bytes 32768]
//                  [--pages-per-chunk 16] [--chunks 8] [--reps 7]
//           Prints `RESULT gather_gbps=.. scatter_gbps=.. single_gbps=..
//           bytes=..` (medians; GB = 1e9 bytes).
//
//   decode  the CPU cost, in one thread and without sockets, of what the
//           server does with one request's bytes before any actor hop:
//           decode_mp_request of the frames in FILE (bench_cache.py writes
//           them: u32 little-endian length + bytes per frame, uid first), and
//           for a LOOKUP also the chunk hashes of its tokens (the widening
//           copy session.cpp key_hashes makes, then chunk_hashes).
//              bench_cache_echo decode FILE [--iters 20000]
//           Prints `RESULT decode_ns=.. hash_ns=.. tokens=..` (medians of 5).
#include "cache/chunk_hash.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"

#include <zmq.hpp>

#include <fstream>
#include <iterator>

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

volatile std::sig_atomic_t g_stop = 0;
volatile size_t g_sink = 0;

void on_signal(int) { g_stop = 1; }

// The body kvsidecar's engine bridge / session actors send per op (legacy
// op ids as one-byte msgpack fixints; see docs/lmcache-mp-compat.md).
// *has_body false: no body frame (the result is None).
std::string reply_body(const zmq::message_t& op, int hits, bool* has_body) {
  *has_body = true;
  if (op.size() != 1) {  // a str op (by name) or something odd: answer None
    *has_body = false;
    return {};
  }
  const auto id = static_cast<unsigned char>(*static_cast<const char*>(op.data()));
  switch (id) {
    case 9:   // query_prefetch_status
    case 10:  // wait_prefetch_status: matched chunks, a positive fixint
    case 11:
      return std::string(1, static_cast<char>(hits & 0x7f));
    case 6:    // store
    case 7: {  // retrieve: (event handle: bin 64, ok: true)
      std::string b;
      b += static_cast<char>(0x92);
      b += static_cast<char>(0xc4);
      b += static_cast<char>(0x40);
      b.append(64, '\0');
      b += static_cast<char>(0xc3);
      return b;
    }
    case 21:  // get_chunk_size: 256
      return std::string("\xcd\x01\x00", 3);
    case 22:  // ping: true
      return std::string(1, static_cast<char>(0xc3));
    case 24:  // noop: "OK"
      return std::string("\xa2OK", 3);
    case 32:  // get_experimental: []
      return std::string(1, static_cast<char>(0x90));
    default:  // lookup (ack), free_lookup_locks, end_session, register, ...
      *has_body = false;
      return {};
  }
}

int run_echo(const std::string& endpoint, int hits) {
  zmq::context_t ctx{1};
  zmq::socket_t router{ctx, zmq::socket_type::router};
  router.set(zmq::sockopt::rcvhwm, 0);
  router.set(zmq::sockopt::sndhwm, 0);
  router.set(zmq::sockopt::linger, 0);
  router.bind(endpoint);
  std::fprintf(stderr, "echo: bound %s\n", endpoint.c_str());
  uint64_t served = 0;
  std::vector<zmq::message_t> frames;
  // Same socket pattern as the engine bridge: poll, then drain without blocking.
  zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
  while (!g_stop) {
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds{100});
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      throw;
    }
    if (!(item.revents & ZMQ_POLLIN)) continue;
    for (;;) {
      frames.clear();
      zmq::message_t first;
      if (!router.recv(first, zmq::recv_flags::dontwait)) break;
      frames.push_back(std::move(first));
      while (frames.back().more()) {
        zmq::message_t part;
        (void)router.recv(part, zmq::recv_flags::none);
        frames.push_back(std::move(part));
      }
      if (frames.size() < 3) continue;
      bool has_body = false;
      std::string body = reply_body(frames[2], hits, &has_body);
      router.send(frames[0], zmq::send_flags::sndmore);
      router.send(frames[1], zmq::send_flags::sndmore);
      router.send(frames[2], has_body ? zmq::send_flags::sndmore : zmq::send_flags::none);
      if (has_body) router.send(zmq::buffer(body), zmq::send_flags::none);
      ++served;
    }
  }
  std::fprintf(stderr, "echo: stopped after %llu requests\n",
               static_cast<unsigned long long>(served));
  return 0;
}

uint8_t* map_bytes(size_t n, bool shared) {
  const int flags = (shared ? MAP_SHARED : MAP_PRIVATE) | MAP_ANONYMOUS;
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  std::memset(p, 0x5a, n);  // fault every page in before timing
  return static_cast<uint8_t*>(p);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int run_memcpy(int layers, size_t page_bytes, size_t pages_per_chunk, size_t chunks, int reps) {
  const size_t planes = 2 * static_cast<size_t>(layers);  // K and V of every layer
  const size_t pages = chunks * pages_per_chunk;
  const size_t plane_bytes = pages * page_bytes;
  const size_t chunk_bytes = planes * pages_per_chunk * page_bytes;
  const size_t total = chunks * chunk_bytes;
  // Engine side: one object per plane (SGLang MHA pools), shared memory.
  std::vector<uint8_t*> plane(planes);
  for (auto& p : plane) p = map_bytes(plane_bytes, true);
  uint8_t* l1 = map_bytes(total, false);
  uint8_t* flat_src = map_bytes(total, true);

  using clk = std::chrono::steady_clock;
  auto gbps = [&](clk::time_point a, clk::time_point b) {
    return static_cast<double>(total) / std::chrono::duration<double>(b - a).count() / 1e9;
  };
  std::vector<double> gather, scatter, single;
  for (int r = 0; r < reps + 1; ++r) {  // the first round is a warm-up
    // Store: L1 chunk c is [kv][layer][page of the chunk], each page from its plane.
    auto t0 = clk::now();
    for (size_t c = 0; c < chunks; ++c)
      for (size_t pl = 0; pl < planes; ++pl)
        for (size_t pg = 0; pg < pages_per_chunk; ++pg)
          std::memcpy(l1 + c * chunk_bytes + (pl * pages_per_chunk + pg) * page_bytes,
                      plane[pl] + (c * pages_per_chunk + pg) * page_bytes, page_bytes);
    auto t1 = clk::now();
    for (size_t c = 0; c < chunks; ++c)
      for (size_t pl = 0; pl < planes; ++pl)
        for (size_t pg = 0; pg < pages_per_chunk; ++pg)
          std::memcpy(plane[pl] + (c * pages_per_chunk + pg) * page_bytes,
                      l1 + c * chunk_bytes + (pl * pages_per_chunk + pg) * page_bytes, page_bytes);
    auto t2 = clk::now();
    std::memcpy(l1, flat_src, total);
    auto t3 = clk::now();
    if (r == 0) continue;
    gather.push_back(gbps(t0, t1));
    scatter.push_back(gbps(t1, t2));
    single.push_back(gbps(t2, t3));
  }
  volatile uint8_t sink = l1[total - 1] ^ plane[0][0];
  (void)sink;
  std::printf("memcpy: %zu bytes in %zu-byte pages: gather %.2f GB/s, scatter %.2f GB/s, "
              "single memcpy %.2f GB/s (medians of %d)\n",
              total, page_bytes, median(gather), median(scatter), median(single), reps);
  std::printf("RESULT gather_gbps=%.3f scatter_gbps=%.3f single_gbps=%.3f bytes=%zu page_bytes=%zu\n",
              median(gather), median(scatter), median(single), total, page_bytes);
  return 0;
}

int run_decode(const std::string& file, int iters) {
  std::ifstream in(file, std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> frames;
  for (size_t off = 0; off + 4 <= raw.size();) {
    uint32_t n = 0;
    for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(static_cast<unsigned char>(raw[off + i])) << (8 * i);
    off += 4;
    if (off + n > raw.size()) break;
    frames.emplace_back(raw.substr(off, n));
    off += n;
  }
  std::vector<std::string_view> views(frames.begin(), frames.end());
  auto first = kvs::decode_mp_request(views);
  if (!first.has_value()) {
    std::fprintf(stderr, "decode: the frames do not decode\n");
    return 1;
  }
  const auto* lk = std::get_if<kvs::lookup_req>(&first.value().body);
  using clk = std::chrono::steady_clock;
  std::vector<double> dec, hash;
  size_t sink = 0;
  for (int r = 0; r < 5; ++r) {
    auto t0 = clk::now();
    for (int i = 0; i < iters; ++i) {
      auto res = kvs::decode_mp_request(views);
      sink += res.has_value() ? 0 : 1;
    }
    auto t1 = clk::now();
    if (lk) {
      const auto& k = lk->key;
      const uint64_t seed = kvs::identity_seed(k.model_name, k.world_size, k.cache_salt);
      for (int i = 0; i < iters; ++i) {
        std::vector<int64_t> toks(k.token_ids.begin(), k.token_ids.end());
        sink += kvs::chunk_hashes(toks.data(), toks.size(), 256, seed).size();
      }
    }
    auto t2 = clk::now();
    dec.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / iters);
    hash.push_back(std::chrono::duration<double, std::nano>(t2 - t1).count() / iters);
  }
  g_sink = sink;  // keeps the timed loops from being optimized away
  std::printf("decode: %.0f ns per request, chunk hashes %.0f ns (%zu tokens)\n", median(dec),
              median(hash), lk ? lk->key.token_ids.size() : size_t{0});
  std::printf("RESULT decode_ns=%.0f hash_ns=%.0f tokens=%zu\n", median(dec), median(hash),
              lk ? lk->key.token_ids.size() : size_t{0});
  return 0;
}

const char* arg_value(int argc, char** argv, const char* name, const char* dflt) {
  for (int i = 2; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return dflt;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s echo --endpoint EP [--hits N] | memcpy [options] | decode FILE\n",
                 argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  if (mode == "echo") {
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);
    return run_echo(arg_value(argc, argv, "--endpoint", "tcp://127.0.0.1:5599"),
                    std::atoi(arg_value(argc, argv, "--hits", "8")));
  }
  if (mode == "decode" && argc >= 3)
    return run_decode(argv[2], std::atoi(arg_value(argc, argv, "--iters", "20000")));
  if (mode == "memcpy")
    return run_memcpy(std::atoi(arg_value(argc, argv, "--layers", "32")),
                      std::strtoull(arg_value(argc, argv, "--page-bytes", "32768"), nullptr, 10),
                      std::strtoull(arg_value(argc, argv, "--pages-per-chunk", "16"), nullptr, 10),
                      std::strtoull(arg_value(argc, argv, "--chunks", "8"), nullptr, 10),
                      std::atoi(arg_value(argc, argv, "--reps", "7")));
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
