#include "cache/chunk_hash.hpp"

#include <cstring>

#include <xxhash.h>

namespace kvs {
namespace {

constexpr std::string_view k_domain_tag = "kvsidecar.chunk.v1";

void put_u64le(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

void append_u64le(std::vector<unsigned char>& buf, uint64_t v) {
  unsigned char b[8];
  put_u64le(b, v);
  buf.insert(buf.end(), b, b + 8);
}

void append_bytes(std::vector<unsigned char>& buf, std::string_view s) {
  buf.insert(buf.end(), s.begin(), s.end());
}

// Writes n tokens as little-endian int64. On little-endian hosts that is the
// in-memory representation, so one memcpy; elsewhere, byte by byte.
void put_tokens_le(unsigned char* dst, const int64_t* tokens, size_t n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  std::memcpy(dst, tokens, n * sizeof(int64_t));
#else
  for (size_t i = 0; i < n; ++i)
    put_u64le(dst + 8 * i, static_cast<uint64_t>(tokens[i]));
#endif
}

} // namespace

uint64_t group_hash(uint64_t h, uint32_t group) {
  if (group == 0)
    return h;
  static constexpr std::string_view k_group_tag = "kvsidecar.group.v1";
  unsigned char buf[k_group_tag.size() + 12];
  std::memcpy(buf, k_group_tag.data(), k_group_tag.size());
  put_u64le(buf + k_group_tag.size(), h);
  for (int i = 0; i < 4; ++i)
    buf[k_group_tag.size() + 8 + i] = static_cast<unsigned char>(group >> (8 * i));
  return XXH3_64bits(buf, sizeof buf);
}

uint64_t identity_seed(std::string_view model, int64_t world_size,
                       std::string_view cache_salt) {
  std::vector<unsigned char> buf;
  buf.reserve(k_domain_tag.size() + 24 + model.size() + cache_salt.size());
  append_bytes(buf, k_domain_tag);
  append_u64le(buf, model.size());
  append_bytes(buf, model);
  append_u64le(buf, static_cast<uint64_t>(world_size));
  append_u64le(buf, cache_salt.size());
  append_bytes(buf, cache_salt);
  return XXH3_64bits(buf.data(), buf.size());
}

void append_chunk_hashes(const int64_t* tokens, size_t n_tokens,
                         size_t chunk_size, uint64_t seed,
                         std::vector<uint64_t>& out) {
  const size_t n_chunks = full_chunks(n_tokens, chunk_size);
  if (n_chunks == 0) return;
  out.reserve(out.size() + n_chunks);
  // One scratch buffer: 8 bytes of the previous hash, then the chunk's tokens.
  std::vector<unsigned char> buf(8 + chunk_size * 8);
  uint64_t prev = seed;
  for (size_t c = 0; c < n_chunks; ++c) {
    put_u64le(buf.data(), prev);
    put_tokens_le(buf.data() + 8, tokens + c * chunk_size, chunk_size);
    prev = XXH3_64bits(buf.data(), buf.size());
    out.push_back(prev);
  }
}

std::vector<uint64_t> chunk_hashes(const int64_t* tokens, size_t n_tokens,
                                   size_t chunk_size, uint64_t seed) {
  std::vector<uint64_t> out;
  append_chunk_hashes(tokens, n_tokens, chunk_size, seed, out);
  return out;
}

} // namespace kvs
