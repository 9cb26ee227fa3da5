// KV event batch codec. Decoding uses a small bounds-checked msgpack cursor
// straight into the typed structs: no intermediate object tree (for a vLLM
// 16x16 batch msgpack-cxx's unpack alone, before any conversion, runs ~3200
// instructions per event; this whole typed decode ~2850), no recursion, and a
// bad event can be stepped over and reported on its own.
// Encoding uses msgpack::packer, plus raw bytes where msgspec's choice differs
// from packer's (float64 always, map16 headers).
#include "messages/kv_event_codec.hpp"
#include "messages/utf8.hpp"

#include <msgpack.hpp>

#include <cstring>
#include <limits>
#include <utility>

namespace kvs {
namespace {

// ---------------------------------------------------------------------------
// msgpack cursor
// ---------------------------------------------------------------------------

enum class mp_kind : uint8_t { nil, boolean, uint, sint, float32, float64, str, bin, array, map, ext };

const char* kind_name(mp_kind k) {
  switch (k) {
    case mp_kind::nil: return "nil";
    case mp_kind::boolean: return "bool";
    case mp_kind::uint: return "int";
    case mp_kind::sint: return "int";
    case mp_kind::float32: return "float";
    case mp_kind::float64: return "float";
    case mp_kind::str: return "str";
    case mp_kind::bin: return "bin";
    case mp_kind::array: return "array";
    case mp_kind::map: return "map";
    case mp_kind::ext: return "ext";
  }
  return "?";
}

/// One msgpack item as the cursor sees it. Integers are normalised: any
/// non-negative value is `uint` (msgpack's signed formats may hold them),
/// only negative ones are `sint`.
struct mp_item {
  mp_kind kind = mp_kind::nil;
  uint64_t u = 0;               ///< uint value, bool value
  int64_t i = 0;                ///< sint value (always < 0)
  double f = 0.0;               ///< float value
  const uint8_t* ptr = nullptr; ///< str/bin payload
  uint32_t len = 0;             ///< str/bin byte length; array/map element count
};

uint16_t load16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
uint32_t load32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}
uint64_t load64(const uint8_t* p) { return (uint64_t{load32(p)} << 32) | load32(p + 4); }


class reader {
public:
  reader(const uint8_t* data, size_t size) : begin_(data), p_(data), end_(data + size) {}

  size_t offset() const { return static_cast<size_t>(p_ - begin_); }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  void seek(size_t off) { p_ = begin_ + off; }
  const uint8_t* at(size_t off) const { return begin_ + off; }
  /// Why the last next()/skip() failed, naming the byte offset.
  const std::string& error() const { return error_; }

  /// Reads one item. str/bin/ext payloads are consumed; array/map elements
  /// are not (the caller reads or skips `len` (x2 for maps) items next).
  __attribute__((always_inline)) bool next(mp_item& it) {
    // Inline fast path for what event frames are made of: small ints, token
    // ids (uint16/32), short strings, small arrays and maps, nil.
    if (p_ != end_) {
      uint8_t b = *p_;
      if (b <= 0x7f) {
        ++p_;
        it.kind = mp_kind::uint;
        it.u = b;
        return true;
      }
      if (b >= 0x80 && b <= 0x9f) {
        ++p_;
        it.kind = b <= 0x8f ? mp_kind::map : mp_kind::array;
        it.len = b & 0x0fu;
        return true;
      }
      size_t left = remaining();
      if (b >= 0xa0 && b <= 0xbf && left > (b & 0x1fu)) {
        it.kind = mp_kind::str;
        it.ptr = p_ + 1;
        it.len = b & 0x1fu;
        p_ += 1 + it.len;
        return true;
      }
      if (b == 0xc0) {
        ++p_;
        it.kind = mp_kind::nil;
        return true;
      }
      if (b == 0xcd && left >= 3) {
        it.kind = mp_kind::uint;
        it.u = load16(p_ + 1);
        p_ += 3;
        return true;
      }
      if (b == 0xce && left >= 5) {
        it.kind = mp_kind::uint;
        it.u = load32(p_ + 1);
        p_ += 5;
        return true;
      }
    }
    return next_slow(it);
  }

  /// Token ids: reads a positive fixint, uint16 or uint32 if one is next;
  /// otherwise consumes nothing and returns false (use next()).
  __attribute__((always_inline)) bool next_small_uint(uint64_t& v) {
    size_t left = remaining();
    if (left == 0)
      return false;
    uint8_t b = *p_;
    if (b <= 0x7f) {
      v = b;
      p_ += 1;
      return true;
    }
    if (b == 0xce && left >= 5) {
      v = load32(p_ + 1);
      p_ += 5;
      return true;
    }
    if (b == 0xcd && left >= 3) {
      v = load16(p_ + 1);
      p_ += 3;
      return true;
    }
    return false;
  }

  /// Everything else, and every error.
  __attribute__((noinline)) bool next_slow(mp_item& it) {
    const uint8_t* start = p_;
    if (read(it))
      return true;
    // Report the item that failed, not how far into it we got.
    p_ = start;
    error_ += " at byte " + std::to_string(offset());
    return false;
  }

