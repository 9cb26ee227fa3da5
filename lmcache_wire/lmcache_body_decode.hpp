// The body decoder (internal to lmcache_wire/): the argument frames of one
// LMCache MP op into its request struct, generic over the struct's own field
// list (`wire_args()` / `wire_fields()`, wire_fields.hpp). The op table's
// rows name `decode_args<Req>` (lmcache_ops.cpp); the frame-level decoding
// (op, arity, release) is lmcache_decode.cpp.
//
// A member is read by its C++ type and its field's `form` (`read_member`);
// the types whose rules are their own (the cache key, the layout hints, the
// KV-cache wrappers, the engine type, a timeout) have their readers in
// lmcache_body_decode.cpp. Reads go through the shared streaming reader
// (lmcache_reads.hpp): no intermediate object tree, no allocation sized by an
// untrusted count, type rules as msgspec's strict decoding, which is what
// LMCache's own server applies. Every error names the argument and the place
// ("arg 0 'key': field 'token_ids'[2]: ..."). Never throws.
#pragma once

#include "core/error.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"
#include "lmcache_wire/lmcache_reads.hpp"

#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvs {
struct mp_op_row;
}

namespace kvs::lmcache_wire {

/// The argument frames of one request (arity already checked), read by
/// position; errors name the argument by its row's name.
class op_args {
public:
  op_args(const mp_op_row& row, const std::vector<std::string_view>& frames)
      : row_(row), frames_(frames) {}

  size_t size() const { return frames_.size(); }

