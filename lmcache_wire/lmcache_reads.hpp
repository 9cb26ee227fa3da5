// The LMCache decoders' typed reads (internal to lmcache_wire/: lmcache_decode.cpp,
// lmcache_body_decode.cpp and tensor_wrappers.cpp). They sit on the one shared msgpack_io::reader;
// each takes the place ("arg 0 'key': field 'start'") it reads, for errors.
// Type rules follow msgspec's strict decoding, which is what LMCache's own
// server applies (transport/zmq_impl/mq.py msgspec_decode).
#pragma once

#include "msgpack/msgpack_reader.hpp"
#include "msgpack/utf8.hpp"
#include "core/error.hpp"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvs::lmcache_wire {

using mk = msgpack_io::value_type;
using item = msgpack_io::item;
inline const char* mk_name(mk k) { return msgpack_io::kind_name(k); }

/// The LMCache decoders' view of the shared msgpack_io::reader: an error is
/// a reason (nullptr when fine), and an array or map whose count claims more
/// elements than there are bytes left is refused at its header, before
/// anything is sized by it.
class cursor {
public:
  explicit cursor(std::string_view b)
      : r_(reinterpret_cast<const uint8_t*>(b.data()), b.size()) {}

  bool at_end() const { return r_.remaining() == 0; }
  size_t left() const { return r_.remaining(); }
  const uint8_t* pos() const { return r_.at(r_.offset()); }

  /// Reads one header (and steps over a str/bin/ext payload).
  const char* next(item& it) {
    it = item{};
    if (!r_.next(it))
      return r_.error().c_str();
    if (it.kind == mk::array && !r_.fits(it.len))
      return r_.error().c_str();
    if (it.kind == mk::map && !r_.fits(2 * uint64_t{it.len}))
      return r_.error().c_str();
    return nullptr;
  }
  /// Steps over one whole value without recursion.
  const char* skip() { return r_.skip(1) ? nullptr : r_.error().c_str(); }

private:
  msgpack_io::reader r_;
};

// ---------------------------------------------------------------------------
// Typed reads. Each takes the place ("arg 0 'key': field 'start'") for errors.
// ---------------------------------------------------------------------------

/// Containers are reserved up to this many elements from a (checked) count;
/// past it they grow as elements actually decode, so a frame of one-byte
/// elements cannot make us allocate many times its size up front.
constexpr uint32_t k_reserve_cap = 65536;

/// A read that failed: `detail` is "<where>: <what>" (just <what> when the
/// place is unnamed). The kind is settled by the decoder that reports it
/// (to_wire, bad_arg).
inline error fail(const std::string& where, std::string what) {
  return make_error("bad_field", where.empty() ? std::move(what) : where + ": " + what);
}
inline error wrong_kind(const std::string& where, const char* want, const item& got) {
  return fail(where, std::string("expected ") + want + ", got " + mk_name(got.kind));
}

inline status read_item(cursor& c, const std::string& where, item& it) {
  if (const char* e = c.next(it)) return fail(where, std::string("undecodable msgpack (") + e + ")");
  return {};
}

