#include "admin/chunk_digests.hpp"

#include "cache/md5.hpp"

#include <algorithm>
#include <cstdint>

namespace kvs {

namespace {

/// Feeds [p, p+n) as LMCache would hash it: bfloat16 widened to float32.
void feed(md5_stream& md5, const uint8_t* p, uint64_t n, bool bf16) {
  if (!bf16) {
    md5.update(p, n);
    return;
  }
  uint8_t wide[8192];
  for (uint64_t at = 0; at + 1 < n;) {
    uint64_t take = std::min<uint64_t>((n - at) / 2, sizeof wide / 4);
    for (uint64_t i = 0; i < take; ++i) {
      wide[4 * i] = 0;
      wide[4 * i + 1] = 0;
      wide[4 * i + 2] = p[at + 2 * i];
      wide[4 * i + 3] = p[at + 2 * i + 1];
    }
    md5.update(wide, take * 4);
    at += take * 2;
  }
}

} // namespace

std::vector<std::string> chunk_digests(const block_checksum_chunk& c, bool layerwise) {
  const bool bf16 = c.dtype == "bfloat16";
  std::vector<std::string> out;
  md5_stream all;
  uint64_t begin = 0;
  for (uint64_t end : c.layer_end) {
    end = std::min<uint64_t>(end, c.bytes.size());
    if (layerwise) {
      md5_stream one;
      feed(one, c.bytes.data() + begin, end - begin, bf16);
      out.push_back(one.hex());
    } else {
      feed(all, c.bytes.data() + begin, end - begin, bf16);
    }
    begin = end;
  }
  if (!layerwise)
    out.push_back(all.hex());
  return out;
}

} // namespace kvs
