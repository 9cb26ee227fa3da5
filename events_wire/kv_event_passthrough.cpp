// The pass-through check (see kv_event_codec.hpp): is a payload exactly the
// bytes encode_event_batch would write for what decode_event_batch reads from
// it? Walked once, nothing allocated, nothing decoded into structs.
//
// It accepts only the encoder's own choices, byte for byte: the 3-element
// envelope with a float64 ts, the smallest header for every array and str,
// the smallest int encoding (unsigned formats for hashes), map16 for vLLM
// 0.33's BlockStored (fixmap for 0.32's, without lookahead_token_ids; one of
// the two in a batch) and fixmap for the others, the keys of vLLM's declaration order
// with the defaulted ones present only when not None, positional arrays of
// tokenspeed's arity. And only what the decoder keeps whole: valid UTF-8,
// ints in range, block_size >= 0. Anything else (another engine's choices,
// a field the encoder would drop or map, a bad event the decoder would drop)
// is "not canonical" and takes decode + encode. fuzz_events_decode and
// test_events_codec check that the two paths give the same bytes.
#include "events_wire/kv_event_codec.hpp"
#include "events_wire/kv_event_schema.hpp"
#include "msgpack/msgpack_reader.hpp"
#include "msgpack/msgpack_writer.hpp"
#include "msgpack/utf8.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

namespace kvs {
namespace {

using namespace event_schema;
using msgpack_io::load16;
using msgpack_io::load32;
using msgpack_io::load64;

/// A key or tag as the encoder writes it: fixstr header + bytes.
struct fixstr {
  uint8_t bytes[32];
  uint8_t n;
};
constexpr fixstr encoded(name_ref name) {
  fixstr f{};
  f.bytes[0] = static_cast<uint8_t>(0xa0 | name.n);
  for (uint8_t k = 0; k < name.n; ++k)
    f.bytes[1 + k] = static_cast<uint8_t>(name.s[k]);
  f.n = static_cast<uint8_t>(name.n + 1);
  return f;
}

template <size_t N>
constexpr std::array<fixstr, N> encoded_all(const name_ref (&names)[N]) {
  std::array<fixstr, N> out{};
  for (size_t k = 0; k < N; ++k)
    out[k] = encoded(names[k]);
  return out;
}

class canonical_walker {
public:
  canonical_walker(const uint8_t* data, size_t size, canonical_events* rec)
      : begin_(data), p_(data), end_(data + size), rec_(rec) {}

  bool batch(event_dialect d, canonical_batch& out) {
    if (!byte(0x93) || !byte(0xcb) || left() < 8)
      return false;
    uint64_t bits = load64(p_);
    std::memcpy(&out.ts, &bits, 8);
    p_ += 8;
    uint32_t n;
    if (!array_header(n))
      return false;
    if (rec_) {
      // The caller's vectors keep their capacity from frame to frame.
      rec_->events.clear();
      rec_->hashes.clear();
      rec_->tokens.clear();
      // Offsets are 32-bit: a frame of 4 GiB or more is not recorded (its
      // events stay unrecorded: the indexer decodes it).
      if (static_cast<size_t>(end_ - begin_) > UINT32_MAX)
        rec_ = nullptr;
      else
        rec_->events.reserve(std::min<size_t>(n, left() / 8));
    }
    for (uint32_t k = 0; k < n; ++k) {
      const uint8_t* at = p_;
      ev_ = canonical_event{};
      if (!(d == event_dialect::vllm ? vllm_event() : tokenspeed_event()))
        return false;
      prev_stored_ = ev_.stored;
      if (rec_) {
        ev_.at = static_cast<uint32_t>(at - begin_);
        ev_.size = static_cast<uint32_t>(p_ - at);
        rec_->events.push_back(ev_);
      }
    }
    out.events = n;
    out.rank_offset = static_cast<size_t>(p_ - begin_);
    if (stored_fixmap_)
      out.stored_layout = vllm_stored_layout::v0_32;
    else if (stored_map16_)
      out.stored_layout = vllm_stored_layout::v0_33;
    if (left() > 0 && *p_ == 0xc0) {
      ++p_;
      out.dp_rank.reset();
    } else {
      int64_t r;
      if (!int64_value(r))
        return false;
      out.dp_rank = r;
    }
    return p_ == end_;
  }

private:
  size_t left() const { return static_cast<size_t>(end_ - p_); }
  bool byte(uint8_t b) {
    if (p_ == end_ || *p_ != b)
      return false;
    ++p_;
    return true;
  }
  /// A key or tag, compared in words (inlined: it runs for every key of
  /// every event; keys are 5..29 bytes with their header).
  bool lit(const fixstr& s) {
    const size_t n = s.n;
    if (left() < n)
      return false;
    bool eq;
    if (n >= 8) {
      eq = true;
      for (size_t k = 0; k + 8 <= n; k += 8)
        eq &= load_raw<uint64_t>(p_ + k) == load_raw<uint64_t>(s.bytes + k);
      eq &= load_raw<uint64_t>(p_ + n - 8) == load_raw<uint64_t>(s.bytes + n - 8);
    } else if (n >= 4) {
      eq = load_raw<uint32_t>(p_) == load_raw<uint32_t>(s.bytes) &&
           load_raw<uint32_t>(p_ + n - 4) == load_raw<uint32_t>(s.bytes + n - 4);
    } else {
      eq = std::memcmp(p_, s.bytes, n) == 0;
    }
    if (!eq)
      return false;
    p_ += n;
    return true;
  }
  bool at_nil() const { return p_ != end_ && *p_ == 0xc0; }
  bool nil() { return byte(0xc0); }

