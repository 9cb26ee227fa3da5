#include "cache/lmcache_token_hash.hpp"

namespace kvs {

blake3_digest lmcache_none_hash() {
  // (0).to_bytes(8, "big", signed=True) then struct.pack(">1I", 0).
  static const blake3_digest none = [] {
    const uint8_t zeros[12] = {};
    return blake3(zeros, sizeof zeros);
  }();
  return none;
}

namespace {

template <class Token>
size_t append_hashes(const Token* tokens, size_t n, size_t chunk_size,
                     std::vector<std::string>& out) {
  if (chunk_size == 0)
    return 0;
  const size_t chunks = n / chunk_size;
  blake3_digest prev = lmcache_none_hash();
  std::vector<uint8_t> be(chunk_size * 4);
  size_t added = 0;
  for (size_t c = 0; c < chunks; ++c) {
    const Token* t = tokens + c * chunk_size;
    for (size_t i = 0; i < chunk_size; ++i) {
      if (static_cast<int64_t>(t[i]) < 0 || static_cast<int64_t>(t[i]) > int64_t{0xffffffff})
        return added;
      auto v = static_cast<uint32_t>(t[i]);
      be[4 * i] = static_cast<uint8_t>(v >> 24);
      be[4 * i + 1] = static_cast<uint8_t>(v >> 16);
      be[4 * i + 2] = static_cast<uint8_t>(v >> 8);
      be[4 * i + 3] = static_cast<uint8_t>(v);
    }
    blake3_hasher h;
    h.update(prev.data(), prev.size());
    h.update(be.data(), be.size());
    prev = h.digest();
    out.emplace_back(reinterpret_cast<const char*>(prev.data()), prev.size());
    ++added;
  }
  return added;
}

} // namespace

size_t append_lmcache_chunk_hashes(const int64_t* tokens, size_t n, size_t chunk_size,
                                   std::vector<std::string>& out) {
  return append_hashes(tokens, n, chunk_size, out);
}

size_t append_lmcache_chunk_hashes(const uint32_t* tokens, size_t n, size_t chunk_size,
                                   std::vector<std::string>& out) {
  return append_hashes(tokens, n, chunk_size, out);
}

} // namespace kvs
