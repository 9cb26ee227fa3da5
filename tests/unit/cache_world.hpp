// The cache tests' world: an L1 pool of 64-byte slots, its chunk index and
// a lock ledger over it, and chunks committed on ranks.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <vector>

#include "cache/chunk_index.hpp"
#include "cache/lock_ledger.hpp"
#include "cache/slot_pool.hpp"

namespace kvs_test {

using namespace kvs;

const cache_clock::time_point t0{std::chrono::hours(1000)};

struct world {
  std::unique_ptr<slot_pool> pool;
  std::unique_ptr<chunk_index> index;
  std::unique_ptr<lock_ledger> ledger;

  world(size_t slots, index_options io = {}, ledger_options lo = {}) {
    pool_options po;
    po.capacity_bytes = slots * 64;
    po.hugepages = false;
    po.slot_align = 64;
    pool = slot_pool::create(po).value();
    REQUIRE(pool);
    index = std::make_unique<chunk_index>(*pool, io);
    ledger = std::make_unique<lock_ledger>(*index, lo);
  }
  void put(uint64_t h, int rank) {
    auto r = index->reserve(chunk_key{h, rank}, 64, t0);
    REQUIRE(r.status == reserve_status::reserved);
    REQUIRE(index->commit(chunk_key{h, rank}));
  }
  void put_all(const std::vector<uint64_t>& hs, int ws) {
    for (uint64_t h : hs)
      for (int r = 0; r < ws; ++r) put(h, r);
  }
  uint32_t readers(uint64_t h, int rank) const {
    auto e = index->find(chunk_key{h, rank});
    return e ? e->readers : 0;
  }
};


} // namespace kvs_test
