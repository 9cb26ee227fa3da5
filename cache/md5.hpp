// md5: RFC 1321 MD5 of a byte range, as lowercase hex, at once or fed in
// pieces (md5_stream). Only for
// POST /cache/checksums (the admin actor, admin/admin_actor.cpp), which answers in LMCache's
// shape: LMCache hashes KV blocks with hashlib.md5, so operators compare
// the same kind of digest. Not for anything that needs collision resistance.
// Portable C++, one stream at a time (~400 MB/s on this project's Xeon,
// below OpenSSL's ~600 MB/s assembly behind hashlib): the block-id form's
// many chunks go through cache/md5_lanes.hpp instead, which hashes 8 or 16
// streams at once in SIMD lanes on top of the pieces below (md5_detail).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvs {

/// MD5's pieces, shared with cache/md5_lanes.cpp (its lanes run the same
/// rounds in SIMD and must end exactly as md5_stream does).
namespace md5_detail {

inline constexpr uint32_t iv[4] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
/// T[i] = floor(2^32 * |sin(i + 1)|).
extern const uint32_t sines[64];

/// Runs the block function over `blocks` 64-byte blocks at `p`.
void compress(uint32_t h[4], const unsigned char* p, size_t blocks);
/// The last `n` (< 64) bytes of a message of `total` bytes, padded: the
/// 0x80 marker, zeros, the bit length (little-endian). Writes 64 or 128
/// bytes to `out` and returns how many.
size_t pad_tail(unsigned char out[128], const unsigned char* tail, size_t n, uint64_t total);
/// The digest of the final state as 32 lowercase hex digits.
std::string hex(const uint32_t h[4]);

} // namespace md5_detail

/// The MD5 of `n` bytes at `data`, 32 lowercase hex digits.
std::string md5_hex(const void* data, size_t n);

/// MD5 fed piece by piece (hashlib.md5().update()): the digest of the
/// pieces end to end, whatever their sizes.
class md5_stream {
public:
  void update(const void* data, size_t n);
  /// 32 lowercase hex digits; the stream is spent after it.
  std::string hex();

private:
  uint32_t h_[4] = {md5_detail::iv[0], md5_detail::iv[1], md5_detail::iv[2], md5_detail::iv[3]};
  unsigned char buf_[64] = {};
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};


} // namespace kvs
