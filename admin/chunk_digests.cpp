#include "admin/chunk_digests.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <utility>

namespace kvs {

namespace {

/// One MD5 stream of a chunk: byte ranges of its bytes, end to end, each
/// widened from bfloat16 to float32 when `bf16` (a range's odd last byte,
/// half an element, is not hashed).
struct ranges_source {
  const uint8_t* base;
  std::vector<std::pair<uint64_t, uint64_t>> ranges; // [begin, end)
  bool bf16;
  size_t r = 0;
  uint64_t at = 0; // in ranges[r], for bf16
  // The widened piece handed out last (valid until the next call, as
  // md5_source asks); shared because std::function copies its target.
  std::shared_ptr<std::array<uint8_t, 8192>> wide;

  md5_piece operator()() {
    for (; r < ranges.size(); ++r, at = 0) {
      auto [begin, end] = ranges[r];
      if (!bf16) {
        if (end > begin) {
          ++r;
          return md5_piece{base + begin, end - begin};
        }
        continue;
      }
      uint64_t n = end - begin;
      if (at + 1 >= n)
        continue;
      uint64_t take = std::min<uint64_t>((n - at) / 2, wide->size() / 4);
      const uint8_t* p = base + begin + at;
      uint8_t* w = wide->data();
      for (uint64_t i = 0; i < take; ++i) {
        w[4 * i] = 0;
        w[4 * i + 1] = 0;
        w[4 * i + 2] = p[2 * i];
        w[4 * i + 3] = p[2 * i + 1];
      }
      at += take * 2;
      return md5_piece{w, take * 4};
    }
    return md5_piece{};
  }
};

} // namespace

std::vector<std::vector<std::string>> chunk_digests(const block_checksum_chunk* chunks, size_t n,
                                                    bool layerwise, md5_path path) {
  std::vector<md5_source> sources;
  std::vector<size_t> streams(n); // how many digests each chunk gets
  for (size_t i = 0; i < n; ++i) {
    const block_checksum_chunk& c = chunks[i];
    ranges_source all{c.bytes.data(), {}, c.dtype == "bfloat16", 0, 0, nullptr};
    if (all.bf16)
      all.wide = std::make_shared<std::array<uint8_t, 8192>>();
    uint64_t begin = 0;
    for (uint64_t end : c.layer_end) {
      end = std::min<uint64_t>(end, c.bytes.size());
      all.ranges.emplace_back(begin, end);
      if (layerwise) {
        ranges_source one = all;
        one.ranges = {all.ranges.back()};
        if (one.bf16)
          one.wide = std::make_shared<std::array<uint8_t, 8192>>();
        sources.push_back(std::move(one));
      }
      begin = end;
    }
    if (!layerwise)
      sources.push_back(std::move(all));
    streams[i] = layerwise ? c.layer_end.size() : 1;
  }
  auto digests = md5_hex_lanes(std::move(sources), path);
  std::vector<std::vector<std::string>> out(n);
  size_t at = 0;
  for (size_t i = 0; i < n; ++i)
    for (size_t s = 0; s < streams[i]; ++s)
      out[i].push_back(std::move(digests[at++]));
  return out;
}

std::vector<std::string> chunk_digests(const block_checksum_chunk& chunk, bool layerwise) {
  return chunk_digests(&chunk, 1, layerwise).front();
}

} // namespace kvs
