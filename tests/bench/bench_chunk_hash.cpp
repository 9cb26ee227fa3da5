// Chunk hashing cost (BENCHMARKS.md, "LMCache-format L2"): kvsidecar's own
// prefix hash (XXH3-64 chain, cache/chunk_hash.hpp) against LMCache's
// (BLAKE3 chain over big-endian uint32 tokens, cache/lmcache_token_hash.hpp),
// which l2.format = "lmcache" computes on top of it for every LOOKUP and
// STORE. Items = chunks; time per chunk = time / items.
// And MD5 for POST /cache/checksums' block-id form (BENCHMARKS.md, "MD5 in
// SIMD lanes"): 8 chunks of 32 MiB (one `lmcache bench server` request)
// through md5_stream one after another, and through md5_hex_lanes on each
// path this CPU runs; tests/bench/bench_md5_hashlib.py times hashlib.md5
// (LMCache's) on the same sizes.
//   bench_chunk_hash --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cache/blake3.hpp"
#include "cache/chunk_hash.hpp"
#include "cache/lmcache_token_hash.hpp"
#include "cache/md5.hpp"
#include "cache/md5_lanes.hpp"

using namespace kvs;

namespace {

constexpr size_t k_chunks = 32; // a 8192-token prompt at 256-token chunks

template <class T>
std::vector<T> prompt_tokens(size_t n) {
  std::vector<T> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<T>((i * 7919) % 150000);
  return t;
}

void BM_KvsidecarChunkHash(benchmark::State& s) {
  const auto cs = static_cast<size_t>(s.range(0));
  auto toks = prompt_tokens<int64_t>(k_chunks * cs);
  const uint64_t seed = identity_seed("org/model", 1, "");
  std::vector<uint64_t> out;
  for (auto _ : s) {
    out.clear();
    append_chunk_hashes(toks.data(), toks.size(), cs, seed, out);
    benchmark::DoNotOptimize(out.data());
  }
  s.SetItemsProcessed(static_cast<int64_t>(s.iterations() * k_chunks));
}

void BM_LmcacheChunkHash(benchmark::State& s) {
  const auto cs = static_cast<size_t>(s.range(0));
  auto toks = prompt_tokens<uint32_t>(k_chunks * cs); // as the keys carry them
  std::vector<std::string> out;
  for (auto _ : s) {
    out.clear();
    append_lmcache_chunk_hashes(toks.data(), toks.size(), cs, out);
    benchmark::DoNotOptimize(out.data());
  }
  s.SetItemsProcessed(static_cast<int64_t>(s.iterations() * k_chunks));
}

void BM_Blake3Bytes(benchmark::State& s) {
  std::vector<uint8_t> in(static_cast<size_t>(s.range(0)), 0x5a);
  for (auto _ : s) {
    auto d = blake3(in.data(), in.size());
    benchmark::DoNotOptimize(d.data());
  }
  s.SetBytesProcessed(static_cast<int64_t>(s.iterations() * in.size()));
}

constexpr size_t k_md5_chunks = 8;
constexpr size_t k_md5_chunk_bytes = 32ull << 20;

const std::vector<uint8_t>& md5_input() {
  static const std::vector<uint8_t> in = [] {
    std::vector<uint8_t> v(k_md5_chunks * k_md5_chunk_bytes);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (auto& b : v) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      b = static_cast<uint8_t>(x);
    }
    return v;
  }();
  return in;
}

void BM_Md5StreamChunks(benchmark::State& s) {
  auto& in = md5_input();
  for (auto _ : s)
    for (size_t c = 0; c < k_md5_chunks; ++c) {
      auto d = md5_hex(in.data() + c * k_md5_chunk_bytes, k_md5_chunk_bytes);
      benchmark::DoNotOptimize(d.data());
    }
  s.SetBytesProcessed(static_cast<int64_t>(s.iterations() * in.size()));
}

/// Args: the path, and how many chunks the 256 MiB is cut into (8 of
/// 32 MiB as the benchmark's requests; 16 of 16 MiB fill AVX-512's lanes).
void BM_Md5LanesChunks(benchmark::State& s) {
  const auto path = static_cast<md5_path>(s.range(0));
  const auto chunks = static_cast<size_t>(s.range(1));
  if (!md5_path_available(path)) {
    s.SkipWithError("this CPU cannot run this path");
    return;
  }
  s.SetLabel(md5_path_name(path));
  auto& in = md5_input();
  const size_t each = in.size() / chunks;
  for (auto _ : s) {
    std::vector<md5_source> sources;
    for (size_t c = 0; c < chunks; ++c)
      sources.push_back(md5_pieces({{in.data() + c * each, each}}));
    auto d = md5_hex_lanes(std::move(sources), path);
    benchmark::DoNotOptimize(d.data());
  }
  s.SetBytesProcessed(static_cast<int64_t>(s.iterations() * in.size()));
}

void md5_lanes_args(benchmark::internal::Benchmark* b) {
  for (int chunks : {8, 16})
    for (md5_path p : {md5_path::best, md5_path::scalar, md5_path::avx2, md5_path::avx2_gather,
                       md5_path::avx512vl, md5_path::avx512, md5_path::avx512_gather})
      b->Args({static_cast<int>(p), chunks});
}

} // namespace

BENCHMARK(BM_Md5StreamChunks)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Md5LanesChunks)->Unit(benchmark::kMillisecond)->Apply(md5_lanes_args);
BENCHMARK(BM_KvsidecarChunkHash)->Arg(256)->Arg(64);
BENCHMARK(BM_LmcacheChunkHash)->Arg(256)->Arg(64);
BENCHMARK(BM_Blake3Bytes)->Arg(1056)->Arg(65536);
BENCHMARK_MAIN();
