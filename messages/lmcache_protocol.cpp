// LMCache MP request decoding and response encoding (see lmcache_protocol.hpp).
//
// Decoding reads msgpack with a small bounds-checked cursor: no intermediate
// object tree, no allocation sized by an untrusted count (a count is checked
// against the bytes left before anything is reserved), no recursion deeper
// than the fixed shapes LMCache sends (the one free-form value,
// request_configs, is skipped iteratively and kept raw). Type rules follow
// msgspec's strict decoding, which is what LMCache's own server applies
// (transport/zmq_impl/mq.py msgspec_decode), so whatever LMCache would reject
// is rejected here with the place named.
#include "messages/lmcache_protocol.hpp"
#include "messages/utf8.hpp"

#include "messages/pickle_reader.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <utility>

namespace kvs {
namespace {

// ---------------------------------------------------------------------------
// msgpack cursor
// ---------------------------------------------------------------------------

enum class mk : uint8_t { nil, boolean, uint, sint, float32, float64, str, bin, array, map, ext };

const char* mk_name(mk k) {
  switch (k) {
    case mk::nil: return "nil";
    case mk::boolean: return "bool";
    case mk::uint:
    case mk::sint: return "int";
    case mk::float32:
    case mk::float64: return "float";
    case mk::str: return "str";
    case mk::bin: return "bin";
    case mk::array: return "array";
    case mk::map: return "map";
    case mk::ext: return "ext";
  }
  return "?";
}

/// One msgpack header. Non-negative integers are always `uint` (msgpack's
/// signed formats may hold them); only negative ones are `sint`.
struct item {
  mk kind = mk::nil;
  uint64_t u = 0;               ///< uint value; bool value
  int64_t i = 0;                ///< sint value (< 0)
  double f = 0.0;
  const uint8_t* ptr = nullptr; ///< str / bin / ext payload
  uint32_t len = 0;             ///< payload bytes; array / map element count
  int8_t ext_type = 0;
};

uint64_t load_be(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t k = 0; k < n; ++k) v = (v << 8) | p[k];
  return v;
}


class cursor {
public:
  explicit cursor(std::string_view b)
      : p_(reinterpret_cast<const uint8_t*>(b.data())), end_(p_ + b.size()) {}

  bool at_end() const { return p_ == end_; }
  size_t left() const { return static_cast<size_t>(end_ - p_); }
  const uint8_t* pos() const { return p_; }

  /// Reads one header (and steps over a str/bin/ext payload). On failure
  /// returns the reason and leaves the cursor unusable.
  const char* next(item& it) {
    if (p_ >= end_) return "truncated";
    uint8_t c = *p_++;
    it = item{};
    if (c <= 0x7f) return set_uint(it, c);
    if (c >= 0xe0) {
      it.kind = mk::sint;
      it.i = static_cast<int8_t>(c);
      return nullptr;
    }
    if ((c & 0xf0) == 0x80) return set_count(it, mk::map, c & 0x0fu);
    if ((c & 0xf0) == 0x90) return set_count(it, mk::array, c & 0x0fu);
    if ((c & 0xe0) == 0xa0) return payload(it, mk::str, c & 0x1fu);
    switch (c) {
      case 0xc0: it.kind = mk::nil; return nullptr;
      case 0xc2:
      case 0xc3: it.kind = mk::boolean; it.u = c == 0xc3; return nullptr;
      case 0xc4: return sized(it, mk::bin, 1);
      case 0xc5: return sized(it, mk::bin, 2);
      case 0xc6: return sized(it, mk::bin, 4);
      case 0xc7: return ext_sized(it, 1);
      case 0xc8: return ext_sized(it, 2);
      case 0xc9: return ext_sized(it, 4);
      case 0xca: {
        uint64_t raw = 0;
        if (!fixed(4, raw)) return "truncated";
        float f;
        auto r32 = static_cast<uint32_t>(raw);
        std::memcpy(&f, &r32, sizeof f);
        it.kind = mk::float32;
        it.f = f;
        return nullptr;
      }
      case 0xcb: {
        uint64_t raw = 0;
        if (!fixed(8, raw)) return "truncated";
        it.kind = mk::float64;
        std::memcpy(&it.f, &raw, sizeof it.f);
        return nullptr;
      }
      case 0xcc: return uint_n(it, 1);
      case 0xcd: return uint_n(it, 2);
      case 0xce: return uint_n(it, 4);
      case 0xcf: return uint_n(it, 8);
      case 0xd0: return sint_n(it, 1);
      case 0xd1: return sint_n(it, 2);
      case 0xd2: return sint_n(it, 4);
      case 0xd3: return sint_n(it, 8);
      case 0xd4: return ext_fixed(it, 1);
      case 0xd5: return ext_fixed(it, 2);
      case 0xd6: return ext_fixed(it, 4);
      case 0xd7: return ext_fixed(it, 8);
      case 0xd8: return ext_fixed(it, 16);
      case 0xd9: return sized(it, mk::str, 1);
      case 0xda: return sized(it, mk::str, 2);
      case 0xdb: return sized(it, mk::str, 4);
      case 0xdc: return counted(it, mk::array, 2);
      case 0xdd: return counted(it, mk::array, 4);
      case 0xde: return counted(it, mk::map, 2);
      case 0xdf: return counted(it, mk::map, 4);
      default: return "invalid byte 0xc1";
    }
  }

  /// Steps over one whole value without recursion.
  const char* skip() {
    uint64_t pending = 1;
    item it;
    while (pending > 0) {
      --pending;
      if (const char* e = next(it)) return e;
      if (it.kind == mk::array) pending += it.len;
      if (it.kind == mk::map) pending += uint64_t{it.len} * 2;
    }
    return nullptr;
  }

private:
  const uint8_t* p_;
  const uint8_t* end_;

