// Chunk hashing cost (BENCHMARKS.md, "LMCache-format L2"): kvsidecar's own
// prefix hash (XXH3-64 chain, cache/chunk_hash.hpp) against LMCache's
// (BLAKE3 chain over big-endian uint32 tokens, cache/lmcache_token_hash.hpp),
// which l2.format = "lmcache" computes on top of it for every LOOKUP and
// STORE. Items = chunks; time per chunk = time / items.
//   bench_chunk_hash --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cache/blake3.hpp"
#include "cache/chunk_hash.hpp"
#include "cache/lmcache_token_hash.hpp"

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

} // namespace

BENCHMARK(BM_KvsidecarChunkHash)->Arg(256)->Arg(64);
BENCHMARK(BM_LmcacheChunkHash)->Arg(256)->Arg(64);
BENCHMARK(BM_Blake3Bytes)->Arg(1056)->Arg(65536);
BENCHMARK_MAIN();
