// md5: RFC 1321 MD5 of a byte range, as lowercase hex, at once or fed in
// pieces (md5_stream). Only for
// POST /cache/checksums (the admin actor, admin/admin_actor.cpp), which answers in LMCache's
// shape: LMCache hashes KV blocks with hashlib.md5, so operators compare
// the same kind of digest. Not for anything that needs collision resistance.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvs {

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
  uint32_t h_[4] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
  unsigned char buf_[64] = {};
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};

} // namespace kvs
