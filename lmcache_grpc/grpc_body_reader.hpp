// A cursor over one msgpack reply body, for the reply transcoders
// (grpc_reply.cpp, grpc_kv_event_batch.cpp): every mismatch is a "bad_reply"
// naming the op and the field (the actors encoded a body of the wrong shape:
// a bug, never client input). Internal to lmcache_grpc/.
#pragma once

#include "core/error.hpp"
#include "msgpack/msgpack_reader.hpp"

#include <string>
#include <string_view>

namespace kvs::grpc_reply {

using msgpack_io::item;
using msgpack_io::value_type;

/// A cursor over one reply body.
struct body_reader {
  msgpack_io::reader r;
  std::string_view what;
  explicit body_reader(std::string_view body, std::string_view w)
    : r(reinterpret_cast<const uint8_t*>(body.data()), body.size()), what(w) {}

  error fail(std::string why) const { return error{"bad_reply", std::string(what) + ": " + why}; }
  expected<item> next() {
    item it;
    if (!r.next(it))
      return fail(r.error());
    return it;
  }
  expected<item> next(value_type want, const char* field) {
    auto it = next();
    if (!it)
      return it;
    if (it->kind != want && !(want == value_type::uint && it->kind == value_type::sint))
      return fail(std::string(field) + ": expected " + msgpack_io::kind_name(want) + ", got " +
                  msgpack_io::kind_name(it->kind));
    return it;
  }
  static int64_t as_int(const item& it) {
    return it.kind == value_type::sint ? it.i : static_cast<int64_t>(it.u);
  }
  static std::string_view as_view(const item& it) {
    return {reinterpret_cast<const char*>(it.ptr), it.len};
  }
  /// A map field's value of kind `want`, handed to `set`; true (handled),
  /// for each_field. `name` names it in the error.
  template <class Set>
  expected<bool> field(value_type want, const char* name, Set&& set) {
    auto it = next(want, name);
    if (!it)
      return it.error_value();
    set(*it);
    return true;
  }
  /// An array field whose items are all of kind `want`, each handed to
  /// `add`; true (handled). `name` names the array, `item_name` an item.
  template <class Add>
  expected<bool> array_of(const char* name, value_type want, const char* item_name, Add&& add) {
    auto head = next(value_type::array, name);
    if (!head)
      return head.error_value();
    for (uint32_t i = 0; i < head->len; ++i)
      if (auto f = field(want, item_name, add); !f)
        return f;
    return true;
  }
  /// The raw bytes of the next value (for fields that travel as msgpack bytes).
  expected<std::string_view> raw_value(const char* field) {
    const size_t from = r.offset();
    if (!r.skip(1))
      return fail(std::string(field) + ": " + r.error());
    return std::string_view{reinterpret_cast<const char*>(r.at(from)), r.offset() - from};
  }
};

/// Walks a msgpack map body, calling field(name) for each key; `field`
/// reads the value (or returns false to have it skipped).
template <class Field>
status each_field(body_reader& b, Field&& field) {
  auto head = b.next(value_type::map, "body");
  if (!head)
    return head.error_value();
  for (uint32_t i = 0; i < head->len; ++i) {
    auto k = b.next(value_type::str, "key");
    if (!k)
      return k.error_value();
    auto handled = field(body_reader::as_view(*k));
    if (!handled)
      return handled.error_value();
    if (!*handled && !b.r.skip(1))
      return b.fail(b.r.error());
  }
  return {};
}

} // namespace kvs::grpc_reply
