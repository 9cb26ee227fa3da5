#include "cache/blake3.hpp"

#include <algorithm>
#include <cstring>

namespace kvs {
namespace {

constexpr uint32_t k_iv[8] = {0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A,
                              0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19};
constexpr uint32_t k_chunk_start = 1, k_chunk_end = 2, k_parent = 4, k_root = 8;
constexpr size_t k_block = 64, k_chunk = 1024;

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

inline uint32_t load32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
inline void store32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// The message word order of each of the 7 rounds: the specification's
// permutation applied 0..6 times, precomputed so no round copies words.
constexpr uint8_t k_schedule[7][16] = {
  {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
  {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8},
  {3, 4, 10, 12, 13, 2, 7, 14, 6, 5, 9, 0, 11, 15, 8, 1},
  {10, 7, 12, 9, 14, 3, 13, 15, 4, 0, 11, 2, 5, 8, 1, 6},
  {12, 13, 9, 11, 15, 10, 14, 8, 7, 2, 5, 3, 0, 1, 6, 4},
  {9, 14, 11, 5, 8, 12, 15, 1, 13, 3, 0, 10, 2, 6, 4, 7},
  {11, 15, 5, 0, 1, 9, 8, 6, 14, 10, 2, 12, 3, 4, 7, 13},
};

#define KVS_B3_G(a, b, c, d, mx, my)                                                               \
  do {                                                                                             \
    a = a + b + (mx);                                                                              \
    d = rotr(d ^ a, 16);                                                                           \
    c = c + d;                                                                                     \
    b = rotr(b ^ c, 12);                                                                           \
    a = a + b + (my);                                                                              \
    d = rotr(d ^ a, 8);                                                                            \
    c = c + d;                                                                                     \
    b = rotr(b ^ c, 7);                                                                            \
  } while (0)

/// The compression function: 16 output words from a chaining value, one
/// 64-byte block (as words), the counter, the block's length and flags.
void compress(const uint32_t cv[8], const uint32_t m[16], uint64_t counter,
              uint32_t block_len, uint32_t flags, uint32_t out[16]) {
  uint32_t s0 = cv[0], s1 = cv[1], s2 = cv[2], s3 = cv[3], s4 = cv[4], s5 = cv[5], s6 = cv[6],
           s7 = cv[7], s8 = k_iv[0], s9 = k_iv[1], s10 = k_iv[2], s11 = k_iv[3],
           s12 = static_cast<uint32_t>(counter), s13 = static_cast<uint32_t>(counter >> 32),
           s14 = block_len, s15 = flags;
  for (const auto& r : k_schedule) {
    KVS_B3_G(s0, s4, s8, s12, m[r[0]], m[r[1]]);
    KVS_B3_G(s1, s5, s9, s13, m[r[2]], m[r[3]]);
    KVS_B3_G(s2, s6, s10, s14, m[r[4]], m[r[5]]);
    KVS_B3_G(s3, s7, s11, s15, m[r[6]], m[r[7]]);
    KVS_B3_G(s0, s5, s10, s15, m[r[8]], m[r[9]]);
    KVS_B3_G(s1, s6, s11, s12, m[r[10]], m[r[11]]);
    KVS_B3_G(s2, s7, s8, s13, m[r[12]], m[r[13]]);
    KVS_B3_G(s3, s4, s9, s14, m[r[14]], m[r[15]]);
  }
  out[0] = s0 ^ s8;
  out[1] = s1 ^ s9;
  out[2] = s2 ^ s10;
  out[3] = s3 ^ s11;
  out[4] = s4 ^ s12;
  out[5] = s5 ^ s13;
  out[6] = s6 ^ s14;
  out[7] = s7 ^ s15;
  out[8] = s8 ^ cv[0];
  out[9] = s9 ^ cv[1];
  out[10] = s10 ^ cv[2];
  out[11] = s11 ^ cv[3];
  out[12] = s12 ^ cv[4];
  out[13] = s13 ^ cv[5];
  out[14] = s14 ^ cv[6];
  out[15] = s15 ^ cv[7];
}

#undef KVS_B3_G

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