  /// Whether `count` more values can possibly follow: each takes at least
  /// one byte. Sets the error when not.
  bool fits(uint64_t count) {
    if (count <= remaining())
      return true;
    error_ = "truncated: " + std::to_string(count) + " more values claimed at byte " +
             std::to_string(offset()) + ", " + std::to_string(remaining()) + " bytes left";
    return false;
  }

  /// Skips `count` complete values without recursion. When `bad_utf8` is
  /// given, sets it if any str inside is not valid UTF-8 (and keeps going).
  bool skip(uint64_t count, bool* bad_utf8 = nullptr) {
    mp_item it;
    while (count > 0) {
      if (!fits(count))
        return false;
      if (!next(it))
        return false;
      --count;
      if (it.kind == mp_kind::array)
        count += it.len;
      else if (it.kind == mp_kind::map)
        count += 2 * uint64_t{it.len};
      else if (bad_utf8 && it.kind == mp_kind::str && !valid_utf8(it.ptr, it.len))
        *bad_utf8 = true;
    }
    return true;
  }

private:
  bool read(mp_item& it) {
    if (p_ == end_)
      return truncated();
    uint8_t b = *p_++;
    if (b <= 0x7f) {
      it.kind = mp_kind::uint;
      it.u = b;
      return true;
    }
    if (b >= 0xe0) {
      it.kind = mp_kind::sint;
      it.i = static_cast<int8_t>(b);
      return true;
    }
    if (b <= 0x8f)
      return container(it, mp_kind::map, b & 0x0fu);
    if (b <= 0x9f)
      return container(it, mp_kind::array, b & 0x0fu);
    if (b <= 0xbf)
      return payload(it, mp_kind::str, b & 0x1fu);
    switch (b) {
      case 0xc0: it.kind = mp_kind::nil; return true;
      case 0xc2: it.kind = mp_kind::boolean; it.u = 0; return true;
      case 0xc3: it.kind = mp_kind::boolean; it.u = 1; return true;
      case 0xc4: return need(1) && payload(it, mp_kind::bin, take8());
      case 0xc5: return need(2) && payload(it, mp_kind::bin, take16());
      case 0xc6: return need(4) && payload(it, mp_kind::bin, take32());
      case 0xc7: return need(1) && ext(it, take8());
      case 0xc8: return need(2) && ext(it, take16());
      case 0xc9: return need(4) && ext(it, take32());
      case 0xca: {
        if (!need(4))
          return false;
        uint32_t bits = take32();
        float v;
        std::memcpy(&v, &bits, 4);
        it.kind = mp_kind::float32;
        it.f = v;
        return true;
      }
      case 0xcb: {
        if (!need(8))
          return false;
        uint64_t bits = take64();
        std::memcpy(&it.f, &bits, 8);
        it.kind = mp_kind::float64;
        return true;
      }
      case 0xcc: return need(1) && unsigned_int(it, take8());
      case 0xcd: return need(2) && unsigned_int(it, take16());
      case 0xce: return need(4) && unsigned_int(it, take32());
      case 0xcf: return need(8) && unsigned_int(it, take64());
      case 0xd0: return need(1) && signed_int(it, static_cast<int8_t>(take8()));
      case 0xd1: return need(2) && signed_int(it, static_cast<int16_t>(take16()));
      case 0xd2: return need(4) && signed_int(it, static_cast<int32_t>(take32()));
      case 0xd3: return need(8) && signed_int(it, static_cast<int64_t>(take64()));
      case 0xd4: return ext(it, 1);
      case 0xd5: return ext(it, 2);
      case 0xd6: return ext(it, 4);
      case 0xd7: return ext(it, 8);
      case 0xd8: return ext(it, 16);
      case 0xd9: return need(1) && payload(it, mp_kind::str, take8());
      case 0xda: return need(2) && payload(it, mp_kind::str, take16());
      case 0xdb: return need(4) && payload(it, mp_kind::str, take32());
      case 0xdc: return need(2) && container(it, mp_kind::array, take16());
      case 0xdd: return need(4) && container(it, mp_kind::array, take32());
      case 0xde: return need(2) && container(it, mp_kind::map, take16());
      case 0xdf: return need(4) && container(it, mp_kind::map, take32());
      default: break; // 0xc1: never used
    }
    return fail("invalid msgpack byte 0xc1");
  }