  /// Smallest header for n elements: fixarray, array16, array32.
  bool array_header(uint32_t& n) {
    if (p_ == end_)
      return false;
    uint8_t b = *p_;
    if (b >= 0x90 && b <= 0x9f) {
      n = b & 0x0fu;
      p_ += 1;
      return true;
    }
    if (b == 0xdc && left() >= 3) {
      n = load16(p_ + 1);
      p_ += 3;
      return n >= 16;
    }
    if (b == 0xdd && left() >= 5) {
      n = load32(p_ + 1);
      p_ += 5;
      return n > 0xffff;
    }
    return false;
  }

  /// A str in its smallest header, valid UTF-8.
  bool str() {
    if (p_ == end_)
      return false;
    uint8_t b = *p_;
    size_t n, h;
    if (b >= 0xa0 && b <= 0xbf) {
      n = b & 0x1fu;
      h = 1;
    } else if (b == 0xd9 && left() >= 2) {
      n = p_[1];
      h = 2;
      if (n < 32)
        return false;
    } else if (b == 0xda && left() >= 3) {
      n = load16(p_ + 1);
      h = 3;
      if (n <= 0xff)
        return false;
    } else if (b == 0xdb && left() >= 5) {
      n = load32(p_ + 1);
      h = 5;
      if (n <= 0xffff)
        return false;
    } else {
      return false;
    }
    if (left() - h < n || !valid_utf8(p_ + h, n))
      return false;
    p_ += h + n;
    return true;
  }

  /// An unsigned value in the smallest unsigned encoding (hashes: the
  /// encoder writes every hash as a msgpack uint).
  __attribute__((always_inline)) bool uint_value(uint64_t& v) {
    if (p_ == end_)
      return false;
    uint8_t b = *p_;
    if (b <= 0x7f) {
      v = b;
      p_ += 1;
      return true;
    }
    return uint_wide(b, v);
  }
  bool uint_wide(uint8_t b, uint64_t& v) {
    const size_t l = left();
    switch (b) {
      case 0xcc:
        if (l < 2) return false;
        v = p_[1];
        p_ += 2;
        return v > 0x7f;
      case 0xcd:
        if (l < 3) return false;
        v = load16(p_ + 1);
        p_ += 3;
        return v > 0xff;
      case 0xce:
        if (l < 5) return false;
        v = load32(p_ + 1);
        p_ += 5;
        return v > 0xffff;
      case 0xcf:
        if (l < 9) return false;
        v = load64(p_ + 1);
        p_ += 9;
        return v > 0xffffffffu;
      default: return false;
    }
  }