inline status as_int64(const item& it, const std::string& where, int64_t& out) {
  if (it.kind == mk::uint) {
    if (it.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return fail(where, "int " + std::to_string(it.u) + " out of int64 range");
    out = static_cast<int64_t>(it.u);
    return {};
  }
  if (it.kind == mk::sint) {
    out = it.i;
    return {};
  }
  return wrong_kind(where, "int", it);
}

inline status read_int(cursor& c, const std::string& where, int64_t& out) {
  item it;
  if (auto e = read_item(c, where, it); !e) return e;
  return as_int64(it, where, out);
}

inline status read_nonneg(cursor& c, const std::string& where, int64_t& out) {
  if (auto e = read_int(c, where, out); !e) return e;
  if (out < 0) return fail(where, "expected int >= 0, got " + std::to_string(out));
  return {};
}

inline status read_opt_int(cursor& c, const std::string& where, std::optional<int64_t>& out) {
  item it;
  if (auto e = read_item(c, where, it); !e) return e;
  if (it.kind == mk::nil) {
    out.reset();
    return {};
  }
  if (it.kind != mk::uint && it.kind != mk::sint) return wrong_kind(where, "int or nil", it);
  int64_t v = 0;
  if (auto e = as_int64(it, where, v); !e) return e;
  out = v;
  return {};
}

inline status as_str(const item& it, const std::string& where, std::string& out, size_t* code_points = nullptr) {
  if (it.kind != mk::str) return wrong_kind(where, "str", it);
  if (!valid_utf8(it.ptr, it.len, code_points)) return fail(where, "str is not valid UTF-8");
  out.assign(reinterpret_cast<const char*>(it.ptr), it.len);
  return {};
}

inline status read_str(cursor& c, const std::string& where, std::string& out, size_t* code_points = nullptr) {
  item it;
  if (auto e = read_item(c, where, it); !e) return e;
  return as_str(it, where, out, code_points);
}

inline status read_bin(cursor& c, const std::string& where, std::string& out) {
  item it;
  if (auto e = read_item(c, where, it); !e) return e;
  if (it.kind != mk::bin) return wrong_kind(where, "bin", it);
  out.assign(reinterpret_cast<const char*>(it.ptr), it.len);
  return {};
}

inline status read_opt_bin(cursor& c, const std::string& where, std::optional<std::string>& out) {
  item it;
  if (auto e = read_item(c, where, it); !e) return e;
  if (it.kind == mk::nil) {
    out.reset();
    return {};
  }
  if (it.kind != mk::bin) return wrong_kind(where, "bin or nil", it);
  out.emplace(reinterpret_cast<const char*>(it.ptr), it.len);
  return {};
}

inline status read_bool(cursor& c, const std::string& where, bool& out) {
  item it;
  if (auto e = read_item(c, where, it); !e) return e;
  if (it.kind != mk::boolean) return wrong_kind(where, "bool", it);
  out = it.u != 0;
  return {};
}

inline status read_header(cursor& c, const std::string& where, mk kind, uint32_t& count) {
  item it;
  if (auto e = read_item(c, where, it); !e) return e;
  if (it.kind != kind) return wrong_kind(where, mk_name(kind), it);
  count = it.len;
  return {};
}

inline std::string at_index(const std::string& where, size_t k) { return where + "[" + std::to_string(k) + "]"; }
inline std::string at_field(const std::string& where, std::string_view f) {
  return where + ": field '" + std::string(f) + "'";
}

/// Element k of an int array. The place "where[k]" is only spelled out when
/// the element is bad: building it for every token made lookups 10x slower.
inline status read_int_at(cursor& c, const std::string& where, size_t k, int64_t& v, bool nonneg = false) {
  static const std::string unnamed;
  cursor before = c;
  auto e = nonneg ? read_nonneg(c, unnamed, v) : read_int(c, unnamed, v);
  if (e) return e;
  c = before;
  return nonneg ? read_nonneg(c, at_index(where, k), v) : read_int(c, at_index(where, k), v);
}

inline status read_int_array(cursor& c, const std::string& where, std::vector<int64_t>& out, bool nonneg = false) {
  uint32_t n = 0;
  if (auto e = read_header(c, where, mk::array, n); !e) return e;
  out.clear();
  out.reserve(std::min<uint32_t>(n, k_reserve_cap));
  for (uint32_t k = 0; k < n; ++k) {
    int64_t v = 0;
    if (auto e = read_int_at(c, where, k, v, nonneg); !e) return e;
    out.push_back(v);
  }
  return {};
}

/// Iterates a msgpack map whose keys must be str (msgspec rejects others for
/// dataclasses, Structs and TypedDicts). `on_field(name, cursor)` consumes the
/// value of a field it knows and returns false for unknown ones, which are
/// skipped (or refused when `forbid_unknown`).
template <class F>
inline status read_fields(cursor& c, const std::string& where, bool forbid_unknown, F&& on_field) {
  uint32_t n = 0;
  if (auto e = read_header(c, where, mk::map, n); !e) return e;
  for (uint32_t k = 0; k < n; ++k) {
    item key;
    if (auto e = read_item(c, where, key); !e) return e;
    if (key.kind != mk::str) return fail(where, std::string("map key must be str, got ") + mk_name(key.kind));
    std::string_view name(reinterpret_cast<const char*>(key.ptr), key.len);
    bool known = false;
    if (auto e = on_field(name, known); !e) return e;
    if (!known) {
      if (forbid_unknown) return fail(where, "unknown field '" + std::string(name.substr(0, 64)) + "'");
      if (const char* e = c.skip()) return fail(at_field(where, name), std::string("undecodable msgpack (") + e + ")");
    }
  }
  return {};
}

/// Required-field bookkeeping for map-encoded records.
struct required {
  std::vector<std::pair<const char*, bool>> fields;
  void seen(std::string_view f) {
    for (auto& r : fields)
      if (f == r.first) r.second = true;
  }
  status check(const std::string& where, const char* type_name) const {
    for (const auto& r : fields)
      if (!r.second) return fail(where, std::string(type_name) + " missing required field '" + r.first + "'");
    return {};
  }
};


/// A failed read as the decoder's error of `kind`.
inline error to_wire(const error& e, const char* kind) { return error{kind, e.detail}; }

} // namespace kvs::lmcache_wire
