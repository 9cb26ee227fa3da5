// Validation and packing of a copy request, shared by every backend, so
// "an invalid request writes nothing" holds the same way for host and CUDA:
// all block ids, counts and sizes are checked here before any byte moves.
#pragma once

#include "gpu/block_copy.hpp"
#include "core/error.hpp"
#include "gpu/kv_layout.hpp"
#include "gpu/transfer_backend.hpp"

#include <cstdint>
#include <vector>

namespace kvs {

struct copy_plan {
  block_copy::geometry geo;
  bool to_l1 = true;
  uint64_t skip_blocks = 0;            ///< 0 for stores
  std::vector<uint8_t*> slots;         ///< per chunk position
  std::vector<uint64_t> chunk_index;   ///< per chunk position
  /// Block ids packed [chunk position][group][page] (block_copy::packed_block_index);
  /// skipped pages hold -1 and are never dereferenced.
  std::vector<int64_t> blocks;
  uint64_t total_units = 0;
};

/// True when a retrieve leaves this page alone (skip_prefix_n_blocks).
KVS_HD bool page_skipped(const block_copy::geometry& g, uint64_t skip_blocks,
                         uint64_t chunk_index, uint32_t page) {
  return block_copy::block_list_index(g, chunk_index, page) < skip_blocks;
}

expected<copy_plan> plan_copy(const copy_request& req, const kv_layout& layout);

} // namespace kvs