  bool fail(const char* why) {
    error_ = why;
    return false;
  }
  bool truncated() { return fail("truncated"); }
  bool need(size_t n) { return remaining() >= n || truncated(); }
  uint8_t take8() { return *p_++; }
  uint16_t take16() {
    uint16_t v = load16(p_);
    p_ += 2;
    return v;
  }
  uint32_t take32() {
    uint32_t v = load32(p_);
    p_ += 4;
    return v;
  }
  uint64_t take64() {
    uint64_t v = load64(p_);
    p_ += 8;
    return v;
  }
  bool unsigned_int(mp_item& it, uint64_t v) {
    it.kind = mp_kind::uint;
    it.u = v;
    return true;
  }
  bool signed_int(mp_item& it, int64_t v) {
    if (v >= 0)
      return unsigned_int(it, static_cast<uint64_t>(v));
    it.kind = mp_kind::sint;
    it.i = v;
    return true;
  }
  bool payload(mp_item& it, mp_kind k, uint32_t n) {
    if (!need(n))
      return false;
    it.kind = k;
    it.ptr = p_;
    it.len = n;
    p_ += n;
    return true;
  }
  bool ext(mp_item& it, uint32_t n) {
    if (!need(1) || !need(size_t{n} + 1))
      return false;
    it.kind = mp_kind::ext;
    it.ptr = p_ + 1;
    it.len = n;
    p_ += size_t{n} + 1;
    return true;
  }
  bool container(mp_item& it, mp_kind k, uint32_t n) {
    it.kind = k;
    it.len = n;
    return true;
  }

