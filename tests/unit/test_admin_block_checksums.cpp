// POST /cache/checksums in LMCache's block-id form, below the HTTP layer:
// the bytes gpu/block_checksum reads from registered pools (host backend,
// real shared memory) against a reference written here the way LMCache
// computes them -- index_select of the block ids on the tensor's block axis,
// then every element in the tensor's own axis order, layer after layer --
// and the digests admin/chunk_digests makes of them (bfloat16 widened to
// float32 as LMCache's .to(torch.float32) does). LMCache's answers for bad
// calls: 400 (no block_ids, chunk_size <= 0), 501 (formats it declines);
// ours: 400 for a block outside the pools, 413 past the byte cap.
#include <doctest/doctest.h>

#include "admin/chunk_digests.hpp"
#include "cache/md5.hpp"
#include "gpu/block_checksum.hpp"
#include "shm_object.hpp"

#include <array>
#include <cstring>

using namespace kvs;
using test::shm_object;

namespace {

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size() - 1; i > 0; --i) s[i - 1] = s[i] * shape[i];
  return s;
}

/// `layers` 5-D views of one shared-memory object, each at its own element offset.
struct pools_fixture {
  std::vector<int64_t> shape;
  int block_axis;
  shm_object obj;
  std::vector<tensor_desc> tensors;
  std::unique_ptr<transfer_backend> backend = make_host_backend(host_backend_options{false});
  std::unique_ptr<opened_pools> pools;

  pools_fixture(std::vector<int64_t> sh, int axis, int64_t layers, std::optional<vllm_kv_layout> hint,
                std::string dtype = "float16")
      : shape(std::move(sh)), block_axis(axis), obj(static_cast<size_t>(layers * elems() * 2 + 64)) {
    for (size_t i = 0; i < obj.size(); ++i)
      obj.data()[i] = static_cast<uint8_t>((i * 131 + (i >> 7) * 17 + 5) & 0xff);
    for (int64_t l = 0; l < layers; ++l) {
      tensor_desc t;
      t.kind = tensor_desc::memory_kind::host_shm;
      t.shm_name = obj.name();
      t.dtype = dtype;
      t.element_size = 2;
      t.shape = shape;
      t.stride = contiguous_strides(shape);
      t.storage_offset = 32 / 2 + l * elems();
      tensors.push_back(t);
    }
    kv_layout_hints h;
    h.engine_type = engine_type::vllm;
    h.kv_layout = hint;
    auto layout = detect_kv_layout(tensors, h);
    REQUIRE_MESSAGE(layout.has_value(), layout.error_value().detail);
    auto opened = backend->open(tensors, layout.value());
    REQUIRE_MESSAGE(opened.has_value(), opened.error_value().detail);
    pools = std::move(opened.value());
  }
  int64_t elems() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }

  /// LMCache: per layer, kv.index_select(block_axis, ids).contiguous() bytes.
  std::vector<uint8_t> reference(const std::vector<int64_t>& ids, std::vector<size_t>* ends) const {
    std::vector<uint8_t> out;
    for (const tensor_desc& t : tensors) {
      std::array<int64_t, 5> dims{};
      for (int d = 0; d < 5; ++d) dims[d] = d == block_axis ? static_cast<int64_t>(ids.size()) : shape[d];
      std::array<int64_t, 5> i{};
      for (i[0] = 0; i[0] < dims[0]; ++i[0])
        for (i[1] = 0; i[1] < dims[1]; ++i[1])
          for (i[2] = 0; i[2] < dims[2]; ++i[2])
            for (i[3] = 0; i[3] < dims[3]; ++i[3])
              for (i[4] = 0; i[4] < dims[4]; ++i[4]) {
                int64_t el = t.storage_offset;
                for (int d = 0; d < 5; ++d)
                  el += (d == block_axis ? ids[i[d]] : i[d]) * t.stride[d];
                const uint8_t* p = obj.data() + el * 2;
                out.insert(out.end(), p, p + 2);
              }
      if (ends) ends->push_back(out.size());
    }
    return out;
  }

  block_checksum_chunk read(std::vector<int64_t> ids, int64_t per, uint64_t chunk,
                            uint64_t max_bytes = 1 << 30) {
    block_checksum_query q;
    q.block_ids = std::move(ids);
    q.chunk_blocks = per;
    q.chunk = chunk;
    q.max_bytes = max_bytes;
    return read_checksum_chunk(*backend, *pools, q);
  }
};

