#include "cache/blake3.hpp"

#include <algorithm>
#include <cstring>

namespace kvs {
namespace {

constexpr uint32_t k_iv[8] = {0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A,
                              0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19};
constexpr uint8_t k_perm[16] = {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8};
constexpr uint32_t k_chunk_start = 1, k_chunk_end = 2, k_parent = 4, k_root = 8;
constexpr size_t k_block = 64, k_chunk = 1024;

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

inline uint32_t load32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
inline void store32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

inline void g(uint32_t* s, int a, int b, int c, int d, uint32_t mx, uint32_t my) {
  s[a] = s[a] + s[b] + mx;
  s[d] = rotr(s[d] ^ s[a], 16);
  s[c] = s[c] + s[d];
  s[b] = rotr(s[b] ^ s[c], 12);
  s[a] = s[a] + s[b] + my;
  s[d] = rotr(s[d] ^ s[a], 8);
  s[c] = s[c] + s[d];
  s[b] = rotr(s[b] ^ s[c], 7);
}

/// The compression function: 16 output words from a chaining value, one
/// 64-byte block (as words), the counter, the block's length and flags.
void compress(const uint32_t cv[8], const uint32_t block[16], uint64_t counter,
              uint32_t block_len, uint32_t flags, uint32_t out[16]) {
  uint32_t s[16] = {cv[0], cv[1], cv[2], cv[3], cv[4], cv[5], cv[6], cv[7],
                    k_iv[0], k_iv[1], k_iv[2], k_iv[3],
                    static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32),
                    block_len, flags};
  uint32_t m[16];
  std::memcpy(m, block, sizeof m);
  for (int round = 0; round < 7; ++round) {
    g(s, 0, 4, 8, 12, m[0], m[1]);
    g(s, 1, 5, 9, 13, m[2], m[3]);
    g(s, 2, 6, 10, 14, m[4], m[5]);
    g(s, 3, 7, 11, 15, m[6], m[7]);
    g(s, 0, 5, 10, 15, m[8], m[9]);
    g(s, 1, 6, 11, 12, m[10], m[11]);
    g(s, 2, 7, 8, 13, m[12], m[13]);
    g(s, 3, 4, 9, 14, m[14], m[15]);
    if (round < 6) {
      uint32_t p[16];
      for (int i = 0; i < 16; ++i) p[i] = m[k_perm[i]];
      std::memcpy(m, p, sizeof m);
    }
  }
  for (int i = 0; i < 8; ++i) {
    out[i] = s[i] ^ s[i + 8];
    out[i + 8] = s[i + 8] ^ cv[i];
  }
}

void block_words(const uint8_t* bytes, uint32_t words[16]) {
  for (int i = 0; i < 16; ++i) words[i] = load32(bytes + 4 * i);
}

/// What the last compression of a node would be: kept uncompressed until
/// we know whether it is the root (ROOT flag, extendable output) or not.
struct node_output {
  uint32_t cv[8];
  uint32_t block[16];
  uint64_t counter;
  uint32_t block_len;
  uint32_t flags;

  void chaining_value(uint32_t out[8]) const {
    uint32_t full[16];
    compress(cv, block, counter, block_len, flags, full);
    std::memcpy(out, full, 8 * sizeof(uint32_t));
  }
  void root_bytes(uint8_t* out, size_t len) const {
    uint64_t block_counter = 0;
    while (len > 0) {
      uint32_t words[16];
      compress(cv, block, block_counter++, block_len, flags | k_root, words);
      uint8_t bytes[64];
      for (int i = 0; i < 16; ++i) store32(bytes + 4 * i, words[i]);
      size_t take = std::min(len, sizeof bytes);
      std::memcpy(out, bytes, take);
      out += take;
      len -= take;
    }
  }
};

node_output parent_output(const uint32_t left[8], const uint32_t right[8]) {
  node_output o;
  std::memcpy(o.cv, k_iv, sizeof o.cv);
  std::memcpy(o.block, left, 8 * sizeof(uint32_t));
  std::memcpy(o.block + 8, right, 8 * sizeof(uint32_t));
  o.counter = 0;
  o.block_len = k_block;
  o.flags = k_parent;
  return o;
}

} // namespace

