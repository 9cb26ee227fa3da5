// md5: RFC 1321 MD5 of a byte range, as lowercase hex. Only for
// POST /cache/checksums (app/admin_api.cpp), which answers in LMCache's
// shape: LMCache hashes KV blocks with hashlib.md5, so operators compare
// the same kind of digest. Not for anything that needs collision resistance.
#pragma once

#include <cstddef>
#include <string>

namespace kvs {

/// The MD5 of `n` bytes at `data`, 32 lowercase hex digits.
std::string md5_hex(const void* data, size_t n);

} // namespace kvs
