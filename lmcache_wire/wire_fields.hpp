// A protocol struct's wire shape, declared in the struct itself
// (lmcache_protocol.hpp): the names and members of its arguments, in
// LMCache's order (`static constexpr auto wire_args()`), or of its fields
// when it travels as a msgpack map (`wire_fields()` and `wire_name`). The
// body decoder (lmcache_body_decode.hpp) is generic over these lists, and the
// op table takes a row's argument names from them, so a new request is its
// struct with its list, and nothing per op in the decoder.
//
// No msgpack and no CAF here: the protocol header includes it.
#pragma once

#include <cstdint>
#include <tuple>

namespace kvs::wire {

/// How a member is read where its C++ type alone does not say; the type
/// says the rest (lmcache_body_decode.hpp, `read_member`).
enum class form : uint8_t {
  natural,  ///< by its type: int64_t an int, std::string a str, bool, ...
  bin,      ///< std::string from msgpack bin (bytes, not text)
  bin_size, ///< size_t: the length of a msgpack bin; the bytes are dropped
  nonneg,   ///< lists of ints: each int >= 0
  count,    ///< uint32_t: an array whose elements are checked and dropped
};

/// One argument or map field: its wire name and the member it fills.
template <class T, class M>
struct field {
  const char* name;
  M T::*member;
  form how = form::natural;
  bool required = false;     ///< map fields: absent is an error naming it
  uint32_t max_items = 0;    ///< lists: at most this many (0: bounded by the bytes)
  const char* items = "";    ///< what the items are called in that error ("groups")

  constexpr field with(form f) const {
    field r = *this;
    r.how = f;
    return r;
  }
  /// A map field that must be present.
  constexpr field needed() const {
    field r = *this;
    r.required = true;
    return r;
  }
  /// A list of at most `n` `what`.
  constexpr field at_most(uint32_t n, const char* what) const {
    field r = *this;
    r.max_items = n;
    r.items = what;
    return r;
  }
};

/// The member `m` named `name` on the wire.
template <class T, class M>
constexpr field<T, M> arg(const char* name, M T::*m, form how = form::natural) {
  return field<T, M>{name, m, how};
}

/// The whole struct as one argument, a map of its `wire_fields()`
/// (register_kv_cache_engine_driven_context's payload).
template <class T>
struct as_map {
  const char* name;
};

} // namespace kvs::wire
