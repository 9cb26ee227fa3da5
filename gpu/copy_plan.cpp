#include "gpu/copy_plan.hpp"

#include <string>

namespace kvs {

namespace {
error bad(std::string detail) { return make_error("bad_request", std::move(detail)); }
constexpr uint64_t max_chunks = uint64_t{1} << 20;
constexpr uint64_t max_chunk_index = uint64_t{1} << 32;
} // namespace

expected<copy_plan> plan_copy(const copy_request& req, const kv_layout& layout) {
  const uint64_t bpc = layout.blocks_per_chunk(req.chunk_tokens);
  if (bpc == 0 || req.chunk_tokens > (uint64_t{1} << 24))
    return bad("chunk size " + std::to_string(req.chunk_tokens) +
               " tokens is not a positive multiple of the engine page size " +
               std::to_string(layout.block_size));
  if (req.slot_bytes < layout.chunk_bytes(req.chunk_tokens))
    return bad("L1 slots of " + std::to_string(req.slot_bytes) + " bytes; a chunk needs " +
               std::to_string(layout.chunk_bytes(req.chunk_tokens)));
  if (req.block_ids.size() != layout.num_groups)
    return bad(std::to_string(req.block_ids.size()) + " block-id lists for " +
               std::to_string(layout.num_groups) + " engine group(s)");
  if (req.direction == copy_direction::to_l1 && req.skip_prefix_n_blocks != 0)
    return bad("skip_prefix_n_blocks is only meaningful for a retrieve");
  if (req.chunks.size() > max_chunks)
    return bad(std::to_string(req.chunks.size()) + " chunks in one request");

  copy_plan p;
  p.geo.num_layers = layout.num_layers;
  p.geo.block_size = layout.block_size;
  p.geo.blocks_per_chunk = static_cast<uint32_t>(bpc);
  p.geo.num_groups = layout.num_groups;
  p.geo.token_bytes = layout.token_bytes;
  p.geo.page_bytes = layout.page_bytes;
  p.geo.block_stride_bytes = layout.block_stride_bytes;
  if (!layout.page_contiguous) {
    p.geo.strided_heads = layout.num_heads;
    p.geo.head_bytes = layout.head_bytes;
    p.geo.head_stride_bytes = layout.head_stride_bytes;
    p.geo.token_stride_bytes = layout.token_stride_bytes;
  }
  p.to_l1 = req.direction == copy_direction::to_l1;
  p.skip_blocks = p.to_l1 ? 0 : req.skip_prefix_n_blocks;

  const size_t n = req.chunks.size();
  p.slots.reserve(n);
  p.chunk_index.reserve(n);
  p.blocks.assign(n * layout.num_groups * bpc, -1);
  for (size_t c = 0; c < n; ++c) {
    const l1_chunk& ch = req.chunks[c];
    if (ch.slot == nullptr) return bad("chunk " + std::to_string(c) + " has no L1 slot");
    if (ch.chunk_index >= max_chunk_index)
      return bad("chunk " + std::to_string(c) + " index " + std::to_string(ch.chunk_index) +
                 " out of range");
    const uint64_t first = ch.chunk_index * bpc;
    for (uint32_t g = 0; g < layout.num_groups; ++g) {
      const std::vector<int64_t>& ids = req.block_ids[g];
      if (ids.size() < first + bpc)
        return bad("too few block ids: chunk " + std::to_string(ch.chunk_index) + " needs " +
                   std::to_string(first + bpc) + " in group " + std::to_string(g) + ", got " +
                   std::to_string(ids.size()));
      for (uint32_t page = 0; page < bpc; ++page) {
        if (page_skipped(p.geo, p.skip_blocks, ch.chunk_index, page)) continue;
        const int64_t id = ids[first + page];
        if (id < 0 || static_cast<uint64_t>(id) >= layout.num_blocks)
          return bad("block id " + std::to_string(id) + " at position " +
                     std::to_string(first + page) + " of group " + std::to_string(g) +
                     " is outside the pool's " + std::to_string(layout.num_blocks) + " blocks");
        p.blocks[block_copy::packed_block_index(p.geo, static_cast<uint32_t>(c), g, page)] = id;
      }
    }
    p.slots.push_back(ch.slot);
    p.chunk_index.push_back(ch.chunk_index);
  }
  p.total_units = n * block_copy::units_per_chunk(p.geo);
  return p;
}

} // namespace kvs
