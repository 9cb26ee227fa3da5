// UTF-8 validation shared by the wire decoders: msgspec-strict for msgpack
// str values, and Python pickle's "surrogatepass" for pickled strings.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvs {

/// Well-formed UTF-8: no overlong forms, nothing above U+10FFFF, and (unless
/// `surrogates_ok`, Python's "surrogatepass") no UTF-16 surrogates.
/// `code_points`, when given, receives the number of code points.
inline bool valid_utf8(const uint8_t* p, size_t n, size_t* code_points = nullptr,
                       bool surrogates_ok = false) {
  static const uint32_t min_cp[4] = {0, 0x80, 0x800, 0x10000};
  size_t cps = 0;
  const uint8_t* end = p + n;
  while (p < end) {
    uint8_t c = *p;
    ++cps;
    if (c < 0x80) {
      ++p;
      continue;
    }
    size_t need;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
      need = 1;
      cp = c & 0x1fu;
    } else if ((c & 0xf0) == 0xe0) {
      need = 2;
      cp = c & 0x0fu;
    } else if ((c & 0xf8) == 0xf0) {
      need = 3;
      cp = c & 0x07u;
    } else {
      return false;
    }
    if (static_cast<size_t>(end - p) <= need)
      return false;
    for (size_t k = 1; k <= need; ++k) {
      if ((p[k] & 0xc0) != 0x80)
        return false;
      cp = (cp << 6) | (p[k] & 0x3fu);
    }
    if (cp < min_cp[need] || cp > 0x10ffff
        || (!surrogates_ok && cp >= 0xd800 && cp <= 0xdfff))
      return false;
    p += need + 1;
  }
  if (code_points)
    *code_points = cps;
  return true;
}

} // namespace kvs