  const uint8_t* begin_;
  const uint8_t* p_;
  const uint8_t* end_;
  std::string error_;
};

// ---------------------------------------------------------------------------
// event schemas: field names in vLLM's declaration order
// ---------------------------------------------------------------------------

struct name_ref {
  const char* s;
  uint8_t n;
};

template <typename T>
T load_raw(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

/// Compares a key with a field name in word-sized steps (overlapping the
/// last word): names are 4..28 bytes and this runs for every map key.
__attribute__((always_inline)) inline bool same(const mp_item& key, name_ref name) {
  const uint32_t n = name.n;
  if (key.len != n)
    return false;
  const uint8_t* a = key.ptr;
  const char* b = name.s;
  if (n >= 8) {
    for (uint32_t k = 0; k + 8 <= n; k += 8)
      if (load_raw<uint64_t>(a + k) != load_raw<uint64_t>(b + k))
        return false;
    return load_raw<uint64_t>(a + n - 8) == load_raw<uint64_t>(b + n - 8);
  }
  if (n >= 4)
    return load_raw<uint32_t>(a) == load_raw<uint32_t>(b) &&
           load_raw<uint32_t>(a + n - 4) == load_raw<uint32_t>(b + n - 4);
  for (uint32_t k = 0; k < n; ++k)
    if (a[k] != static_cast<uint8_t>(b[k]))
      return false;
  return true;
}

#define KVS_NAME(lit) name_ref{lit, static_cast<uint8_t>(sizeof(lit) - 1)}

const name_ref type_key = KVS_NAME("type");
const name_ref tag_stored = KVS_NAME("BlockStored");
const name_ref tag_removed = KVS_NAME("BlockRemoved");
const name_ref tag_cleared = KVS_NAME("AllBlocksCleared");

enum stored_field : int {
  sf_block_hashes,
  sf_parent_block_hash,
  sf_token_ids,
  sf_block_size,
  sf_lora_id,
  sf_medium,
  sf_lora_name,
  sf_extra_keys,
  sf_group_idx,
  sf_kv_cache_spec_kind,
  sf_kv_cache_spec_sliding_window,
  sf_locality,
  sf_ownership,
  sf_session_id,
  sf_count
};
const name_ref stored_names[sf_count] = {
    KVS_NAME("block_hashes"),     KVS_NAME("parent_block_hash"),
    KVS_NAME("token_ids"),        KVS_NAME("block_size"),
    KVS_NAME("lora_id"),          KVS_NAME("medium"),
    KVS_NAME("lora_name"),        KVS_NAME("extra_keys"),
    KVS_NAME("group_idx"),        KVS_NAME("kv_cache_spec_kind"),
    KVS_NAME("kv_cache_spec_sliding_window"), KVS_NAME("locality"),
    KVS_NAME("ownership"),        KVS_NAME("session_id"),
};
/// The fields no known engine ever leaves out (tokenspeed's whole struct).
constexpr int stored_required = 4;

enum removed_field : int {
  rf_block_hashes,
  rf_medium,
  rf_group_idx,
  rf_locality,
  rf_ownership,
  rf_count
};
const name_ref removed_names[rf_count] = {
    KVS_NAME("block_hashes"), KVS_NAME("medium"), KVS_NAME("group_idx"),
    KVS_NAME("locality"),     KVS_NAME("ownership"),
};
constexpr int removed_required = 1;

#undef KVS_NAME

// ---------------------------------------------------------------------------
// event parsing
// ---------------------------------------------------------------------------

enum class status { ok, drop, fatal };

/// Parses events off a shared cursor. On `drop` it leaves kind/detail set
/// (detail without the "event i: " prefix); on `fatal` the cursor's error.
class event_parser {
public:
  explicit event_parser(reader& r) : r_(r) {}

  status parse(kv_event_batch& batch) {
    mp_item head;
    if (!r_.next(head))
      return status::fatal;
    if (head.kind == mp_kind::array)
      return parse_positional(head.len, batch);
    if (head.kind == mp_kind::map)
      return parse_map(head.len, batch);
    return drop("bad_event", std::string("expected map or array, got ") + kind_name(head.kind));
  }

  const char* kind() const { return kind_; }
  std::string& detail() { return detail_; }

private:
  enum class tag { stored, removed, cleared };

  status drop(const char* kind, std::string detail) {
    kind_ = kind;
    detail_ = std::move(detail);
    return status::drop;
  }
  status bad_field(name_ref field, const std::string& what) {
    return drop("bad_field", "field '" + std::string(field.s, field.n) + "': " + what);
  }
  status wrong_type(name_ref field, const char* expected, const mp_item& got) {
    return bad_field(field, std::string("expected ") + expected + ", got " + kind_name(got.kind));
  }
  status fatal() { return status::fatal; }

  status read_tag(const mp_item& it, tag& out) {
    if (it.kind != mp_kind::str)
      return drop("bad_event", std::string("tag: expected str, got ") + kind_name(it.kind));
    if (same(it, tag_stored))
      out = tag::stored;
    else if (same(it, tag_removed))
      out = tag::removed;
    else if (same(it, tag_cleared))
      out = tag::cleared;
    else
      return drop("unknown_tag",
                  "unknown tag '" + std::string(reinterpret_cast<const char*>(it.ptr), it.len) + "'");
    return status::ok;
  }

  // -- positional: [tag, field0, field1, ...] -------------------------------
  status parse_positional(uint32_t count, kv_event_batch& batch) {
    if (count == 0)
      return drop("bad_event", "empty array");
    mp_item it;
    if (!r_.next(it))
      return fatal();
    tag t;
    status s = read_tag(it, t);
    if (s != status::ok)
      return s;
    uint64_t nfields = count - 1;
    switch (t) {
      case tag::stored: {
        // Decoded in place: the struct is large, a move would cost more.
        auto& e = std::get<block_stored>(batch.events.emplace_back(std::in_place_type<block_stored>));
        s = positional_fields(nfields, sf_count, stored_required, stored_names,
                              [&](int f) { return stored_field_value(f, e); });
        if (s != status::ok)
          batch.events.pop_back();
        return s;
      }
      case tag::removed: {
        auto& e = std::get<block_removed>(batch.events.emplace_back(std::in_place_type<block_removed>));
        s = positional_fields(nfields, rf_count, removed_required, removed_names,
                              [&](int f) { return removed_field_value(f, e); });
        if (s != status::ok)
          batch.events.pop_back();
        return s;
      }
      case tag::cleared:
        if (!r_.skip(nfields))
          return fatal();
        batch.events.emplace_back(all_blocks_cleared{});
        return status::ok;
    }
    return fatal();
  }

  template <typename F>
  status positional_fields(uint64_t nfields, int known, int required, const name_ref* names,
                           F&& field) {
    if (nfields < static_cast<uint64_t>(required))
      return bad_field(names[nfields], "missing");
    uint64_t n = nfields < static_cast<uint64_t>(known) ? nfields : known;
    for (uint64_t f = 0; f < n; ++f) {
      status s = field(static_cast<int>(f));
      if (s != status::ok)
        return s;
    }
    // Fields a newer engine appended: ignored, as msgspec does.
    return r_.skip(nfields - n) ? status::ok : fatal();
  }

  // -- tagged map: {"type": tag, field: value, ...} -------------------------
  status parse_map(uint32_t pairs, kv_event_batch& batch) {
    size_t body = r_.offset();
    tag t;
    uint32_t at = 0;
    status s = find_tag(pairs, t, at);
    if (s != status::ok)
      return s;
    if (at == 0) {
      --pairs; // the usual case: carry on after the leading "type" pair
    } else {
      r_.seek(body); // "type" comes later: read everything, skipping it
    }
    switch (t) {
      case tag::stored: {
        // Decoded in place: the struct is large, a move would cost more.
        auto& e = std::get<block_stored>(batch.events.emplace_back(std::in_place_type<block_stored>));
        s = map_fields(pairs, sf_count, stored_required, stored_names,
                       [&](int f) { return stored_field_value(f, e); });
        if (s != status::ok)
          batch.events.pop_back();
        return s;
      }
      case tag::removed: {
        auto& e = std::get<block_removed>(batch.events.emplace_back(std::in_place_type<block_removed>));
        s = map_fields(pairs, rf_count, removed_required, removed_names,
                       [&](int f) { return removed_field_value(f, e); });
        if (s != status::ok)
          batch.events.pop_back();
        return s;
      }
      case tag::cleared:
        // No fields, but msgspec still insists on str keys.
        s = map_fields(pairs, 0, 0, nullptr, [&](int) { return fatal(); });
        if (s == status::ok)
          batch.events.emplace_back(all_blocks_cleared{});
        return s;
    }
    return fatal();
  }

  /// msgspec finds the tag wherever it is in the map; "type" is first in
  /// everything msgspec writes, so the scan normally stops at once.
  status find_tag(uint32_t pairs, tag& t, uint32_t& at) {
    mp_item key;
    for (uint32_t k = 0; k < pairs; ++k) {
      at = k;
      if (!r_.next(key))
        return fatal();
      if (key.kind != mp_kind::str)
        return drop("bad_event", std::string("map key of type ") + kind_name(key.kind));
      if (same(key, type_key)) {
        mp_item value;
        if (!r_.next(value))
          return fatal();
        return read_tag(value, t);
      }
      if (!r_.skip(1))
        return fatal();
    }
    return drop("bad_event", "map without a 'type' key");
  }

  template <typename F>
  status map_fields(uint32_t pairs, int known, int required, const name_ref* names, F&& field) {
    uint32_t seen = 0;
    int expect = 0; // keys usually come in declaration order: try that first
    mp_item key;
    for (uint32_t k = 0; k < pairs; ++k) {
      if (!r_.next(key))
        return fatal();
      if (key.kind != mp_kind::str)
        return drop("bad_event", std::string("map key of type ") + kind_name(key.kind));
      int f = expect;
      if (f >= known || !same(key, names[f])) {
        f = 0;
        while (f < known && !same(key, names[f]))
          ++f;
      }
      if (f == known) { // "type", or a field from a newer engine
        if (!r_.skip(1))
          return fatal();
        continue;
      }
      status s = field(f);
      if (s != status::ok)
        return s;
      seen |= 1u << f;
      expect = f + 1;
    }
    for (int f = 0; f < required; ++f)
      if (!(seen & (1u << f)))
        return bad_field(names[f], "missing");
    return status::ok;
  }

  // -- fields ---------------------------------------------------------------
  status stored_field_value(int f, block_stored& e) {
    name_ref name = stored_names[f];
    switch (f) {
      case sf_block_hashes: return hashes(name, e.block_hashes);
      case sf_parent_block_hash: return opt_hash(name, e.parent_block_hash);
      case sf_token_ids: return tokens(name, e.token_ids);
      case sf_block_size: {
        std::optional<int64_t> v;
        status s = opt_int(name, v, false);
        if (s == status::ok && v && *v < 0)
          return bad_field(name, "negative: " + std::to_string(*v));
        e.block_size = v ? *v : 0;
        return s;
      }
      case sf_lora_id: return opt_int(name, e.lora_id, true);
      case sf_medium: return opt_str(name, e.medium);
      case sf_lora_name: return opt_str(name, e.lora_name);
      case sf_extra_keys: return extra_keys(name, e.extra_keys_msgpack);
      case sf_group_idx: return opt_int(name, e.group_idx, true);
      case sf_kv_cache_spec_kind: return opt_str(name, e.kv_cache_spec_kind);
      case sf_kv_cache_spec_sliding_window:
        return opt_int(name, e.kv_cache_spec_sliding_window, true);
      case sf_locality: return opt_str(name, e.locality);
      case sf_ownership: return opt_str(name, e.ownership);
      case sf_session_id: return opt_str(name, e.session_id);
      default: return fatal();
    }
  }

  status removed_field_value(int f, block_removed& e) {
    name_ref name = removed_names[f];
    switch (f) {
      case rf_block_hashes: return hashes(name, e.block_hashes);
      case rf_medium: return opt_str(name, e.medium);
      case rf_group_idx: return opt_int(name, e.group_idx, true);
      case rf_locality: return opt_str(name, e.locality);
      case rf_ownership: return opt_str(name, e.ownership);
      default: return fatal();
    }
  }

  /// vLLM's maybe_convert_block_hash: int.from_bytes(b, "big") & (2**64-1).
  static uint64_t low64_big_endian(const uint8_t* p, uint32_t n) {
    uint32_t from = n > 8 ? n - 8 : 0;
    uint64_t v = 0;
    for (uint32_t k = from; k < n; ++k)
      v = (v << 8) | p[k];
    return v;
  }

  /// Converts a hash item; false when the type cannot be a hash.
  static bool hash_value(const mp_item& it, uint64_t& out) {
    switch (it.kind) {
      case mp_kind::uint: out = it.u; return true;
      case mp_kind::sint: out = static_cast<uint64_t>(it.i); return true;
      case mp_kind::bin:
      case mp_kind::str: out = low64_big_endian(it.ptr, it.len); return true;
      default: return false;
    }
  }

  status hashes(name_ref name, std::vector<uint64_t>& out) {
    mp_item it;
    if (!r_.next(it))
      return fatal();
    if (it.kind != mp_kind::array)
      return wrong_type(name, "array", it);
    const uint32_t n = it.len;
    // Never sized beyond what the input could hold.
    if (!r_.fits(n))
      return fatal();
    out.resize(n);
    uint64_t* dst = out.data();
    for (uint32_t k = 0; k < n; ++k) {
      if (!r_.next(it))
        return fatal();
      if (!hash_value(it, dst[k]))
        return bad_field(name, "element " + std::to_string(k) + ": expected int or bytes, got " +
                                   kind_name(it.kind));
    }
    return status::ok;
  }

  status opt_hash(name_ref name, std::optional<uint64_t>& out) {
    mp_item it;
    if (!r_.next(it))
      return fatal();
    if (it.kind == mp_kind::nil) {
      out.reset();
      return status::ok;
    }
    uint64_t h;
    if (!hash_value(it, h))
      return wrong_type(name, "int, bytes or nil", it);
    out = h;
    return status::ok;
  }

  /// An int64 from an item; false (with `why`) when it is not one.
  static bool int64_value(const mp_item& it, int64_t& out, const char*& why) {
    if (it.kind == mp_kind::sint) {
      out = it.i;
      return true;
    }
    if (it.kind == mp_kind::uint) {
      if (it.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        why = "out of int64 range";
        return false;
      }
      out = static_cast<int64_t>(it.u);
      return true;
    }
    why = nullptr;
    return false;
  }

  status tokens(name_ref name, std::vector<int64_t>& out) {
    mp_item it;
    if (!r_.next(it))
      return fatal();
    if (it.kind != mp_kind::array)
      return wrong_type(name, "array", it);
    const uint32_t n = it.len;
    if (!r_.fits(n))
      return fatal();
    out.resize(n);
    int64_t* dst = out.data();
    for (uint32_t k = 0; k < n; ++k) {
      uint64_t small;
      if (r_.next_small_uint(small)) {
        dst[k] = static_cast<int64_t>(small);
        continue;
      }
      if (!r_.next(it))
        return fatal();
      const char* why;
      if (!int64_value(it, dst[k], why))
        return bad_field(name, "element " + std::to_string(k) + ": " +
                                   (why ? std::string(why)
                                        : std::string("expected int, got ") + kind_name(it.kind)));
    }
    return status::ok;
  }

  status opt_int(name_ref name, std::optional<int64_t>& out, bool nil_ok) {
    mp_item it;
    if (!r_.next(it))
      return fatal();
    if (it.kind == mp_kind::nil && nil_ok) {
      out.reset();
      return status::ok;
    }
    int64_t v;
    const char* why;
    if (!int64_value(it, v, why))
      return why ? bad_field(name, why) : wrong_type(name, nil_ok ? "int or nil" : "int", it);
    out = v;
    return status::ok;
  }

  status opt_str(name_ref name, std::optional<std::string>& out) {
    mp_item it;
    if (!r_.next(it))
      return fatal();
    if (it.kind == mp_kind::nil) {
      out.reset();
      return status::ok;
    }
    if (it.kind != mp_kind::str)
      return wrong_type(name, "str or nil", it);
    if (!valid_utf8(it.ptr, it.len))
      return bad_field(name, "invalid UTF-8");
    out.emplace(reinterpret_cast<const char*>(it.ptr), it.len);
    return status::ok;
  }

  /// vLLM: list[tuple[Any, ...] | None] | None. Kept as raw msgpack.
  status extra_keys(name_ref name, std::optional<std::string>& out) {
    size_t start = r_.offset();
    mp_item it;
    if (!r_.next(it))
      return fatal();
    if (it.kind == mp_kind::nil) {
      out.reset();
      return status::ok;
    }
    if (it.kind != mp_kind::array)
      return wrong_type(name, "array or nil", it);
    uint32_t n = it.len;
    bool bad_utf8 = false;
    for (uint32_t k = 0; k < n; ++k) {
      if (!r_.next(it))
        return fatal();
      if (it.kind == mp_kind::nil)
        continue;
      if (it.kind != mp_kind::array)
        return bad_field(name, "element " + std::to_string(k) + ": expected array or nil, got " +
                                   kind_name(it.kind));
      if (!r_.skip(it.len, &bad_utf8))
        return fatal();
    }
    if (bad_utf8)
      return bad_field(name, "invalid UTF-8 in a str");
    out.emplace(reinterpret_cast<const char*>(r_.at(start)), r_.offset() - start);
    return status::ok;
  }

  reader& r_;
  const char* kind_ = "";
  std::string detail_;
};

wire_error not_a_batch(std::string detail) {
  return wire_error{"not_a_batch", std::move(detail)};
}

// ---------------------------------------------------------------------------
// encoding
// ---------------------------------------------------------------------------

/// msgpack::packer's stream: writes into the caller's reused buffer through
/// a cursor. Inline, so packer's fixed-size writes become plain stores
/// (std::string::append per item was a quarter of the encode time).
class buffer_sink {
public:
  explicit buffer_sink(std::string& out) : out_(out), pos_(out.size()) {}

  void write(const char* p, size_t n) {
    if (out_.size() - pos_ < n)
      grow(n);
    std::memcpy(&out_[pos_], p, n);
    pos_ += n;
  }
  void put(char c) { write(&c, 1); }
  void reserve(size_t n) {
    if (out_.size() - pos_ < n)
      grow(n);
  }
  /// Trims the slack; call once at the end.
  void finish() { out_.resize(pos_); }

private:
  void grow(size_t n) {
    size_t want = pos_ + n;
    out_.resize(want > 2 * out_.size() ? want : 2 * out_.size());
  }

  std::string& out_;
  size_t pos_;
};

/// Map entries a vLLM struct can have at most (its fields + the tag). msgspec
/// sizes a tagged map's header for that maximum, not for the entries actually
/// written: fixmap up to 15, map16 above (BlockStored becomes map16 as soon
/// as vLLM declares a 15th field).
constexpr uint32_t stored_max_entries = sf_count + 1;
constexpr uint32_t removed_max_entries = rf_count + 1;

class event_writer {
public:
  explicit event_writer(std::string& out) : sink_(out), pk_(sink_) {}

  void batch(const kv_event_batch& b, event_dialect d) {
    // A rough size so the buffer grows at most once per batch.
    sink_.reserve(16 + b.events.size() * 256);
    pk_.pack_array(3);
    float64(b.ts);
    pk_.pack_array(static_cast<uint32_t>(b.events.size()));
    for (const kv_event& e : b.events) {
      if (d == event_dialect::vllm)
        std::visit([this](const auto& ev) { vllm(ev); }, e);
      else
        std::visit([this](const auto& ev) { tokenspeed(ev); }, e);
    }
    if (b.dp_rank)
      pk_.pack_int64(*b.dp_rank);
    else
      pk_.pack_nil();
    sink_.finish();
  }

private:
  template <size_t N>
  void str(const char (&s)[N]) {
    static_assert(N - 1 < 32, "fixstr only");
    sink_.put(static_cast<char>(0xa0 | (N - 1)));
    sink_.write(s, N - 1);
  }
  void str(const std::string& s) {
    pk_.pack_str(static_cast<uint32_t>(s.size()));
    pk_.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
  }
  /// msgspec writes every Python float as float64. (Not packer::pack_double:
  /// msgpack-cxx 4 writes a double with an integral value as an int.)
  void float64(double d) {
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    char buf[9];
    buf[0] = static_cast<char>(0xcb);
    for (int k = 0; k < 8; ++k)
      buf[1 + k] = static_cast<char>(bits >> (56 - 8 * k));
    sink_.write(buf, 9);
  }
  void map_header(uint32_t n, uint32_t max_entries) {
    if (max_entries <= 15) {
      sink_.put(static_cast<char>(0x80 | n));
    } else {
      const char h[3] = {static_cast<char>(0xde), static_cast<char>(n >> 8),
                         static_cast<char>(n & 0xff)};
      sink_.write(h, 3);
    }
  }
  void hashes(const std::vector<uint64_t>& hs) {
    pk_.pack_array(static_cast<uint32_t>(hs.size()));
    for (uint64_t h : hs)
      pk_.pack_uint64(h);
  }
  void opt_hash(const std::optional<uint64_t>& h) {
    if (h)
      pk_.pack_uint64(*h);
    else
      pk_.pack_nil();
  }
  void opt_int(const std::optional<int64_t>& v) {
    if (v)
      pk_.pack_int64(*v);
    else
      pk_.pack_nil();
  }
  void opt_str(const std::optional<std::string>& s) {
    if (s)
      str(*s);
    else
      pk_.pack_nil();
  }
  void tokens(const std::vector<int64_t>& ts) {
    pk_.pack_array(static_cast<uint32_t>(ts.size()));
    for (int64_t t : ts)
      pk_.pack_int64(t);
  }

  // -- vLLM tagged maps -----------------------------------------------------
  void vllm(const block_stored& e) {
    uint32_t n = 8 + (e.extra_keys_msgpack ? 1 : 0) + (e.group_idx ? 1 : 0) +
                 (e.kv_cache_spec_kind ? 1 : 0) + (e.kv_cache_spec_sliding_window ? 1 : 0) +
                 (e.locality ? 1 : 0) + (e.ownership ? 1 : 0) + (e.session_id ? 1 : 0);
    map_header(n, stored_max_entries);
    str("type");
    str("BlockStored");
    str("block_hashes");
    hashes(e.block_hashes);
    str("parent_block_hash");
    opt_hash(e.parent_block_hash);
    str("token_ids");
    tokens(e.token_ids);
    str("block_size");
    pk_.pack_int64(e.block_size);
    str("lora_id");
    opt_int(e.lora_id);
    str("medium");
    opt_str(e.medium);
    str("lora_name");
    opt_str(e.lora_name);
    if (e.extra_keys_msgpack) {
      str("extra_keys");
      sink_.write(e.extra_keys_msgpack->data(), e.extra_keys_msgpack->size());
    }
    if (e.group_idx) {
      str("group_idx");
      pk_.pack_int64(*e.group_idx);
    }
    if (e.kv_cache_spec_kind) {
      str("kv_cache_spec_kind");
      str(*e.kv_cache_spec_kind);
    }
    if (e.kv_cache_spec_sliding_window) {
      str("kv_cache_spec_sliding_window");
      pk_.pack_int64(*e.kv_cache_spec_sliding_window);
    }
    if (e.locality) {
      str("locality");
      str(*e.locality);
    }
    if (e.ownership) {
      str("ownership");
      str(*e.ownership);
    }
    if (e.session_id) {
      str("session_id");
      str(*e.session_id);
    }
  }

  void vllm(const block_removed& e) {
    uint32_t n = 3 + (e.group_idx ? 1 : 0) + (e.locality ? 1 : 0) + (e.ownership ? 1 : 0);
    map_header(n, removed_max_entries);
    str("type");
    str("BlockRemoved");
    str("block_hashes");
    hashes(e.block_hashes);
    str("medium");
    opt_str(e.medium);
    if (e.group_idx) {
      str("group_idx");
      pk_.pack_int64(*e.group_idx);
    }
    if (e.locality) {
      str("locality");
      str(*e.locality);
    }
    if (e.ownership) {
      str("ownership");
      str(*e.ownership);
    }
  }

  void vllm(const all_blocks_cleared&) {
    map_header(1, 1);
    str("type");
    str("AllBlocksCleared");
  }

  // -- tokenspeed positional arrays ----------------------------------------
  void tokenspeed(const block_stored& e) {
    pk_.pack_array(5);
    str("BlockStored");
    hashes(e.block_hashes);
    opt_hash(e.parent_block_hash);
    tokens(e.token_ids);
    pk_.pack_int64(e.block_size);
  }

  void tokenspeed(const block_removed& e) {
    pk_.pack_array(2);
    str("BlockRemoved");
    hashes(e.block_hashes);
  }

  void tokenspeed(const all_blocks_cleared&) {
    pk_.pack_array(1);
    str("AllBlocksCleared");
  }

  buffer_sink sink_;
  msgpack::packer<buffer_sink> pk_;
};

} // namespace

std::variant<event_decode_result, wire_error> decode_event_batch(const uint8_t* data,
                                                                 size_t size) {
  reader r(data, size);
  mp_item it;
  if (!r.next(it))
    return not_a_batch("envelope: " + r.error());
  if (it.kind != mp_kind::array)
    return not_a_batch(std::string("envelope: expected array, got ") + kind_name(it.kind));
  if (it.len != 2 && it.len != 3)
    return not_a_batch("envelope: expected 2 or 3 elements, got " + std::to_string(it.len));
  const uint32_t envelope_len = it.len;

  event_decode_result result;
  if (!r.next(it))
    return not_a_batch("ts: " + r.error());
  switch (it.kind) {
    case mp_kind::float32:
    case mp_kind::float64: result.batch.ts = it.f; break;
    case mp_kind::uint: result.batch.ts = static_cast<double>(it.u); break;
    case mp_kind::sint: result.batch.ts = static_cast<double>(it.i); break;
    default: return not_a_batch(std::string("ts: expected float, got ") + kind_name(it.kind));
  }

  if (!r.next(it))
    return not_a_batch("events: " + r.error());
  if (it.kind != mp_kind::array)
    return not_a_batch(std::string("events: expected array, got ") + kind_name(it.kind));
  const uint32_t n = it.len;
  // An event struct is ~30x larger than the smallest event on the wire, so
  // reserve only what a normal batch needs; a larger claim grows as it is
  // actually decoded.
  result.batch.events.reserve(n < 64 ? n : 64);

  event_parser parser(r);
  for (uint32_t k = 0; k < n; ++k) {
    size_t start = r.offset();
    switch (parser.parse(result.batch)) {
      case status::ok: break;
      case status::drop:
        // Step over the rest of the bad event so the next one can decode.
        r.seek(start);
        if (!r.skip(1))
          return not_a_batch("event " + std::to_string(k) + ": " + r.error());
        result.dropped.push_back(
            wire_error{parser.kind(), "event " + std::to_string(k) + ": " + parser.detail()});
        break;
      case status::fatal:
        return not_a_batch("event " + std::to_string(k) + ": " + r.error());
    }
  }

  if (envelope_len == 3) {
    if (!r.next(it))
      return not_a_batch("dp_rank: " + r.error());
    if (it.kind == mp_kind::sint) {
      result.batch.dp_rank = it.i;
    } else if (it.kind == mp_kind::uint &&
               it.u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      result.batch.dp_rank = static_cast<int64_t>(it.u);
    } else if (it.kind != mp_kind::nil) {
      return not_a_batch(std::string("dp_rank: expected int or nil, got ") +
                         (it.kind == mp_kind::uint ? "int out of int64 range" : kind_name(it.kind)));
    }
  }
  if (r.remaining() != 0)
    return not_a_batch(std::to_string(r.remaining()) + " trailing bytes after the batch at byte " +
                       std::to_string(r.offset()));
  return result;
}

void encode_event_batch(const kv_event_batch& batch, event_dialect dialect, std::string& out) {
  event_writer(out).batch(batch, dialect);
}

} // namespace kvs