  bool fixed(size_t n, uint64_t& v) {
    if (left() < n) return false;
    v = load_be(p_, n);
    p_ += n;
    return true;
  }
  const char* set_uint(item& it, uint64_t v) {
    it.kind = mk::uint;
    it.u = v;
    return nullptr;
  }
  const char* uint_n(item& it, size_t n) {
    uint64_t v = 0;
    if (!fixed(n, v)) return "truncated";
    return set_uint(it, v);
  }
  const char* sint_n(item& it, size_t n) {
    uint64_t v = 0;
    if (!fixed(n, v)) return "truncated";
    int64_t s;
    switch (n) {
      case 1: s = static_cast<int8_t>(v); break;
      case 2: s = static_cast<int16_t>(v); break;
      case 4: s = static_cast<int32_t>(v); break;
      default: s = static_cast<int64_t>(v); break;
    }
    if (s >= 0) return set_uint(it, static_cast<uint64_t>(s));
    it.kind = mk::sint;
    it.i = s;
    return nullptr;
  }
  const char* payload(item& it, mk kind, uint64_t n) {
    if (left() < n) return "truncated";
    it.kind = kind;
    it.ptr = p_;
    it.len = static_cast<uint32_t>(n);
    p_ += n;
    return nullptr;
  }
  const char* sized(item& it, mk kind, size_t width) {
    uint64_t n = 0;
    if (!fixed(width, n)) return "truncated";
    return payload(it, kind, n);
  }
  const char* set_count(item& it, mk kind, uint64_t n) {
    // Every element takes at least one byte: a count beyond the bytes left
    // is a lie, refused before anyone sizes a container by it.
    if (n > left() || (kind == mk::map && n * 2 > left())) return "truncated";
    it.kind = kind;
    it.len = static_cast<uint32_t>(n);
    return nullptr;
  }
  const char* counted(item& it, mk kind, size_t width) {
    uint64_t n = 0;
    if (!fixed(width, n)) return "truncated";
    return set_count(it, kind, n);
  }
  const char* ext_fixed(item& it, uint64_t n) {
    uint64_t t = 0;
    if (!fixed(1, t)) return "truncated";
    if (const char* e = payload(it, mk::ext, n)) return e;
    it.ext_type = static_cast<int8_t>(static_cast<uint8_t>(t));
    return nullptr;
  }
  const char* ext_sized(item& it, size_t width) {
    uint64_t n = 0, t = 0;
    if (!fixed(width, n) || !fixed(1, t)) return "truncated";
    if (const char* e = payload(it, mk::ext, n)) return e;
    it.ext_type = static_cast<int8_t>(static_cast<uint8_t>(t));
    return nullptr;
  }
};

// ---------------------------------------------------------------------------
// Typed reads. Each takes the place ("arg 0 'key': field 'start'") for errors.
// ---------------------------------------------------------------------------

/// Containers are reserved up to this many elements from a (checked) count;
/// past it they grow as elements actually decode, so a frame of one-byte
/// elements cannot make us allocate many times its size up front.
constexpr uint32_t k_reserve_cap = 65536;

struct decode_error {
  std::string where;
  std::string what;
};
using derr = std::optional<decode_error>;

derr fail(const std::string& where, std::string what) { return decode_error{where, std::move(what)}; }
derr expected(const std::string& where, const char* want, const item& got) {
  return fail(where, std::string("expected ") + want + ", got " + mk_name(got.kind));
}

derr read_item(cursor& c, const std::string& where, item& it) {
  if (const char* e = c.next(it)) return fail(where, std::string("undecodable msgpack (") + e + ")");
  return std::nullopt;
}

derr as_int64(const item& it, const std::string& where, int64_t& out) {
  if (it.kind == mk::uint) {
    if (it.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return fail(where, "int " + std::to_string(it.u) + " out of int64 range");
    out = static_cast<int64_t>(it.u);
    return std::nullopt;
  }
  if (it.kind == mk::sint) {
    out = it.i;
    return std::nullopt;
  }
  return expected(where, "int", it);
}

derr read_int(cursor& c, const std::string& where, int64_t& out) {
  item it;
  if (auto e = read_item(c, where, it)) return e;
  return as_int64(it, where, out);
}

derr read_nonneg(cursor& c, const std::string& where, int64_t& out) {
  if (auto e = read_int(c, where, out)) return e;
  if (out < 0) return fail(where, "expected int >= 0, got " + std::to_string(out));
  return std::nullopt;
}

derr read_opt_int(cursor& c, const std::string& where, std::optional<int64_t>& out) {
  item it;
  if (auto e = read_item(c, where, it)) return e;
  if (it.kind == mk::nil) {
    out.reset();
    return std::nullopt;
  }
  if (it.kind != mk::uint && it.kind != mk::sint) return expected(where, "int or nil", it);
  int64_t v = 0;
  if (auto e = as_int64(it, where, v)) return e;
  out = v;
  return std::nullopt;
}

derr as_str(const item& it, const std::string& where, std::string& out, size_t* code_points = nullptr) {
  if (it.kind != mk::str) return expected(where, "str", it);
  if (!valid_utf8(it.ptr, it.len, code_points)) return fail(where, "str is not valid UTF-8");
  out.assign(reinterpret_cast<const char*>(it.ptr), it.len);
  return std::nullopt;
}

derr read_str(cursor& c, const std::string& where, std::string& out, size_t* code_points = nullptr) {
  item it;
  if (auto e = read_item(c, where, it)) return e;
  return as_str(it, where, out, code_points);
}

derr read_bin(cursor& c, const std::string& where, std::string& out) {
  item it;
  if (auto e = read_item(c, where, it)) return e;
  if (it.kind != mk::bin) return expected(where, "bin", it);
  out.assign(reinterpret_cast<const char*>(it.ptr), it.len);
  return std::nullopt;
}

derr read_opt_bin(cursor& c, const std::string& where, std::optional<std::string>& out) {
  item it;
  if (auto e = read_item(c, where, it)) return e;
  if (it.kind == mk::nil) {
    out.reset();
    return std::nullopt;
  }
  if (it.kind != mk::bin) return expected(where, "bin or nil", it);
  out.emplace(reinterpret_cast<const char*>(it.ptr), it.len);
  return std::nullopt;
}

derr read_bool(cursor& c, const std::string& where, bool& out) {
  item it;
  if (auto e = read_item(c, where, it)) return e;
  if (it.kind != mk::boolean) return expected(where, "bool", it);
  out = it.u != 0;
  return std::nullopt;
}

derr read_header(cursor& c, const std::string& where, mk kind, uint32_t& count) {
  item it;
  if (auto e = read_item(c, where, it)) return e;
  if (it.kind != kind) return expected(where, mk_name(kind), it);
  count = it.len;
  return std::nullopt;
}

std::string at_index(const std::string& where, size_t k) { return where + "[" + std::to_string(k) + "]"; }
std::string at_field(const std::string& where, std::string_view f) {
  return where + ": field '" + std::string(f) + "'";
}

/// Element k of an int array. The place "where[k]" is only spelled out when
/// the element is bad: building it for every token made lookups 10x slower.
derr read_int_at(cursor& c, const std::string& where, size_t k, int64_t& v, bool nonneg = false) {
  static const std::string unnamed;
  cursor before = c;
  auto e = nonneg ? read_nonneg(c, unnamed, v) : read_int(c, unnamed, v);
  if (!e) return e;
  c = before;
  return nonneg ? read_nonneg(c, at_index(where, k), v) : read_int(c, at_index(where, k), v);
}

derr read_int_array(cursor& c, const std::string& where, std::vector<int64_t>& out, bool nonneg = false) {
  uint32_t n = 0;
  if (auto e = read_header(c, where, mk::array, n)) return e;
  out.clear();
  out.reserve(std::min<uint32_t>(n, k_reserve_cap));
  for (uint32_t k = 0; k < n; ++k) {
    int64_t v = 0;
    if (auto e = read_int_at(c, where, k, v, nonneg)) return e;
    out.push_back(v);
  }
  return std::nullopt;
}

/// Iterates a msgpack map whose keys must be str (msgspec rejects others for
/// dataclasses, Structs and TypedDicts). `on_field(name, cursor)` consumes the
/// value of a field it knows and returns false for unknown ones, which are
/// skipped (or refused when `forbid_unknown`).
template <class F>
derr read_fields(cursor& c, const std::string& where, bool forbid_unknown, F&& on_field) {
  uint32_t n = 0;
  if (auto e = read_header(c, where, mk::map, n)) return e;
  for (uint32_t k = 0; k < n; ++k) {
    item key;
    if (auto e = read_item(c, where, key)) return e;
    if (key.kind != mk::str) return fail(where, std::string("map key must be str, got ") + mk_name(key.kind));
    std::string_view name(reinterpret_cast<const char*>(key.ptr), key.len);
    bool known = false;
    if (auto e = on_field(name, known)) return e;
    if (!known) {
      if (forbid_unknown) return fail(where, "unknown field '" + std::string(name.substr(0, 64)) + "'");
      if (const char* e = c.skip()) return fail(at_field(where, name), std::string("undecodable msgpack (") + e + ")");
    }
  }
  return std::nullopt;
}

/// Required-field bookkeeping for map-encoded records.
struct required {
  std::vector<std::pair<const char*, bool>> fields;
  void seen(std::string_view f) {
    for (auto& r : fields)
      if (f == r.first) r.second = true;
  }
  derr check(const std::string& where, const char* type_name) const {
    for (const auto& r : fields)
      if (!r.second) return fail(where, std::string(type_name) + " missing required field '" + r.first + "'");
    return std::nullopt;
  }
};

// ---------------------------------------------------------------------------
// Records
// ---------------------------------------------------------------------------

derr read_cache_key(cursor& c, const std::string& where, cache_key& k) {
  required req{{{"model_name", false}, {"world_size", false}, {"worker_id", false}, {"token_ids", false},
                {"start", false}, {"end", false}, {"request_id", false}}};
  auto e = read_fields(c, where, false, [&](std::string_view f, bool& known) -> derr {
    known = true;
    req.seen(f);
    std::string w = at_field(where, f);
    if (f == "model_name") return read_str(c, w, k.model_name);
    if (f == "world_size") return read_int(c, w, k.world_size);
    if (f == "worker_id") return read_opt_int(c, w, k.worker_id);
    if (f == "start") return read_int(c, w, k.start);
    if (f == "end") return read_int(c, w, k.end);
    if (f == "request_id") return read_str(c, w, k.request_id);
    if (f == "num_kv_readers") return read_int(c, w, k.num_kv_readers);
    if (f == "token_ids") {
      uint32_t n = 0;
      if (auto r = read_header(c, w, mk::array, n)) return r;
      k.token_ids.clear();
      k.token_ids.reserve(std::min<uint32_t>(n, k_reserve_cap));
      for (uint32_t t = 0; t < n; ++t) {
        int64_t v = 0;
        if (auto r = read_int_at(c, w, t, v)) return r;
        if (v < 0 || v > int64_t{std::numeric_limits<uint32_t>::max()})
          return fail(at_index(w, t), "token id " + std::to_string(v) + " outside uint32");
        k.token_ids.push_back(static_cast<uint32_t>(v));
      }
      return std::nullopt;
    }
    if (f == "cache_salt") {
      size_t cps = 0;
      if (auto r = read_str(c, w, k.cache_salt, &cps)) return r;
      // IPCCacheServerKey.__post_init__ (custom_types.py): isolation salts
      // end up in object names, so these characters and lengths are refused.
      if (k.cache_salt.find_first_of(std::string("@/\\\0", 4)) != std::string::npos)
        return fail(w, "cache_salt must not contain '@', '/', '\\' or NUL");
      if (cps > 128) return fail(w, "cache_salt longer than 128 characters");
      return std::nullopt;
    }
    if (f == "request_configs") {
      // dict[str, Any] | None: checked to be a str-keyed map, kept raw.
      const uint8_t* begin = c.pos();
      item it;
      if (auto r = read_item(c, w, it)) return r;
      if (it.kind == mk::nil) {
        k.request_configs_msgpack.clear();
        return std::nullopt;
      }
      if (it.kind != mk::map) return expected(w, "map or nil", it);
      for (uint32_t m = 0; m < it.len; ++m) {
        item key;
        if (auto r = read_item(c, w, key)) return r;
        if (key.kind != mk::str) return fail(w, std::string("map key must be str, got ") + mk_name(key.kind));
        if (const char* s = c.skip()) return fail(w, std::string("undecodable msgpack (") + s + ")");
      }
      k.request_configs_msgpack.assign(reinterpret_cast<const char*>(begin), static_cast<size_t>(c.pos() - begin));
      return std::nullopt;
    }
    known = false;
    return std::nullopt;
  });
  if (e) return e;
  return req.check(where, "IPCCacheServerKey");
}

derr read_layout_hints(cursor& c, const std::string& where, layout_hints& h) {
  return read_fields(c, where, false, [&](std::string_view f, bool& known) -> derr {
    known = true;
    std::string w = at_field(where, f);
    auto literal = [&](std::optional<std::string>& out, std::initializer_list<const char*> allowed) -> derr {
      std::string s;
      if (auto r = read_str(c, w, s)) return r;
      for (const char* a : allowed)
        if (s == a) {
          out = std::move(s);
          return std::nullopt;
        }
      return fail(w, "invalid value '" + s.substr(0, 32) + "'");
    };
    auto integer = [&](std::optional<int64_t>& out) -> derr {
      int64_t v = 0;
      if (auto r = read_int(c, w, v)) return r;
      out = v;
      return std::nullopt;
    };
    if (f == "kv_layout") return literal(h.kv_layout, {"NHD", "HND", "BLHNC", "BLNHC"});
    if (f == "kv_list_layout") return literal(h.kv_list_layout, {"k_v", "unified"});
    if (f == "num_kv_heads") return integer(h.num_kv_heads);
    if (f == "tokens_per_block") return integer(h.tokens_per_block);
    if (f == "head_dim") return integer(h.head_dim);
    known = false;
    return std::nullopt;
  });
}

derr read_group(cursor& c, const std::string& where, engine_group_info& g) {
  required req{{{"engine_group_id", false}}};
  auto e = read_fields(c, where, false, [&](std::string_view f, bool& known) -> derr {
    known = true;
    req.seen(f);
    std::string w = at_field(where, f);
    if (f == "engine_group_id") return read_int(c, w, g.engine_group_id);
    if (f == "layer_indices") return read_int_array(c, w, g.layer_indices);
    if (f == "tokens_per_block") return read_int(c, w, g.tokens_per_block);
    if (f == "sw_size_tokens") return read_int(c, w, g.sw_size_tokens);
    if (f == "extra_object_group_tag") return read_int(c, w, g.extra_object_group_tag);
    if (f == "recurrent_state") return read_bool(c, w, g.recurrent_state);
    known = false;
    return std::nullopt;
  });
  if (e) return e;
  return req.check(where, "EngineGroupInfo");
}

derr read_block_ids(cursor& c, const std::string& where, std::vector<std::vector<int64_t>>& out) {
  uint32_t n = 0;
  if (auto e = read_header(c, where, mk::array, n)) return e;
  out.clear();
  for (uint32_t g = 0; g < n; ++g) {
    out.emplace_back();
    if (auto e = read_int_array(c, at_index(where, g), out.back())) return e;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// KV-cache wrappers
// ---------------------------------------------------------------------------

/// TensorMetadata (ipc_wire.py): every field required, unknown ones refused.
derr read_tensor_metadata(cursor& c, const std::string& where, tensor_desc& out) {
  required req{{{"dtype", false}, {"shape", false}, {"stride", false}, {"storage_offset", false}, {"device_uuid", false}}};
  std::string dtype;
  std::vector<int64_t> shape, stride;
  int64_t storage_offset = 0;
  auto e = read_fields(c, where, true, [&](std::string_view f, bool& known) -> derr {
    known = true;
    req.seen(f);
    std::string w = at_field(where, f);
    if (f == "dtype") return read_str(c, w, dtype);
    if (f == "shape") return read_int_array(c, w, shape, true);
    if (f == "stride") return read_int_array(c, w, stride, true);
    if (f == "storage_offset") return read_nonneg(c, w, storage_offset);
    if (f == "device_uuid") return read_str(c, w, out.device_uuid);
    known = false;
    return std::nullopt;
  });
  if (e) return e;
  if (auto r = req.check(where, "TensorMetadata")) return r;
  // Stash for apply_tensor_view once the storage size is known.
  out.dtype = std::move(dtype);
  out.shape = std::move(shape);
  out.stride = std::move(stride);
  out.storage_offset = storage_offset;
  return std::nullopt;
}

derr read_torch_share(cursor& c, const std::string& where, torch_cuda_share& s) {
  uint32_t n = 0;
  if (auto e = read_header(c, where, mk::array, n)) return e;
  if (n != 8) return fail(where, "expected the 8-element storage._share_cuda_() tuple, got " + std::to_string(n));
  if (auto e = read_int(c, at_index(where, 0), s.device)) return e;
  if (auto e = read_opt_bin(c, at_index(where, 1), s.mem_handle)) return e;
  if (auto e = read_nonneg(c, at_index(where, 2), s.storage_size_bytes)) return e;
  if (auto e = read_nonneg(c, at_index(where, 3), s.storage_offset_bytes)) return e;
  if (auto e = read_opt_bin(c, at_index(where, 4), s.ref_counter_handle)) return e;
  if (auto e = read_nonneg(c, at_index(where, 5), s.ref_counter_offset)) return e;
  if (auto e = read_opt_bin(c, at_index(where, 6), s.event_handle)) return e;
  return read_bool(c, at_index(where, 7), s.event_sync_required);
}

wire_error to_wire(const decode_error& e, const char* kind) {
  return wire_error{kind, e.where.empty() ? e.what : e.where + ": " + e.what};
}

/// Finishes a descriptor: the view check, with LMCache's error text kind.
std::variant<tensor_desc, wire_error> finish_view(tensor_desc d, bool check_span) {
  std::string dtype = std::move(d.dtype);
  std::vector<int64_t> shape = std::move(d.shape), stride = std::move(d.stride);
  if (auto e = apply_tensor_view(std::move(dtype), std::move(shape), std::move(stride), d.storage_offset, d, check_span))
    return *e;
  return d;
}

/// LMCache 0.5.6 data-only descriptor (ipc_wire.py WireIPCData): a msgspec
/// tagged union, tag field "type", unknown fields refused.
std::variant<tensor_desc, wire_error> decode_ipc_descriptor(std::string_view payload) {
  const std::string where = "descriptor";
  // Pass 1: the tag, wherever it sits in the map (msgspec accepts any order).
  std::string tag;
  {
    cursor c(payload);
    auto e = read_fields(c, where, false, [&](std::string_view f, bool& known) -> derr {
      known = f == "type";
      return known ? read_str(c, at_field(where, f), tag) : std::nullopt;
    });
    if (e) return to_wire(*e, "bad_wrapper");
    if (!c.at_end()) return wire_error{"bad_wrapper", "descriptor: trailing bytes"};
  }
  if (tag.empty()) return wire_error{"bad_wrapper", "descriptor: missing tag field 'type'"};
  if (tag == "cuda_vmm" || tag == "musa" || tag == "npu")
    return wire_error{"unsupported_wrapper", "descriptor type '" + tag + "' is not supported (CUDA IPC and cpu_shm only)"};
  if (tag != "cuda" && tag != "cuda_raw" && tag != "cpu_shm")
    return wire_error{"bad_wrapper", "descriptor: unknown type '" + tag.substr(0, 32) + "'"};

  // Pass 2: the fields of that variant.
  tensor_desc d;
  torch_cuda_share share;
  int64_t version = 0, alloc_offset = 0, nbytes = 0;
  std::string raw_handle;
  required req{{{"version", false}, {"metadata", false}}};
  if (tag == "cuda") req.fields.push_back({"handle", false});
  if (tag == "cuda_raw") req.fields.insert(req.fields.end(), {{"ipc_handle", false}, {"alloc_offset", false}, {"nbytes", false}});
  if (tag == "cpu_shm") req.fields.insert(req.fields.end(), {{"shm_name", false}, {"nbytes", false}});
  cursor c(payload);
  auto e = read_fields(c, where, true, [&](std::string_view f, bool& known) -> derr {
    known = true;
    req.seen(f);
    std::string w = at_field(where, f);
    if (f == "type") {
      std::string ignored;
      return read_str(c, w, ignored);
    }
    if (f == "version") return read_int(c, w, version);
    if (f == "metadata") return read_tensor_metadata(c, w, d);
    if (tag == "cuda" && f == "handle") return read_torch_share(c, w, share);
    if (tag == "cuda_raw" && f == "ipc_handle") return read_bin(c, w, raw_handle);
    if (tag == "cuda_raw" && f == "alloc_offset") return read_nonneg(c, w, alloc_offset);
    if ((tag == "cuda_raw" || tag == "cpu_shm") && f == "nbytes") return read_nonneg(c, w, nbytes);
    if (tag == "cpu_shm" && f == "shm_name") return read_str(c, w, d.shm_name);
    known = false;
    return std::nullopt;
  });
  if (e) return to_wire(*e, "bad_wrapper");
  if (auto r = req.check(where + " '" + tag + "'", "descriptor")) return to_wire(*r, "bad_wrapper");
  if (version != 1) return wire_error{"bad_wrapper", "descriptor: version " + std::to_string(version) + " (expected 1)"};

  if (tag == "cuda") {
    if (auto r = apply_torch_cuda_share(share, d)) return *r;
  } else if (tag == "cuda_raw") {
    if (raw_handle.size() != 64)
      return wire_error{"bad_wrapper", "descriptor: field 'ipc_handle': expected 64 bytes, got " + std::to_string(raw_handle.size())};
    d.kind = tensor_desc::memory_kind::cuda_ipc;
    d.ipc_mem_handle = std::move(raw_handle);
    d.storage_offset_bytes = static_cast<uint64_t>(alloc_offset);
    d.storage_size_bytes = static_cast<uint64_t>(nbytes);
  } else {
    d.kind = tensor_desc::memory_kind::host_shm;
    d.shm_offset_bytes = 0;
    d.storage_size_bytes = static_cast<uint64_t>(nbytes);
  }
  return finish_view(std::move(d), true);
}

/// kvsidecar's host shared-memory extension (kvs_host_shm_ext).
std::variant<tensor_desc, wire_error> decode_host_shm_ext(std::string_view payload) {
  const std::string where = "host_shm";
  tensor_desc d;
  d.kind = tensor_desc::memory_kind::host_shm;
  int64_t offset = 0, storage_offset = 0;
  std::optional<int64_t> nbytes;
  required req{{{"shm_name", false}, {"dtype", false}, {"shape", false}, {"stride", false}}};
  cursor c(payload);
  auto e = read_fields(c, where, true, [&](std::string_view f, bool& known) -> derr {
    known = true;
    req.seen(f);
    std::string w = at_field(where, f);
    if (f == "shm_name") return read_str(c, w, d.shm_name);
    if (f == "offset") return read_nonneg(c, w, offset);
    if (f == "dtype") return read_str(c, w, d.dtype);
    if (f == "shape") return read_int_array(c, w, d.shape, true);
    if (f == "stride") return read_int_array(c, w, d.stride, true);
    if (f == "storage_offset") return read_nonneg(c, w, storage_offset);
    if (f == "nbytes") {
      int64_t v = 0;
      if (auto r = read_nonneg(c, w, v)) return r;
      nbytes = v;
      return std::nullopt;
    }
    known = false;
    return std::nullopt;
  });
  if (e) return to_wire(*e, "bad_wrapper");
  if (!c.at_end()) return wire_error{"bad_wrapper", "host_shm: trailing bytes"};
  if (auto r = req.check(where, "host_shm")) return to_wire(*r, "bad_wrapper");
  if (d.shm_name.empty()) return wire_error{"bad_wrapper", "host_shm: empty shm_name"};
  d.shm_offset_bytes = static_cast<uint64_t>(offset);
  d.storage_offset = storage_offset;
  d.storage_size_bytes = nbytes ? static_cast<uint64_t>(*nbytes) : 0;
  return finish_view(std::move(d), nbytes.has_value());
}

// ---------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------

struct op_info {
  mp_op op;
  const char* name;
  uint8_t min_args;
  uint8_t max_args;
  const char* arg_names[7];
};

constexpr op_info k_ops[] = {
    {mp_op::register_kv_cache, "register_kv_cache", 7, 7,
     {"instance_id", "kv_cache", "model_name", "world_size", "engine_type", "layout_hints", "engine_group_infos"}},
    {mp_op::unregister_kv_cache, "unregister_kv_cache", 1, 1, {"instance_id"}},
    {mp_op::store, "store", 4, 4, {"key", "instance_id", "block_ids", "event_ipc_handle"}},
    {mp_op::retrieve, "retrieve", 5, 5, {"key", "instance_id", "block_ids", "event_ipc_handle", "skip_first_n_tokens"}},
    {mp_op::lookup, "lookup", 2, 2, {"key", "tp_size"}},
    {mp_op::query_prefetch_status, "query_prefetch_status", 1, 1, {"request_id"}},
    {mp_op::wait_prefetch_status, "wait_prefetch_status", 2, 2, {"request_id", "timeout"}},
    {mp_op::query_prefetch_lookup_hits, "query_prefetch_lookup_hits", 1, 1, {"request_id"}},
    {mp_op::free_lookup_locks, "free_lookup_locks", 2, 2, {"key", "tp_size"}},
    {mp_op::end_session, "end_session", 1, 1, {"request_id"}},
    {mp_op::clear, "clear", 0, 1, {"force"}},
    {mp_op::get_chunk_size, "get_chunk_size", 0, 0, {}},
    {mp_op::ping, "ping", 1, 1, {"instance_id"}},
    {mp_op::noop, "noop", 0, 0, {}},
    {mp_op::get_experimental, "get_experimental", 0, 0, {}},
};

/// LMCache 0.5.6 operations kvsidecar does not serve, with their legacy ids
/// (0 = routed by name only). Named in errors so logs say what was asked.
struct foreign_op {
  int id;
  const char* name;
};
constexpr foreign_op k_foreign_ops[] = {
    {3, "register_q_cache"},
    {4, "unregister_q_cache"},
    {5, "store_q"},
    {14, "register_kv_cache_engine_driven_context"},
    {15, "unregister_kv_cache_engine_driven_context"},
    {16, "prepare_store"},
    {17, "commit_store"},
    {18, "prepare_retrieve"},
    {19, "commit_retrieve"},
    {23, "report_block_allocation"},
    {25, "cb_register_rope"},
    {26, "cb_unregister_rope"},
    {27, "cb_retrieve_pre_computed"},
    {28, "cb_unified_lookup"},
    {29, "p2p_lookup_and_lock"},
    {30, "p2p_query_lookup_results"},
    {31, "p2p_unlock_objects"},
    {33, "cb_protocol_handshake"},
    {0, "cb_reorder_plan"},
    {0, "subscribe_kv_events"},
    {0, "server_module_call"},
};

const op_info* find_op(mp_op op) {
  for (const auto& o : k_ops)
    if (o.op == op) return &o;
  return nullptr;
}

wire_error bad_arg(const decode_error& e) { return wire_error{"bad_arg", e.where + ": " + e.what}; }

/// Decodes one whole argument frame with `fn`, refusing trailing bytes.
template <class F>
derr arg_frame(std::string_view frame, const std::string& where, F&& fn) {
  cursor c(frame);
  if (auto e = fn(c, where)) return e;
  if (!c.at_end()) return fail(where, std::to_string(c.left()) + " trailing bytes after the value");
  return std::nullopt;
}

derr read_engine_type(cursor& c, const std::string& where, engine_type& out) {
  std::string s;
  if (auto e = read_str(c, where, s)) return e;
  static constexpr std::pair<const char*, engine_type> k_types[] = {
      {"vllm", engine_type::vllm}, {"atom", engine_type::atom}, {"sglang", engine_type::sglang},
      {"trtllm", engine_type::trtllm}, {"mock", engine_type::mock}};
  for (const auto& t : k_types)
    if (s == t.first) {
      out = t.second;
      return std::nullopt;
    }
  return fail(where, "invalid EngineType '" + s.substr(0, 32) + "'");
}

derr read_kv_caches(cursor& c, const std::string& where, std::vector<tensor_desc>& out) {
  uint32_t n = 0;
  if (auto e = read_header(c, where, mk::array, n)) return e;
  out.clear(); // no reserve: a tensor_desc is ~50x the byte an element may take
  for (uint32_t k = 0; k < n; ++k) {
    std::string w = at_index(where, k);
    item it;
    if (auto e = read_item(c, w, it)) return e;
    if (it.kind != mk::ext) return expected(w, "ext (a KV-cache wrapper)", it);
    auto r = decode_kv_cache_wrapper(it.ext_type, std::string_view(reinterpret_cast<const char*>(it.ptr), it.len));
    if (auto* err = std::get_if<wire_error>(&r)) return fail(w, err->kind + ": " + err->detail);
    out.push_back(std::move(std::get<tensor_desc>(r)));
  }
  return std::nullopt;
}

derr read_timeout(cursor& c, const std::string& where, double& out) {
  item it;
  if (auto e = read_item(c, where, it)) return e;
  if (it.kind == mk::float32 || it.kind == mk::float64)
    out = it.f;
  else if (it.kind == mk::uint)
    out = static_cast<double>(it.u);
  else if (it.kind == mk::sint)
    out = static_cast<double>(it.i);
  else
    return expected(where, "float", it);
  if (!std::isfinite(out) || out < 0) return fail(where, "timeout must be finite and >= 0");
  return std::nullopt;
}

/// Decodes the arguments of `op` into its request struct.
derr decode_body(const op_info& info, const std::vector<std::string_view>& args, mp_request_body& body) {
  auto where = [&](size_t k) {
    return "arg " + std::to_string(k) + " '" + info.arg_names[k] + "'";
  };
  auto arg = [&](size_t k, auto&& fn) { return arg_frame(args[k], where(k), fn); };
  auto key = [&](size_t k, cache_key& out) {
    return arg(k, [&](cursor& c, const std::string& w) { return read_cache_key(c, w, out); });
  };
  auto integer = [&](size_t k, int64_t& out) {
    return arg(k, [&](cursor& c, const std::string& w) { return read_int(c, w, out); });
  };
  auto string = [&](size_t k, std::string& out) {
    return arg(k, [&](cursor& c, const std::string& w) { return read_str(c, w, out); });
  };
  auto blocks = [&](size_t k, std::vector<std::vector<int64_t>>& out) {
    return arg(k, [&](cursor& c, const std::string& w) { return read_block_ids(c, w, out); });
  };
  auto binary = [&](size_t k, std::string& out) {
    return arg(k, [&](cursor& c, const std::string& w) { return read_bin(c, w, out); });
  };

  switch (info.op) {
    case mp_op::register_kv_cache: {
      register_kv_cache_req r;
      if (auto e = integer(0, r.instance_id)) return e;
      if (auto e = arg(1, [&](cursor& c, const std::string& w) { return read_kv_caches(c, w, r.kv_caches); })) return e;
      if (auto e = string(2, r.model_name)) return e;
      if (auto e = integer(3, r.world_size)) return e;
      if (auto e = arg(4, [&](cursor& c, const std::string& w) { return read_engine_type(c, w, r.engine); })) return e;
      if (auto e = arg(5, [&](cursor& c, const std::string& w) { return read_layout_hints(c, w, r.hints); })) return e;
      if (auto e = arg(6, [&](cursor& c, const std::string& w) -> derr {
            uint32_t n = 0;
            if (auto h = read_header(c, w, mk::array, n)) return h;
            for (uint32_t g = 0; g < n; ++g) {
              r.groups.emplace_back();
              if (auto x = read_group(c, at_index(w, g), r.groups.back())) return x;
            }
            return std::nullopt;
          }))
        return e;
      body = std::move(r);
      return std::nullopt;
    }
    case mp_op::unregister_kv_cache: {
      unregister_kv_cache_req r;
      if (auto e = integer(0, r.instance_id)) return e;
      body = r;
      return std::nullopt;
    }
    case mp_op::store: {
      store_req r;
      if (auto e = key(0, r.key)) return e;
      if (auto e = integer(1, r.instance_id)) return e;
      if (auto e = blocks(2, r.block_ids)) return e;
      if (auto e = binary(3, r.event_ipc_handle)) return e;
      body = std::move(r);
      return std::nullopt;
    }
    case mp_op::retrieve: {
      retrieve_req r;
      if (auto e = key(0, r.key)) return e;
      if (auto e = integer(1, r.instance_id)) return e;
      if (auto e = blocks(2, r.block_ids)) return e;
      if (auto e = binary(3, r.event_ipc_handle)) return e;
      if (auto e = integer(4, r.skip_first_n)) return e;
      body = std::move(r);
      return std::nullopt;
    }
    case mp_op::lookup: {
      lookup_req r;
      if (auto e = key(0, r.key)) return e;
      if (auto e = integer(1, r.tp_size)) return e;
      body = std::move(r);
      return std::nullopt;
    }
    case mp_op::free_lookup_locks: {
      free_lookup_locks_req r;
      if (auto e = key(0, r.key)) return e;
      if (auto e = integer(1, r.tp_size)) return e;
      body = std::move(r);
      return std::nullopt;
    }
    case mp_op::query_prefetch_status: {
      query_prefetch_status_req r;
      if (auto e = string(0, r.request_id)) return e;
      body = std::move(r);
      return std::nullopt;
    }
    case mp_op::wait_prefetch_status: {
      wait_prefetch_status_req r;
      if (auto e = string(0, r.request_id)) return e;
      if (auto e = arg(1, [&](cursor& c, const std::string& w) { return read_timeout(c, w, r.timeout_s); })) return e;
      body = std::move(r);
      return std::nullopt;
    }
    case mp_op::query_prefetch_lookup_hits: {
      query_prefetch_lookup_hits_req r;
      if (auto e = string(0, r.request_id)) return e;
      body = std::move(r);
      return std::nullopt;
    }
    case mp_op::end_session: {
      end_session_req r;
      if (auto e = string(0, r.request_id)) return e;
      body = std::move(r);
      return std::nullopt;
    }
    case mp_op::clear: {
      clear_req r;
      if (!args.empty())
        if (auto e = arg(0, [&](cursor& c, const std::string& w) { return read_bool(c, w, r.force); })) return e;
      body = r;
      return std::nullopt;
    }
    case mp_op::ping: {
      ping_req r;
      if (auto e = arg(0, [&](cursor& c, const std::string& w) { return read_opt_int(c, w, r.instance_id); })) return e;
      body = r;
      return std::nullopt;
    }
    case mp_op::get_chunk_size: body = get_chunk_size_req{}; return std::nullopt;
    case mp_op::noop: body = noop_req{}; return std::nullopt;
    case mp_op::get_experimental: body = get_experimental_req{}; return std::nullopt;
  }
  return fail("op", "no decoder");
}

std::string shown(std::string_view s) {
  std::string out;
  for (char ch : s.substr(0, 48)) out += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
  return out;
}

/// Resolves the op frame: a legacy id (msgpack int) or a snake_case name.
std::variant<const op_info*, wire_error> decode_op(std::string_view frame) {
  if (frame.empty())
    return wire_error{"unsupported_op", "empty op frame (event-stream control: subscribe_kv_events is not served)"};
  cursor c(frame);
  item it;
  if (c.next(it) || !c.at_end()) return wire_error{"unknown_op", "op frame is not one msgpack value"};
  if (it.kind == mk::uint || it.kind == mk::sint) {
    // Ids are small; anything beyond int64 is simply not one of them.
    int64_t id = it.kind == mk::sint ? it.i
                 : it.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? -1
                                                                                    : static_cast<int64_t>(it.u);
    if (auto op = mp_op_from_id(id)) return find_op(*op);
    for (const auto& f : k_foreign_ops)
      if (f.id != 0 && f.id == id)
        return wire_error{"unsupported_op", std::string("op ") + std::to_string(id) + " (" + f.name + ") is not served"};
    return wire_error{"unknown_op", "unknown legacy op id " + (it.kind == mk::uint ? std::to_string(it.u) : std::to_string(it.i))};
  }
  if (it.kind == mk::str) {
    std::string_view name(reinterpret_cast<const char*>(it.ptr), it.len);
    if (auto op = mp_op_from_name(name)) return find_op(*op);
    for (const auto& f : k_foreign_ops)
      if (name == f.name) return wire_error{"unsupported_op", "op '" + std::string(name) + "' is not served"};
    return wire_error{"unknown_op", "unknown op name '" + shown(name) + "'"};
  }
  return wire_error{"unknown_op", std::string("op frame holds a ") + mk_name(it.kind) + ", not an int or str"};
}

// ---------------------------------------------------------------------------
// Encoding (the header sizes msgspec picks: smallest that fits)
// ---------------------------------------------------------------------------

void put_be(std::string& out, uint64_t v, size_t n) {
  for (size_t k = n; k-- > 0;) out.push_back(static_cast<char>((v >> (8 * k)) & 0xff));
}

void put_len(std::string& out, size_t n, uint8_t fix_base, size_t fix_max, uint8_t c8, uint8_t c16, uint8_t c32) {
  if (fix_base != 0 && n <= fix_max) {
    out.push_back(static_cast<char>(fix_base | n));
  } else if (c8 != 0 && n <= 0xff) {
    out.push_back(static_cast<char>(c8));
    put_be(out, n, 1);
  } else if (n <= 0xffff) {
    out.push_back(static_cast<char>(c16));
    put_be(out, n, 2);
  } else {
    out.push_back(static_cast<char>(c32));
    put_be(out, n, 4);
  }
}

void put_str(std::string& out, std::string_view s) {
  put_len(out, s.size(), 0xa0, 31, 0xd9, 0xda, 0xdb);
  out.append(s.data(), s.size());
}

void put_bin(std::string& out, std::string_view s) {
  put_len(out, s.size(), 0, 0, 0xc4, 0xc5, 0xc6);
  out.append(s.data(), s.size());
}

void put_array(std::string& out, size_t n) { put_len(out, n, 0x90, 15, 0, 0xdc, 0xdd); }

} // namespace

// ---------------------------------------------------------------------------
// Public: ops
// ---------------------------------------------------------------------------

const char* to_string(mp_op op) {
  if (const op_info* o = find_op(op)) return o->name;
  return "?";
}

std::optional<mp_op> mp_op_from_name(std::string_view name) {
  for (const auto& o : k_ops)
    if (name == o.name) return o.op;
  return std::nullopt;
}

std::optional<mp_op> mp_op_from_id(int64_t id) {
  for (const auto& o : k_ops)
    if (static_cast<int64_t>(o.op) == id) return o.op;
  return std::nullopt;
}

const char* to_string(engine_type t) {
  switch (t) {
    case engine_type::vllm: return "vllm";
    case engine_type::atom: return "atom";
    case engine_type::sglang: return "sglang";
    case engine_type::trtllm: return "trtllm";
    case engine_type::mock: return "mock";
  }
  return "?";
}

std::variant<mp_request, wire_error> decode_mp_request(const std::vector<std::string_view>& frames) {
  if (frames.size() < 2)
    return wire_error{"bad_frames", "expected uid, op and arguments; got " + std::to_string(frames.size()) + " frame(s)"};
  mp_request req;
  {
    // The uid is opaque: echoed, never interpreted (LMCache's server does
    // not decode it either, and answers whatever it is).
    cursor c(frames[0]);
    item it;
    int64_t uid = -1;
    if (c.next(it) || !c.at_end() || as_int64(it, "uid", uid))
      uid = -1;
    req.uid = uid;
  }
  auto op = decode_op(frames[1]);
  if (auto* e = std::get_if<wire_error>(&op)) return *e;
  const op_info& info = *std::get<const op_info*>(op);
  std::vector<std::string_view> args(frames.begin() + 2, frames.end());
  if (args.size() < info.min_args || args.size() > info.max_args) {
    std::string want = info.min_args == info.max_args
                           ? std::to_string(info.min_args)
                           : std::to_string(info.min_args) + ".." + std::to_string(info.max_args);
    return wire_error{"arity", std::string(info.name) + " takes " + want + " argument(s), got " + std::to_string(args.size())};
  }
  if (auto e = decode_body(info, args, req.body)) return bad_arg(*e);
  req.op = info.op;
  req.uid_frame.assign(frames[0].data(), frames[0].size());
  req.op_frame.assign(frames[1].data(), frames[1].size());
  return req;
}

// ---------------------------------------------------------------------------
// Public: wrappers and their shared helpers
// ---------------------------------------------------------------------------

std::variant<tensor_desc, wire_error> decode_kv_cache_wrapper(int8_t ext_type, std::string_view payload) {
  if (ext_type == kvs_host_shm_ext) return decode_host_shm_ext(payload);
  if (ext_type != lmcache_ipc_wrapper_ext)
    return wire_error{"bad_wrapper", "ext type " + std::to_string(ext_type) + " is not a KV-cache wrapper"};
  // A pickle opens with PROTO (0x80) and its protocol (2..5); a descriptor is
  // one msgpack map, and 0x80 (an empty map) followed by anything is not one.
  if (payload.size() >= 2 && static_cast<uint8_t>(payload[0]) == 0x80 && static_cast<uint8_t>(payload[1]) >= 2 &&
      static_cast<uint8_t>(payload[1]) <= 5)
    return decode_pickled_ipc_wrapper(payload);
  return decode_ipc_descriptor(payload);
}

std::optional<uint32_t> torch_dtype_size(std::string_view dtype) {
  static constexpr std::pair<const char*, uint32_t> k_dtypes[] = {
      {"float16", 2},        {"bfloat16", 2},        {"float32", 4},         {"float64", 8},
      {"float8_e4m3fn", 1},  {"float8_e5m2", 1},     {"float8_e4m3fnuz", 1}, {"float8_e5m2fnuz", 1},
      {"float8_e8m0fnu", 1}, {"float4_e2m1fn_x2", 1}, {"int8", 1},           {"uint8", 1},
      {"int16", 2},          {"uint16", 2},          {"int32", 4},           {"uint32", 4},
      {"int64", 8},          {"uint64", 8},          {"bool", 1},            {"complex32", 4},
      {"complex64", 8},      {"complex128", 16},
  };
  for (const auto& d : k_dtypes)
    if (dtype == d.first) return d.second;
  return std::nullopt;
}

std::optional<wire_error> apply_torch_cuda_share(const torch_cuda_share& s, tensor_desc& out) {
  if (!s.mem_handle) return wire_error{"bad_wrapper", "handle[1]: no CUDA memory handle"};
  const std::string& h = *s.mem_handle;
  // c10 CUDACachingAllocator::shareIpcHandle: [version][type]['c' payload =
  // cudaIpcMemHandle_t]. Versions 1-3 share the 'c' layout (torch 2.13 moved
  // to 3 without changing it); a bare 64-byte handle predates versioning.
  if (h.size() == 64) {
    out.ipc_mem_handle = h;
  } else if (h.size() >= 2 && h[1] == 'e') {
    return wire_error{"unsupported_wrapper",
                      "handle[1]: expandable-segment handle (PYTORCH_CUDA_ALLOC_CONF=expandable_segments) cannot be opened with cudaIpcOpenMemHandle"};
  } else if (h.size() == 66 && h[1] == 'c' && h[0] >= 1 && h[0] <= 3) {
    out.ipc_mem_handle = h.substr(2);
  } else {
    return wire_error{"bad_wrapper", "handle[1]: unrecognised torch shareable handle (" + std::to_string(h.size()) + " bytes)"};
  }
  if (s.device < 0) return wire_error{"bad_wrapper", "handle[0]: negative device"};
  if (s.storage_size_bytes < 0 || s.storage_offset_bytes < 0)
    return wire_error{"bad_wrapper", "handle[2..3]: negative storage size or offset"};
  if (s.event_handle && !s.event_handle->empty() && s.event_handle->size() != 64)
    return wire_error{"bad_wrapper", "handle[6]: event handle of " + std::to_string(s.event_handle->size()) + " bytes (expected 64)"};
  out.kind = tensor_desc::memory_kind::cuda_ipc;
  out.device_index = s.device;
  out.storage_size_bytes = static_cast<uint64_t>(s.storage_size_bytes);
  out.storage_offset_bytes = static_cast<uint64_t>(s.storage_offset_bytes);
  out.ipc_event_handle = s.event_handle ? *s.event_handle : std::string();
  out.event_sync_required = s.event_sync_required;
  return std::nullopt;
}

std::optional<wire_error> apply_tensor_view(std::string dtype, std::vector<int64_t> shape, std::vector<int64_t> stride,
                                            int64_t storage_offset, tensor_desc& out, bool check_span) {
  auto size = torch_dtype_size(dtype);
  if (!size) return wire_error{"bad_wrapper", "unsupported dtype '" + dtype.substr(0, 32) + "'"};
  if (shape.size() != stride.size())
    return wire_error{"bad_wrapper", "shape rank " + std::to_string(shape.size()) + " != stride rank " + std::to_string(stride.size())};
  if (shape.size() > 64) return wire_error{"bad_wrapper", "rank above 64"};
  if (storage_offset < 0) return wire_error{"bad_wrapper", "negative storage_offset"};
  // TensorMetadata.byte_span(): itemsize * (storage_offset + 1 + sum((size-1)*stride)),
  // 0 for an empty view; computed without overflow.
  bool empty = false;
  for (size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] < 0 || stride[k] < 0) return wire_error{"bad_wrapper", "negative size or stride"};
    if (shape[k] == 0) empty = true;
  }
  if (check_span && !empty) {
    uint64_t elems = static_cast<uint64_t>(storage_offset) + 1, term = 0, span = 0;
    bool overflow = false;
    for (size_t k = 0; k < shape.size() && !overflow; ++k) {
      overflow |= __builtin_mul_overflow(static_cast<uint64_t>(shape[k] - 1), static_cast<uint64_t>(stride[k]), &term);
      overflow |= __builtin_add_overflow(elems, term, &elems);
    }
    overflow |= __builtin_mul_overflow(elems, uint64_t{*size}, &span);
    if (overflow || span > out.storage_size_bytes)
      return wire_error{"bad_wrapper", "view exceeds its storage (" + std::to_string(out.storage_size_bytes) + " bytes)"};
  }
  out.dtype = std::move(dtype);
  out.element_size = *size;
  out.shape = std::move(shape);
  out.stride = std::move(stride);
  out.storage_offset = storage_offset;
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Public: response bodies
// ---------------------------------------------------------------------------

std::string encode_mp_int(int64_t v) {
  std::string out;
  if (v >= 0) {
    auto u = static_cast<uint64_t>(v);
    if (u <= 0x7f) {
      out.push_back(static_cast<char>(u));
    } else if (u <= 0xff) {
      out.push_back(static_cast<char>(0xcc));
      put_be(out, u, 1);
    } else if (u <= 0xffff) {
      out.push_back(static_cast<char>(0xcd));
      put_be(out, u, 2);
    } else if (u <= 0xffffffffu) {
      out.push_back(static_cast<char>(0xce));
      put_be(out, u, 4);
    } else {
      out.push_back(static_cast<char>(0xcf));
      put_be(out, u, 8);
    }
  } else if (v >= -32) {
    out.push_back(static_cast<char>(static_cast<int8_t>(v)));
  } else if (v >= -128) {
    out.push_back(static_cast<char>(0xd0));
    put_be(out, static_cast<uint64_t>(v), 1);
  } else if (v >= -32768) {
    out.push_back(static_cast<char>(0xd1));
    put_be(out, static_cast<uint64_t>(v), 2);
  } else if (v >= std::numeric_limits<int32_t>::min()) {
    out.push_back(static_cast<char>(0xd2));
    put_be(out, static_cast<uint64_t>(v), 4);
  } else {
    out.push_back(static_cast<char>(0xd3));
    put_be(out, static_cast<uint64_t>(v), 8);
  }
  return out;
}

std::string encode_mp_bool(bool v) { return std::string(1, static_cast<char>(v ? 0xc3 : 0xc2)); }

std::string encode_mp_str(std::string_view v) {
  std::string out;
  put_str(out, v);
  return out;
}

std::string encode_mp_event_ok(std::string_view event_handle, bool ok) {
  std::string out;
  put_array(out, 2);
  put_bin(out, event_handle);
  out.push_back(static_cast<char>(ok ? 0xc3 : 0xc2));
  return out;
}

std::string encode_mp_str_list(const std::vector<std::string>& v) {
  std::string out;
  put_array(out, v.size());
  for (const auto& s : v) put_str(out, s);
  return out;
}

} // namespace kvs
