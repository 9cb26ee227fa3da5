// L1 index micro-benchmarks. Uses only kvs_cache (cache/*.hpp), although the
// bench CMake rule links kvs_actors too.
//   bench_cache_index --benchmark_filter=Lookup
#include <benchmark/benchmark.h>

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cache/chunk_hash.hpp"
#include "cache/chunk_index.hpp"
#include "cache/lock_ledger.hpp"

using namespace kvs;

namespace {

const cache_clock::time_point t0{std::chrono::hours(1)};

// An index of n_chunks x world_size committed entries in 64-byte slots (the
// pool is mapped but never touched, so only the index costs memory).
struct filled {
  std::unique_ptr<slot_pool> pool;
  std::unique_ptr<chunk_index> index;
  std::vector<uint64_t> hashes;

  filled(size_t n_chunks, int ws, size_t spare_slots = 0) {
    pool_options po;
    po.capacity_bytes = (n_chunks * static_cast<size_t>(ws) + spare_slots) * 64;
    po.hugepages = false;
    po.slot_align = 64;
    pool = slot_pool::create(po).value();
    index_options o;
    o.evict_high = 1.0;
    o.evict_low = 1.0;
    index = std::make_unique<chunk_index>(*pool, o);
    hashes.resize(n_chunks);
    for (size_t i = 0; i < n_chunks; ++i) hashes[i] = (i + 1) * 0xD6E8FEB86659FD93ull;
    for (size_t i = 0; i < n_chunks; ++i)
      for (int r = 0; r < ws; ++r) {
        chunk_key k{hashes[i], r};
        index->reserve(k, 64, t0);
        index->commit(k);
      }
  }
};

// 32-chunk prefix (8192 tokens at chunk_size 256), all hits, over 1M entries.
void BM_LookupPrefix32(benchmark::State& st) {
  const int ws = static_cast<int>(st.range(0));
  static std::unique_ptr<filled> f;
  static int f_ws = 0;
  if (!f || f_ws != ws) {
    f.reset();
    f = std::make_unique<filled>(1000000 / static_cast<size_t>(ws), ws);
    f_ws = ws;
  }
  const size_t n = f->hashes.size() - 32;
  size_t off = 0, hits = 0;
  for (auto _ : st) {
    off = (off + 7919) % n;
    hits += f->index->lookup_prefix(f->hashes.data() + off, 32, ws);
  }
  benchmark::DoNotOptimize(hits);
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()) * 32 * ws);
  st.counters["entries"] = static_cast<double>(f->index->size());
}
BENCHMARK(BM_LookupPrefix32)->Arg(1)->Arg(4)->Arg(8);

// A cold request: the first chunk misses.
void BM_LookupMiss(benchmark::State& st) {
  static filled f(1000000, 1);
  std::vector<uint64_t> miss(32);
  std::iota(miss.begin(), miss.end(), 1);
  for (auto _ : st) {
    miss[0] += 2;
    benchmark::DoNotOptimize(f.index->lookup_prefix(miss.data(), 32, 1));
  }
}
BENCHMARK(BM_LookupMiss);

// Steady-state store at full pool: every reserve evicts one LRU chunk.
void BM_ReserveCommitEvicting(benchmark::State& st) {
  filled f(100000, 1);
  uint64_t h = 1ull << 63;
  for (auto _ : st) {
    chunk_key k{++h, 0};
    auto r = f.index->reserve(k, 64, t0);
    f.index->commit(k);
    benchmark::DoNotOptimize(r.slot);
  }
}
BENCHMARK(BM_ReserveCommitEvicting);

// LOOKUP-and-lock of a 32-chunk prefix on 4 ranks, then END_SESSION.
void BM_LedgerLookupEnd(benchmark::State& st) {
  static filled f(250000, 4);
  lock_ledger ledger(*f.index);
  size_t off = 0;
  const size_t n = f.hashes.size() - 32;
  for (auto _ : st) {
    off = (off + 7919) % n;
    ledger.lookup("req", f.hashes.data() + off, 32, 4, 1, t0);
    ledger.end_session("req");
  }
}
BENCHMARK(BM_LedgerLookupEnd);

// Hashing an 8192-token prompt into 32 chunk hashes.
void BM_ChunkHashes8k(benchmark::State& st) {
  std::vector<int64_t> tokens(8192);
  std::iota(tokens.begin(), tokens.end(), 0);
  const uint64_t seed = identity_seed("meta-llama/Llama-3.1-8B", 4, "");
  for (auto _ : st)
    benchmark::DoNotOptimize(chunk_hashes(tokens.data(), tokens.size(), 256, seed));
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * 8192 * 8);
}
BENCHMARK(BM_ChunkHashes8k);

} // namespace

BENCHMARK_MAIN();
