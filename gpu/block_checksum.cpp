#include "gpu/block_checksum.hpp"

#include <algorithm>

namespace kvs {

namespace {

/// Appends a run, merged into the previous one when it continues it.
void add_run(std::vector<plane_read>& out, uint32_t plane, uint64_t offset, uint64_t bytes) {
  if (!out.empty()) {
    plane_read& last = out.back();
    if (last.plane == plane && last.offset + last.bytes == offset) {
      last.bytes += bytes;
      return;
    }
  }
  out.push_back(plane_read{plane, offset, bytes});
}

/// One engine page in the tensor's element order: whole when token-major
/// contiguous NHD; else head_dim runs (merged where they touch), heads
/// outside tokens for HND ([NH, BS, HD]), tokens outside heads for NHD with
/// padded strides ([BS, NH, HD]).
void add_page(std::vector<plane_read>& out, const kv_layout& l, uint32_t plane, int64_t block) {
  const uint64_t base = static_cast<uint64_t>(block) * l.block_stride_bytes;
  if (l.page_contiguous && !l.heads_outer) {
    add_run(out, plane, base, l.page_bytes);
    return;
  }
  const uint32_t outer = l.heads_outer ? l.num_heads : l.block_size;
  const uint32_t inner = l.heads_outer ? l.block_size : l.num_heads;
  const uint64_t outer_stride = l.heads_outer ? l.head_stride_bytes : l.token_stride_bytes;
  const uint64_t inner_stride = l.heads_outer ? l.token_stride_bytes : l.head_stride_bytes;
  for (uint32_t o = 0; o < outer; ++o)
    for (uint32_t i = 0; i < inner; ++i)
      add_run(out, plane, base + o * outer_stride + i * inner_stride, l.head_bytes);
}

} // namespace

std::optional<std::string> checksum_unsupported(const kv_layout& layout) {
  // LMCache's _BLOCK_AXIS_BY_FORMAT lists the formats with a block axis;
  // these two fuse or reorder it and are declined with its message.
  switch (layout.kind) {
  case kv_layout_kind::vllm_flash_attn:
  case kv_layout_kind::vllm_flashinfer:
    return std::nullopt;
  case kv_layout_kind::vllm_cpu:
    return "checksum not supported for GPU KV format NL_X_NB_NH_BS_CS";
  case kv_layout_kind::sglang_mha:
    return "checksum not supported for GPU KV format TWO_X_NL_X_NBBS_NH_HS";
  }
  return "checksum not supported for this GPU KV format";
}

uint64_t checksum_chunk_bytes(const kv_layout& layout, uint64_t blocks) {
  return blocks * 2 * layout.num_layers * layout.page_bytes;
}

std::vector<plane_read> checksum_reads(const kv_layout& l, const int64_t* ids, uint64_t count,
                                       std::vector<uint64_t>* layer_end) {
  std::vector<plane_read> out;
  uint64_t end = 0;
  if (layer_end)
    layer_end->clear();
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
    const uint32_t k = layer, v = l.num_layers + layer; // planes: [kv * num_layers + layer]
    if (l.kind == kv_layout_kind::vllm_flashinfer) {
      for (uint64_t b = 0; b < count; ++b) {
        add_page(out, l, k, ids[b]);
        add_page(out, l, v, ids[b]);
      }
    } else {
      for (uint32_t plane : {k, v})
        for (uint64_t b = 0; b < count; ++b)
          add_page(out, l, plane, ids[b]);
    }
    end += 2 * count * l.page_bytes;
    if (layer_end)
      layer_end->push_back(end);
  }
  return out;
}

block_checksum_chunk read_checksum_chunk(transfer_backend& backend, opened_pools& pools,
                                         const block_checksum_query& q,
                                         std::vector<uint8_t> buffer) {
  block_checksum_chunk r;
  auto fail = [&r](int status, std::string why) {
    r.status = status;
    r.error = std::move(why);
    return std::move(r);
  };
  const kv_layout& l = pools.layout();
  // LMCache's order: block_ids, chunk_size, then the format.
  if (q.block_ids.empty())
    return fail(400, "block_ids is required");
  if (q.chunk_blocks <= 0)
    return fail(400, "chunk_size must be positive");
  if (auto why = checksum_unsupported(l))
    return fail(501, *why);
  for (size_t i = 0; i < q.block_ids.size(); ++i)
    if (q.block_ids[i] < 0 || static_cast<uint64_t>(q.block_ids[i]) >= l.num_blocks)
      return fail(400, "block_ids[" + std::to_string(i) + "] = " +
                         std::to_string(q.block_ids[i]) + " is not a block of instance's " +
                         std::to_string(l.num_blocks) + " (0.." +
                         std::to_string(l.num_blocks - 1) + ")");
  const uint64_t n = q.block_ids.size();
  const uint64_t per = static_cast<uint64_t>(q.chunk_blocks);
  r.num_chunks = (n + per - 1) / per;
  const uint64_t total = checksum_chunk_bytes(l, n);
  if (total > q.max_bytes)
    return fail(413, "those blocks hold " + std::to_string(total >> 20) +
                       " MiB; one call hashes at most " + std::to_string(q.max_bytes >> 20) +
                       " MiB: ask for fewer block_ids");
  if (q.chunk >= r.num_chunks)
    return fail(400, "chunk " + std::to_string(q.chunk) + " of " +
                       std::to_string(r.num_chunks));
  const uint64_t first = q.chunk * per;
  const uint64_t count = std::min(per, n - first);
  auto runs = checksum_reads(l, q.block_ids.data() + first, count, &r.layer_end);
  r.bytes = std::move(buffer); // read_planes overwrites every byte kept
  r.bytes.resize(checksum_chunk_bytes(l, count));
  if (auto st = backend.read_planes(pools, runs, r.bytes.data()); !st)
    return fail(500, "reading the instance's KV blocks failed: " + st.error_value().kind + ": " +
                       st.error_value().detail);
  r.dtype = l.dtype;
  return r;
}

} // namespace kvs