blake3_hasher::blake3_hasher() { reset_chunk(0); }

void blake3_hasher::reset_chunk(uint64_t counter) {
  std::memcpy(chunk_.cv, k_iv, sizeof chunk_.cv);
  chunk_.counter = counter;
  chunk_.block_len = 0;
  chunk_.blocks_compressed = 0;
  std::memset(chunk_.block, 0, sizeof chunk_.block);
}

// A finished chunk's chaining value joins the stack; completed subtrees
// (one per trailing zero bit of the chunk count) merge into parents.
void blake3_hasher::push_cv(const uint32_t cv_in[8], uint64_t total_chunks) {
  uint32_t cv[8];
  std::memcpy(cv, cv_in, sizeof cv);
  while ((total_chunks & 1) == 0) {
    --stack_len_;
    parent_output(stack_[stack_len_], cv).chaining_value(cv);
    total_chunks >>= 1;
  }
  std::memcpy(stack_[stack_len_++], cv, sizeof cv);
}

void blake3_hasher::update(const void* data, size_t n) {
  auto in = static_cast<const uint8_t*>(data);
  while (n > 0) {
    // The current chunk is full and more input follows: it is not the
    // last one, so it is finished and a new chunk begins.
    if (size_t{chunk_.blocks_compressed} * k_block + chunk_.block_len == k_chunk) {
      uint32_t words[16], cv[8];
      block_words(chunk_.block, words);
      node_output o{};
      std::memcpy(o.cv, chunk_.cv, sizeof o.cv);
      std::memcpy(o.block, words, sizeof o.block);
      o.counter = chunk_.counter;
      o.block_len = chunk_.block_len;
      o.flags = k_chunk_end | (chunk_.blocks_compressed == 0 ? k_chunk_start : 0);
      o.chaining_value(cv);
      push_cv(cv, chunk_.counter + 1);
      reset_chunk(chunk_.counter + 1);
    }
    // A full block with more input after it is compressed now.
    if (chunk_.block_len == k_block) {
      uint32_t words[16], out[16];
      block_words(chunk_.block, words);
      compress(chunk_.cv, words, chunk_.counter, k_block,
               chunk_.blocks_compressed == 0 ? k_chunk_start : 0, out);
      std::memcpy(chunk_.cv, out, sizeof chunk_.cv);
      ++chunk_.blocks_compressed;
      chunk_.block_len = 0;
      std::memset(chunk_.block, 0, sizeof chunk_.block);
    }
    size_t take = std::min(n, k_block - chunk_.block_len);
    std::memcpy(chunk_.block + chunk_.block_len, in, take);
    chunk_.block_len = static_cast<uint8_t>(chunk_.block_len + take);
    in += take;
    n -= take;
  }
}

void blake3_hasher::finalize(uint8_t* out, size_t out_len) const {
  node_output o{};
  std::memcpy(o.cv, chunk_.cv, sizeof o.cv);
  block_words(chunk_.block, o.block);
  o.counter = chunk_.counter;
  o.block_len = chunk_.block_len;
  o.flags = k_chunk_end | (chunk_.blocks_compressed == 0 ? k_chunk_start : 0);
  for (size_t i = stack_len_; i > 0; --i) {
    uint32_t cv[8];
    o.chaining_value(cv);
    o = parent_output(stack_[i - 1], cv);
  }
  o.root_bytes(out, out_len);
}

blake3_digest blake3_hasher::digest() const {
  blake3_digest d;
  finalize(d.data(), d.size());
  return d;
}

blake3_digest blake3(const void* data, size_t n) {
  blake3_hasher h;
  h.update(data, n);
  return h.digest();
}

} // namespace kvs