void check_chunks(pools_fixture& f, const std::vector<int64_t>& ids, int64_t per) {
  const uint64_t chunks = (ids.size() + per - 1) / per;
  for (uint64_t c = 0; c < chunks; ++c) {
    auto r = f.read(ids, per, c);
    REQUIRE_MESSAGE(r.status == 200, r.error);
    CHECK(r.num_chunks == chunks);
    std::vector<int64_t> part(ids.begin() + c * per,
                              ids.begin() + std::min<size_t>(ids.size(), (c + 1) * per));
    std::vector<size_t> ends;
    auto want = f.reference(part, &ends);
    CHECK(r.bytes == want);
    CHECK(std::vector<size_t>(r.layer_end.begin(), r.layer_end.end()) == ends);
    // float16: the digests are MD5s of exactly these bytes.
    CHECK(chunk_digests(r, false) == std::vector<std::string>{md5_hex(want.data(), want.size())});
    auto layers = chunk_digests(r, true);
    REQUIRE(layers.size() == ends.size());
    size_t begin = 0;
    for (size_t l = 0; l < ends.size(); ++l) {
      CHECK(layers[l] == md5_hex(want.data() + begin, ends[l] - begin));
      begin = ends[l];
    }
  }
}

} // namespace

TEST_CASE("block checksums: flash-attn NHD [2, NB, BS, NH, HD]: K pages then V pages, per layer") {
  pools_fixture f({2, 8, 4, 2, 4}, 1, 3, vllm_kv_layout::nhd);
  check_chunks(f, {5, 1, 2, 7, 0}, 2); // out of order, last chunk short
  check_chunks(f, {3}, 1);
}

TEST_CASE("block checksums: flash-attn HND [2, NB, NH, BS, HD]: heads outside tokens, as the engine holds them") {
  pools_fixture f({2, 8, 2, 4, 4}, 1, 2, vllm_kv_layout::hnd);
  check_chunks(f, {6, 2, 3, 4}, 3);
}

TEST_CASE("block checksums: flashinfer [NB, 2, BS, NH, HD]: per block, its K then its V page") {
  pools_fixture f({8, 2, 4, 2, 4}, 0, 2, vllm_kv_layout::nhd);
  check_chunks(f, {7, 0, 3}, 2);
  pools_fixture hnd({8, 2, 2, 4, 4}, 0, 2, vllm_kv_layout::hnd);
  check_chunks(hnd, {1, 2, 5, 6}, 4);
}

TEST_CASE("block checksums: bfloat16 is hashed widened to float32, as LMCache upcasts it") {
  block_checksum_chunk c;
  c.dtype = "bfloat16";
  c.bytes = {0x80, 0x3f, 0x00, 0xc0, 0x49, 0x40}; // 1.0, -2.0, ~3.14 (one layer)
  c.layer_end = {6};
  const uint8_t wide[] = {0, 0, 0x80, 0x3f, 0, 0, 0x00, 0xc0, 0, 0, 0x49, 0x40};
  CHECK(chunk_digests(c, false) == std::vector<std::string>{md5_hex(wide, sizeof wide)});
  // Longer than the widening buffer: the same digest as widening at once.
  c.bytes.assign(20000, 0);
  for (size_t i = 0; i < c.bytes.size(); ++i) c.bytes[i] = static_cast<uint8_t>(i * 7);
  c.layer_end = {8000, 20000};
  std::vector<uint8_t> all;
  for (size_t i = 0; i < c.bytes.size(); i += 2)
    all.insert(all.end(), {0, 0, c.bytes[i], c.bytes[i + 1]});
  CHECK(chunk_digests(c, false) == std::vector<std::string>{md5_hex(all.data(), all.size())});
  auto per_layer = chunk_digests(c, true);
  REQUIRE(per_layer.size() == 2);
  CHECK(per_layer[0] == md5_hex(all.data(), 16000));
  CHECK(per_layer[1] == md5_hex(all.data() + 16000, all.size() - 16000));
}