  /// Decodes argument `k` whole with `fn(cursor&, where)`, refusing trailing bytes.
  template <class F>
  status arg(size_t k, F&& fn) const {
    const std::string where = "arg " + std::to_string(k) + " '" + arg_name(k) + "'";
    cursor c(frames_[k]);
    if (auto e = fn(c, where); !e) return e;
    if (!c.at_end()) return fail(where, std::to_string(c.left()) + " trailing bytes after the value");
    return {};
  }

private:
  const char* arg_name(size_t k) const;
  const mp_op_row& row_;
  const std::vector<std::string_view>& frames_;
};

/// Decodes `frames` (the arguments, arity already checked) with `row`'s
/// decoder into `body`. Error kind "bad_field"; detail names the argument.
status decode_body(const mp_op_row& row, const std::vector<std::string_view>& frames,
                   mp_request_body& body);

// The types with rules of their own (lmcache_body_decode.cpp).
status read_value(cursor& c, const std::string& where, cache_key& out);
status read_value(cursor& c, const std::string& where, layout_hints& out);
status read_value(cursor& c, const std::string& where, std::vector<tensor_desc>& out);
status read_value(cursor& c, const std::string& where, engine_type& out);
/// A timeout in seconds: a float (an int accepted, as msgspec does), finite and >= 0.
status read_value(cursor& c, const std::string& where, double& out);

template <class T, class = void>
struct is_record : std::false_type {};
/// A struct sent as a msgpack map: it lists its fields (wire_fields.hpp).
template <class T>
struct is_record<T, std::void_t<decltype(T::wire_fields())>> : std::true_type {};

template <class T>
struct record_list : std::false_type {};
template <class R>
struct record_list<std::vector<R>> : is_record<R> {};

template <class T>
struct optional_record_list : std::false_type {};
template <class L>
struct optional_record_list<std::optional<L>> : record_list<L> {};

template <class R>
status read_record(cursor& c, const std::string& where, R& r);

/// A member of type M, as its field `f` says.
template <class T, class M>
status read_member(cursor& c, const std::string& w, M& out, const wire::field<T, M>& f) {
  using wire::form;
  if constexpr (std::is_same_v<M, int64_t>) {
    return read_int(c, w, out);
  } else if constexpr (std::is_same_v<M, std::optional<int64_t>>) {
    return read_opt_int(c, w, out);
  } else if constexpr (std::is_same_v<M, bool>) {
    return read_bool(c, w, out);
  } else if constexpr (std::is_same_v<M, std::string>) {
    return f.how == form::bin ? read_bin(c, w, out) : read_str(c, w, out);
  } else if constexpr (std::is_same_v<M, size_t>) {
    // form::bin_size: only the length is kept.
    std::string bytes;
    if (auto e = read_bin(c, w, bytes); !e) return e;
    out = bytes.size();
    return {};
  } else if constexpr (std::is_same_v<M, uint32_t>) {
    // form::count: an array whose elements are checked to be msgpack and dropped.
    if (auto e = read_header(c, w, mk::array, out); !e) return e;
    for (uint32_t k = 0; k < out; ++k)
      if (const char* bad = c.skip()) return fail(at_index(w, k), std::string("undecodable msgpack (") + bad + ")");
    return {};
  } else if constexpr (std::is_same_v<M, std::vector<int64_t>>) {
    return read_int_array(c, w, out, f.how == form::nonneg);
  } else if constexpr (std::is_same_v<M, std::vector<std::vector<int64_t>>>) {
    uint32_t n = 0;
    if (auto e = read_header(c, w, mk::array, n); !e) return e;
    out.clear();
    for (uint32_t g = 0; g < n; ++g) {
      out.emplace_back();
      if (auto e = read_int_array(c, at_index(w, g), out.back(), f.how == form::nonneg); !e) return e;
    }
    return {};
  } else if constexpr (std::is_same_v<M, std::vector<std::pair<int64_t, int64_t>>>) {
    // [start, end] pairs.
    uint32_t n = 0;
    if (auto e = read_header(c, w, mk::array, n); !e) return e;
    for (uint32_t k = 0; k < n; ++k) {
      std::vector<int64_t> pair;
      if (auto e = read_int_array(c, at_index(w, k), pair); !e) return e;
      if (pair.size() != 2) return fail(at_index(w, k), "a range is [start, end]");
      out.emplace_back(pair[0], pair[1]);
    }
    return {};
  } else if constexpr (record_list<M>::value) {
    uint32_t n = 0;
    if (auto e = read_header(c, w, mk::array, n); !e) return e;
    if (f.max_items != 0 && n > f.max_items)
      return fail(w, std::to_string(n) + " " + f.items + ", above " + std::to_string(f.max_items));
    for (uint32_t k = 0; k < n; ++k) {
      out.emplace_back();
      if (auto e = read_record(c, at_index(w, k), out.back()); !e) return e;
    }
    return {};
  } else if constexpr (optional_record_list<M>::value) {
    // Absent: nullopt; present (even []): the list.
    auto& list = out.emplace();
    return read_member(c, w, list, wire::field<T, typename M::value_type>{f.name, nullptr, f.how,
                                                                            f.required, f.max_items, f.items});
  } else if constexpr (is_record<M>::value) {
    return read_record(c, w, out);
  } else {
    return read_value(c, w, out);
  }
}

/// A map-encoded struct: each field it lists read into its member; unknown
/// fields skipped; a missing required one named with the struct's wire_name.
template <class R>
status read_record(cursor& c, const std::string& where, R& r) {
  required need;
  std::apply([&](const auto&... f) { ((f.required ? (void)need.fields.emplace_back(f.name, false) : void()), ...); },
             R::wire_fields());
  auto e = read_fields(c, where, false, [&](std::string_view name, bool& known) -> status {
    need.seen(name);
    status s;
    auto one = [&](const auto& f) {
      if (name != f.name) return false;
      s = read_member(c, at_field(where, name), r.*(f.member), f);
      return true;
    };
    known = std::apply([&](const auto&... f) { return (one(f) || ...); }, R::wire_fields());
    return s;
  });
  if (!e) return e;
  return need.check(where, R::wire_name);
}

template <class Req, class M>
status read_arg(cursor& c, const std::string& w, Req& r, const wire::field<Req, M>& f) {
  return read_member(c, w, r.*(f.member), f);
}
template <class Req>
status read_arg(cursor& c, const std::string& w, Req& r, const wire::as_map<Req>&) {
  return read_record(c, w, r);
}

/// The decoder of every request struct: its `wire_args()` in order, each a
/// whole argument frame; arguments past the ones sent (the row's optional
/// ones) keep the struct's defaults. The first error is returned.
template <class Req>
status decode_args(const op_args& a, mp_request_body& body) {
  Req r;
  status s;
  size_t k = 0;
  auto one = [&](const auto& f) {
    if (s && k < a.size())
      s = a.arg(k, [&](cursor& c, const std::string& w) { return read_arg(c, w, r, f); });
    ++k;
  };
  std::apply([&](const auto&... f) { (one(f), ...); }, Req::wire_args());
  if (s) body = std::move(r);
  return s;
}

} // namespace kvs::lmcache_wire