  /// An int64 in the smallest encoding the encoder (msgpack_io::writer::sint)
  /// picks: unsigned formats for >= 0, signed ones for < 0.
  __attribute__((always_inline)) bool int64_value(int64_t& v) {
    if (p_ == end_)
      return false;
    uint8_t b = *p_;
    if (b <= 0x7f || b >= 0xe0) { // positive / negative fixint
      v = b <= 0x7f ? int64_t{b} : int64_t{static_cast<int8_t>(b)};
      p_ += 1;
      return true;
    }
    if (b >= 0xcc && b <= 0xcf) {
      uint64_t u;
      if (!uint_wide(b, u) || u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return false;
      v = static_cast<int64_t>(u);
      return true;
    }
    const size_t l = left();
    switch (b) {
      case 0xd0:
        if (l < 2) return false;
        v = static_cast<int8_t>(p_[1]);
        p_ += 2;
        return v < -32;
      case 0xd1:
        if (l < 3) return false;
        v = static_cast<int16_t>(load16(p_ + 1));
        p_ += 3;
        return v < -128;
      case 0xd2:
        if (l < 5) return false;
        v = static_cast<int32_t>(load32(p_ + 1));
        p_ += 5;
        return v < -32768;
      case 0xd3:
        if (l < 9) return false;
        v = static_cast<int64_t>(load64(p_ + 1));
        p_ += 9;
        return v < -2147483648LL;
      default: return false;
    }
  }

  /// `record`: a BlockStored's (kept in rec_ when recording).
  bool hashes(bool record = false) {
    uint32_t n;
    if (!array_header(n) || n > left())
      return false;
    std::vector<uint64_t>* dst = nullptr;
    if (record && rec_) {
      ev_.hashes_at = static_cast<uint32_t>(rec_->hashes.size());
      ev_.hashes = n;
      dst = &rec_->hashes;
    }
    uint64_t v;
    for (uint32_t k = 0; k < n; ++k) {
      if (!uint_value(v))
        return false;
      if (dst)
        dst->push_back(v);
    }
    return true;
  }
  /// A BlockStored's parent_block_hash (recorded in ev_).
  bool opt_hash() {
    if (nil())
      return true;
    ev_.has_parent = true;
    return uint_value(ev_.parent);
  }
  /// `record`: a BlockStored's token_ids (kept in rec_, as int32, when
  /// recording), not one of lookahead_token_ids' lists.
  bool tokens(bool record = false) {
    uint32_t n;
    if (!array_header(n) || n > left())
      return false;
    std::vector<int32_t>* dst = nullptr;
    if (record && rec_) {
      ev_.tokens_at = static_cast<uint32_t>(rec_->tokens.size());
      ev_.tokens = n;
      dst = &rec_->tokens;
    }
    uint32_t k = 0;
    bool minimal = true; // checked once per array: no branch per token
    uint32_t high = 0;   // any bit 31: a value past int32
    for (; k < n && left() >= 5; ++k) {
      const auto u = msgpack_io::read_small_uint(p_);
      if (u.size == 0)
        break;
      minimal &= u.minimal;
      high |= u.value;
      if (dst)
        dst->push_back(static_cast<int32_t>(u.value));
      p_ += u.size;
    }
    if (!minimal)
      return false;
    bool narrow = (high >> 31) == 0;
    int64_t v;
    for (; k < n; ++k) {
      if (!int64_value(v))
        return false;
      narrow &= v >= INT32_MIN && v <= INT32_MAX;
      if (dst)
        dst->push_back(static_cast<int32_t>(v));
    }
    if (dst)
      ev_.narrow = narrow;
    return true;
  }
  bool opt_int() {
    int64_t v;
    return nil() || int64_value(v);
  }
  bool opt_str() { return nil() || str(); }
  bool block_size() {
    int64_t v;
    return int64_value(v) && v >= 0;
  }
  bool lookahead() {
    uint32_t n;
    if (!array_header(n) || n > left())
      return false;
    for (uint32_t k = 0; k < n; ++k)
      if (!tokens())
        return false;
    return true;
  }
  /// Relayed verbatim by the encoder, so any header widths are fine; what
  /// must hold is what the decoder checks: an array of (nil or array), every
  /// str inside valid UTF-8.
  bool extra_keys() {
    msgpack_io::reader r(p_, left());
    msgpack_io::item it;
    if (!r.next(it) || it.kind != msgpack_io::value_type::array)
      return false;
    bool bad_utf8 = false;
    for (uint32_t k = 0; k < it.len; ++k) {
      msgpack_io::item e;
      if (!r.next(e))
        return false;
      if (e.kind == msgpack_io::value_type::nil)
        continue;
      if (e.kind != msgpack_io::value_type::array || !r.skip(e.len, &bad_utf8))
        return false;
    }
    if (bad_utf8)
      return false;
    p_ += r.offset();
    return true;
  }

  /// A defaulted field (written only when set): its value, never nil.
  bool stored_optional(int f) {
    switch (f) {
      case sf_extra_keys: return extra_keys();
      case sf_group_idx:
      case sf_kv_cache_spec_sliding_window: {
        int64_t v;
        return int64_value(v);
      }
      case sf_kv_cache_spec_kind:
      case sf_locality:
      case sf_ownership:
      case sf_session_id: return str();
      case sf_lookahead_token_ids: return lookahead();
      default: return false;
    }
  }
  bool removed_optional(int f) {
    if (f == rf_group_idx) {
      int64_t v;
      return int64_value(v);
    }
    return str(); // locality, ownership
  }

  /// The defaulted keys, in declaration order, each at most once; returns
  /// how many were present. Stops at the first key that is not the next
  /// expected one (the caller then checks the entry count).
  template <typename F>
  uint32_t optionals(const fixstr* keys, int from, int to, uint32_t budget, bool& ok, F&& value) {
    uint32_t present = 0;
    for (int f = from; f < to && present < budget; ++f) {
      if (!lit(keys[f]))
        continue;
      if (!value(f)) {
        ok = false;
        return present;
      }
      ++present;
    }
    return present;
  }

  bool vllm_event() {
    if (p_ == end_)
      return false;
    uint8_t b = *p_;
    if (b == 0xde) { // BlockStored: map16 (vLLM 0.33)
      if (left() < 3)
        return false;
      uint32_t n = load16(p_ + 1);
      p_ += 3;
      return vllm_stored(n, false);
    }
    if (b >= 0x81 && b <= 0x8f) {
      uint32_t n = b & 0x0fu;
      ++p_;
      if (!lit(k_type))
        return false;
      if (n == 1)
        return lit(k_cleared);
      if (lit(k_stored)) // vLLM 0.32's BlockStored: fixmap
        return vllm_stored(n, true);
      if (n < 1 + removed_always || n > removed_max_entries)
        return false;
      if (!lit(k_removed) || !lit(removed_keys[rf_block_hashes]) || !hashes() ||
          !lit(removed_keys[rf_medium]) || !opt_str())
        return false;
      bool ok = true;
      uint32_t extra = optionals(removed_keys.data(), removed_always, rf_count,
                                 n - 1 - removed_always, ok,
                                 [this](int f) { return removed_optional(f); });
      return ok && extra == n - 1 - removed_always;
    }
    return false;
  }

  /// A BlockStored of `n` entries after its map header: vLLM 0.33's (map16,
  /// up to lookahead_token_ids) or 0.32's (fixmap, "type" and its tag
  /// already read, no lookahead_token_ids). The encoder writes one layout
  /// per batch (kv_event_batch::stored_layout), so a batch holds one only.
  bool vllm_stored(uint32_t n, bool v032) {
    if (v032 ? stored_map16_ : stored_fixmap_)
      return false;
    (v032 ? stored_fixmap_ : stored_map16_) = true;
    if (n < 1 + stored_always || n > (v032 ? stored_max_entries_032 : stored_max_entries))
      return false;
    ev_.stored = true;
    if ((!v032 && (!lit(k_type) || !lit(k_stored))) || !lit(stored_keys[sf_block_hashes]) ||
        !hashes(true) || !lit(stored_keys[sf_parent_block_hash]) || !opt_hash() ||
        !lit(stored_keys[sf_token_ids]) || !tokens(true))
      return false;
    // The rest (block_size, medium, extra_keys, ...) is usually the
    // previous BlockStored's bytes: canonical then as it was there.
    ev_.tail_at = static_cast<uint32_t>(p_ - begin_);
    if (tail_as_before(n)) {
      ev_.same_tail = prev_stored_; // the memo is that event's tail then
      return true;
    }
    const uint8_t* tail = p_;
    if (!lit(stored_keys[sf_block_size]) || !block_size() || !lit(stored_keys[sf_lora_id]) ||
        !opt_int() || !lit(stored_keys[sf_medium]) || !opt_str() ||
        !lit(stored_keys[sf_lora_name]) || !opt_str())
      return false;
    bool ok = true;
    uint32_t extra = optionals(stored_keys.data(), stored_always,
                               v032 ? stored_fields_032 : sf_vllm_count,
                               n - 1 - stored_always, ok,
                               [this](int f) { return stored_optional(f); });
    if (!ok || extra != n - 1 - stored_always)
      return false;
    remember_tail(tail, n);
    return true;
  }

  /// Whether the bytes from here are the last canonical BlockStored tail
  /// (what follows token_ids) of an event with as many entries: the same
  /// bytes in the same place are canonical again. Steps over them if so.
  bool tail_as_before(uint32_t entries) {
    if (!memo_ || entries != memo_entries_ || left() < memo_size_ ||
        std::memcmp(p_, memo_, memo_size_) != 0)
      return false;
    p_ += memo_size_;
    return true;
  }
  void remember_tail(const uint8_t* tail, uint32_t entries) {
    memo_ = tail;
    memo_size_ = static_cast<size_t>(p_ - tail);
    memo_entries_ = entries;
  }

  bool tokenspeed_event() {
    if (byte(0x95)) {
      ev_.stored = true;
      if (!lit(k_stored) || !hashes(true) || !opt_hash() || !tokens(true))
        return false;
      // The tail is block_size alone: memoized as vLLM's is.
      ev_.tail_at = static_cast<uint32_t>(p_ - begin_);
      if (tail_as_before(1)) {
        ev_.same_tail = prev_stored_;
        return true;
      }
      const uint8_t* tail = p_;
      if (!block_size())
        return false;
      remember_tail(tail, 1);
      return true;
    }
    if (byte(0x92))
      return lit(k_removed) && hashes();
    return byte(0x91) && lit(k_cleared);
  }

  static constexpr fixstr k_type = encoded(type_key);
  static constexpr fixstr k_stored = encoded(tag_stored);
  static constexpr fixstr k_removed = encoded(tag_removed);
  static constexpr fixstr k_cleared = encoded(tag_cleared);
  static constexpr std::array<fixstr, sf_count> stored_keys = encoded_all(stored_names);
  static constexpr std::array<fixstr, rf_count> removed_keys = encoded_all(removed_names);

  const uint8_t* begin_;
  const uint8_t* p_;
  const uint8_t* end_;
  /// The last canonical BlockStored tail (either dialect) and its event's
  /// entry count.
  const uint8_t* memo_ = nullptr;
  size_t memo_size_ = 0;
  uint32_t memo_entries_ = 0;
  // What is recorded for the indexer (rec_ may be null: nothing is).
  canonical_events* rec_;
  canonical_event ev_;      ///< the event being read
  bool prev_stored_ = false; ///< the event before it was a BlockStored
  /// The batch has a map16 (vLLM 0.33) / fixmap (0.32) BlockStored.
  bool stored_map16_ = false;
  bool stored_fixmap_ = false;
};

} // namespace

std::optional<canonical_batch> check_canonical_event_batch(const uint8_t* data, size_t size,
                                                           event_dialect dialect,
                                                           canonical_events* events) {
  canonical_batch c;
  if (!canonical_walker(data, size, events).batch(dialect, c))
    return std::nullopt;
  return c;
}

void encode_canonical_with_rank(const uint8_t* data, const canonical_batch& c,
                                std::optional<int64_t> dp_rank, std::string& out) {
  out.append(reinterpret_cast<const char*>(data), c.rank_offset);
  msgpack_io::writer w(out);
  if (dp_rank)
    w.sint(*dp_rank);
  else
    w.nil();
}

} // namespace kvs