TEST_CASE("block checksums: LMCache's refusals and ours, each naming why") {
  pools_fixture f({2, 8, 4, 2, 4}, 1, 2, vllm_kv_layout::nhd);
  auto empty = f.read({}, 2, 0);
  CHECK(empty.status == 400);
  CHECK(empty.error == "block_ids is required");
  auto zero = f.read({1}, 0, 0);
  CHECK(zero.status == 400);
  CHECK(zero.error == "chunk_size must be positive");
  CHECK(f.read({1}, -3, 0).status == 400);
  auto outside = f.read({1, 8}, 1, 0);
  CHECK(outside.status == 400);
  CHECK(outside.error.find("block_ids[1] = 8") != std::string::npos);
  CHECK(f.read({-1}, 1, 0).status == 400);
  // 3 blocks x 2 layers x K,V x 64-byte pages (4 tokens x 2 heads x 4 dims x 2 bytes).
  const uint64_t three = checksum_chunk_bytes(f.pools->layout(), 3);
  CHECK(three == 3 * 2 * 2 * 4 * 2 * 4 * 2);
  CHECK(f.read({1, 2, 3}, 1, 0, three).status == 200);
  auto big = f.read({1, 2, 3}, 1, 0, three - 1);
  CHECK(big.status == 413);
  CHECK(big.bytes.empty());
  CHECK(f.read({1, 2, 3}, 1, 3).status == 400); // no chunk 3 of 3

  // vLLM's CPU layout: LMCache has no block axis for it (501, its words).
  std::vector<tensor_desc> cpu{f.tensors.front()};
  cpu[0].shape = {8, 2, 4, 8};
  cpu[0].stride = contiguous_strides(cpu[0].shape);
  kv_layout_hints h;
  h.engine_type = engine_type::vllm;
  h.kv_layout = vllm_kv_layout::hnd;
  auto layout = detect_kv_layout(cpu, h);
  REQUIRE_MESSAGE(layout.has_value(), layout.error_value().detail);
  auto opened = f.backend->open(cpu, layout.value());
  REQUIRE_MESSAGE(opened.has_value(), opened.error_value().detail);
  block_checksum_query q;
  q.block_ids = {1};
  q.chunk_blocks = 1;
  q.max_bytes = 1 << 20;
  auto declined = read_checksum_chunk(*f.backend, *opened.value(), q);
  CHECK(declined.status == 501);
  CHECK(declined.error == "checksum not supported for GPU KV format NL_X_NB_NH_BS_CS");
}

TEST_CASE("block checksums: chunks hashed together in SIMD lanes give each chunk's own digests") {
  // 11 chunks (more than 8 lanes) of unequal sizes, float16 and bfloat16,
  // one to four layers: on every path, as each chunk hashed alone.
  std::vector<block_checksum_chunk> chunks(11);
  for (size_t i = 0; i < chunks.size(); ++i) {
    auto& c = chunks[i];
    c.dtype = i % 3 == 0 ? "bfloat16" : "float16";
    c.bytes.resize(1000 + i * 777);
    for (size_t b = 0; b < c.bytes.size(); ++b)
      c.bytes[b] = static_cast<uint8_t>(b * 31 + i);
    for (size_t l = 1; l <= 1 + i % 4; ++l)
      c.layer_end.push_back(c.bytes.size() * l / (1 + i % 4));
  }
  for (bool layerwise : {false, true}) {
    CAPTURE(layerwise);
    std::vector<std::vector<std::string>> want;
    for (auto& c : chunks)
      want.push_back(chunk_digests(&c, 1, layerwise, md5_path::scalar).front());
    for (md5_path path : {md5_path::best, md5_path::scalar, md5_path::avx2, md5_path::avx2_gather,
                          md5_path::avx512vl, md5_path::avx512, md5_path::avx512_gather}) {
      if (!md5_path_available(path))
        continue;
      CAPTURE(md5_path_name(path));
      CHECK(chunk_digests(chunks.data(), chunks.size(), layerwise, path) == want);
    }
  }
}

TEST_CASE("block checksums: a read into a given buffer reuses its memory and overwrites every byte") {
  pools_fixture f({2, 8, 4, 2, 4}, 1, 3, vllm_kv_layout::nhd);
  const std::vector<int64_t> ids{5, 1, 2, 7, 0};
  auto fresh = f.read(ids, 2, 1);
  REQUIRE(fresh.status == 200);
  block_checksum_query q;
  q.block_ids = ids;
  q.chunk_blocks = 2;
  q.chunk = 1;
  q.max_bytes = 1 << 30;
  // A larger buffer full of another chunk's bytes (what the admin hands back).
  std::vector<uint8_t> buffer(fresh.bytes.size() * 3, 0xEE);
  const uint8_t* memory = buffer.data();
  auto again = read_checksum_chunk(*f.backend, *f.pools, q, std::move(buffer));
  REQUIRE(again.status == 200);
  CHECK(again.bytes.data() == memory); // no new allocation
  CHECK(again.bytes == fresh.bytes);   // no byte of the old contents left
  CHECK(again.layer_end == fresh.layer_end);
  // A buffer too small grows as needed.
  auto grown = read_checksum_chunk(*f.backend, *f.pools, q, std::vector<uint8_t>(3, 0xEE));
  CHECK(grown.bytes == fresh.bytes);
}
