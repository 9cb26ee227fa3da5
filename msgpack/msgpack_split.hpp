// Raw msgpack values cut out of, and put into, arrays without decoding
// them: the block index keeps each block's element of a batch-wide array
// (extra_keys) as its own bytes and re-joins runs of them when it
// re-encodes. Built on the one reader and writer (msgpack_reader.hpp,
// msgpack_writer.hpp), so there is one definition of what a value is.
#pragma once

#include "msgpack/msgpack_reader.hpp"
#include "msgpack/msgpack_writer.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace kvs::msgpack_io {

/// The elements of `v`, a msgpack array of exactly `count` elements and
/// nothing after it, each as its raw bytes into `out`; false otherwise.
inline bool split_array(std::string_view v, size_t count, std::vector<std::string>& out) {
  out.clear();
  reader r(reinterpret_cast<const uint8_t*>(v.data()), v.size());
  item it;
  if (!r.next(it) || it.kind != value_type::array || it.len != count)
    return false;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const size_t start = r.offset();
    if (!r.skip(1))
      return false;
    out.emplace_back(v.data() + start, r.offset() - start);
  }
  return r.remaining() == 0;
}

/// Appends the header of an array of `len` elements (the writer's shortest form).
inline void append_array_header(std::string& out, size_t len) {
  writer w(out);
  w.array(static_cast<uint32_t>(len));
  w.finish();
}

} // namespace kvs::msgpack_io
