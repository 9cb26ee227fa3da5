// KV event batch decoding: a streaming msgpack_io::reader straight into the
// typed structs. No intermediate object tree (for a vLLM 16x16 batch
// msgpack-c's unpack alone, before any conversion, ran ~3200 instructions per
// event; this whole typed decode ~2850), no recursion, and a bad event is
// stepped over and reported on its own. Never throws.
#include "events_wire/kv_event_codec.hpp"
#include "events_wire/kv_event_schema.hpp"
#include "msgpack/msgpack_reader.hpp"
#include "msgpack/utf8.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string_view>
#include <utility>

namespace kvs {
namespace {

using namespace event_schema;
using mkind = msgpack_io::value_type;
using mitem = msgpack_io::item;
using msgpack_io::kind_name;
using msgpack_io::reader;

// ---------------------------------------------------------------------------
// event parsing
// ---------------------------------------------------------------------------

enum class verdict { ok, drop, fatal };

/// Parses events off a shared cursor. On `drop` it leaves kind/detail set
/// (detail without the "event i: " prefix); on `fatal` the cursor's error.
class event_parser {
public:
  explicit event_parser(reader& r) : r_(r) {}

  /// Decodes one event into `slot`, which holds nothing meaningful unless
  /// the verdict is ok.
  verdict parse(kv_event& slot) {
    stored_032_ = false;
    mitem head;
    const size_t at = r_.offset();
    if (!r_.next(head))
      return verdict::fatal;
    if (head.kind == mkind::array)
      return parse_positional(head.len, slot);
    if (head.kind == mkind::map)
      return parse_map(head.len, r_.offset() - at == 1, slot);
    return drop("bad_event", std::string("expected map or array, got ") + kind_name(head.kind));
  }

  const char* kind() const { return kind_; }
  std::string& detail() { return detail_; }
  /// The event just parsed is a BlockStored as vLLM 0.32's msgspec writes
  /// it: a fixmap, "type" first, then every field 0.32's struct declares
  /// without a default and any of its defaulted ones, in declaration order,
  /// no other key (no lookahead_token_ids, no SGLang cache_salt, nothing
  /// unknown).
  bool stored_032() const { return stored_032_; }

private:
  enum class tag { stored, removed, cleared };

  verdict drop(const char* kind, std::string detail) {
    kind_ = kind;
    detail_ = std::move(detail);
    return verdict::drop;
  }
  verdict bad_field(name_ref field, const std::string& what) {
    return drop("bad_field", "field '" + std::string(field.s, field.n) + "': " + what);
  }
  verdict wrong_type(name_ref field, const char* expected, const mitem& got) {
    return bad_field(field, std::string("expected ") + expected + ", got " + kind_name(got.kind));
  }
  verdict fatal() { return verdict::fatal; }

  verdict read_tag(const mitem& it, tag& out) {
    if (it.kind != mkind::str)
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
    return verdict::ok;
  }

  // -- positional: [tag, field0, field1, ...] -------------------------------
  verdict parse_positional(uint32_t count, kv_event& slot) {
    if (count == 0)
      return drop("bad_event", "empty array");
    mitem it;
    if (!r_.next(it))
      return fatal();
    tag t;
    verdict s = read_tag(it, t);
    if (s != verdict::ok)
      return s;
    uint64_t nfields = count - 1;
    switch (t) {
      case tag::stored: {
        // Decoded in place: the struct is large, a move would cost more.
        auto& e = slot.emplace<block_stored>();
        return positional_fields(nfields, sf_vllm_count, stored_required, stored_names,
                                 [&](int f) { return stored_field_value(f, e); });
      }
      case tag::removed: {
        auto& e = slot.emplace<block_removed>();
        return positional_fields(nfields, rf_count, removed_required, removed_names,
                                 [&](int f) { return removed_field_value(f, e); });
      }
      case tag::cleared:
        if (!r_.skip(nfields))
          return fatal();
        slot.emplace<all_blocks_cleared>();
        return verdict::ok;
    }
    return fatal();
  }

  template <typename F>
  verdict positional_fields(uint64_t nfields, int known, int required, const name_ref* names,
                           F&& field) {
    if (nfields < static_cast<uint64_t>(required))
      return bad_field(names[nfields], "missing");
    uint64_t n = nfields < static_cast<uint64_t>(known) ? nfields : known;
    for (uint64_t f = 0; f < n; ++f) {
      verdict s = field(static_cast<int>(f));
      if (s != verdict::ok)
        return s;
    }
    // Fields a newer engine appended: ignored, as msgspec does.
    return r_.skip(nfields - n) ? verdict::ok : fatal();
  }

  // -- tagged map: {"type": tag, field: value, ...} -------------------------
  verdict parse_map(uint32_t pairs, bool fixmap, kv_event& slot) {
    size_t body = r_.offset();
    tag t;
    uint32_t at = 0;
    verdict s = find_tag(pairs, t, at);
    if (s != verdict::ok)
      return s;
    if (at == 0) {
      --pairs; // the usual case: carry on after the leading "type" pair
    } else {
      r_.seek(body); // "type" comes later: read everything, skipping it
    }
    switch (t) {
      case tag::stored: {
        // Decoded in place: the struct is large, a move would cost more.
        auto& e = slot.emplace<block_stored>();
        map_shape shape;
        s = map_fields(pairs, sf_count, stored_required, stored_names,
                       [&](int f) { return stored_field_value(f, e); }, &shape);
        constexpr uint32_t always = (1u << stored_always) - 1;
        constexpr uint32_t not_032 = (1u << sf_lookahead_token_ids) | (1u << sf_cache_salt);
        stored_032_ = s == verdict::ok && fixmap && at == 0 && shape.ordered &&
                      (shape.seen & always) == always && !(shape.seen & not_032);
        return s;
      }
      case tag::removed: {
        auto& e = slot.emplace<block_removed>();
        return map_fields(pairs, rf_count, removed_required, removed_names,
                          [&](int f) { return removed_field_value(f, e); });
      }
      case tag::cleared:
        // No fields, but msgspec still insists on str keys.
        s = map_fields(pairs, 0, 0, nullptr, [&](int) { return fatal(); });
        if (s == verdict::ok)
          slot.emplace<all_blocks_cleared>();
        return s;
    }
    return fatal();
  }

  /// msgspec finds the tag wherever it is in the map; "type" is first in
  /// everything msgspec writes, so the scan normally stops at once.
  verdict find_tag(uint32_t pairs, tag& t, uint32_t& at) {
    mitem key;
    for (uint32_t k = 0; k < pairs; ++k) {
      at = k;
      if (!r_.next(key))
        return fatal();
      if (key.kind != mkind::str)
        return drop("bad_event", std::string("map key of type ") + kind_name(key.kind));
      if (same(key, type_key)) {
        mitem value;
        if (!r_.next(value))
          return fatal();
        return read_tag(value, t);
      }
      if (!r_.skip(1))
        return fatal();
    }
    return drop("bad_event", "map without a 'type' key");
  }

  /// The keys map_fields() found: which fields (bit f), and whether they
  /// came in declaration order, each once, with no other key among them.
  struct map_shape {
    uint32_t seen = 0;
    bool ordered = true;
  };

  template <typename F>
  verdict map_fields(uint32_t pairs, int known, int required, const name_ref* names, F&& field,
                     map_shape* shape = nullptr) {
    uint32_t seen = 0;
    bool ordered = true;
    int expect = 0; // keys usually come in declaration order: try that first
    mitem key;
    for (uint32_t k = 0; k < pairs; ++k) {
      if (!r_.next(key))
        return fatal();
      if (key.kind != mkind::str)
        return drop("bad_event", std::string("map key of type ") + kind_name(key.kind));
      int f = expect;
      if (f >= known || !same(key, names[f])) {
        f = 0;
        while (f < known && !same(key, names[f]))
          ++f;
      }
      if (f == known) { // "type", or a field from a newer engine
        ordered = false;
        if (!r_.skip(1))
          return fatal();
        continue;
      }
      verdict s = field(f);
      if (s != verdict::ok)
        return s;
      ordered &= f >= expect; // after the field before it, and not seen yet
      seen |= 1u << f;
      expect = f + 1;
    }
    if (shape) {
      shape->seen = seen;
      shape->ordered = ordered;
    }
    for (int f = 0; f < required; ++f)
      if (!(seen & (1u << f)))
        return bad_field(names[f], "missing");
    return verdict::ok;
  }

  // -- fields ---------------------------------------------------------------
  verdict stored_field_value(int f, block_stored& e) {
    name_ref name = stored_names[f];
    switch (f) {
      case sf_block_hashes: return hashes(name, e.block_hashes);
      case sf_parent_block_hash: return opt_hash(name, e.parent_block_hash);
      case sf_token_ids: return tokens(name, e.token_ids);
      case sf_block_size: {
        std::optional<int64_t> v;
        verdict s = opt_int(name, v, false);
        if (s == verdict::ok && v && *v < 0)
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
      case sf_lookahead_token_ids: return lookahead(name, e.lookahead_token_ids);
      case sf_cache_salt: return opt_str(name, e.cache_salt);
      default: return fatal();
    }
  }

  verdict removed_field_value(int f, block_removed& e) {
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
  static bool hash_value(const mitem& it, uint64_t& out) {
    switch (it.kind) {
      case mkind::uint: out = it.u; return true;
      case mkind::sint: out = static_cast<uint64_t>(it.i); return true;
      case mkind::bin:
      case mkind::str: out = low64_big_endian(it.ptr, it.len); return true;
      default: return false;
    }
  }

  verdict hashes(name_ref name, std::vector<uint64_t>& out) {
    mitem it;
    if (!r_.next(it))
      return fatal();
    if (it.kind != mkind::array)
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
    return verdict::ok;
  }

  verdict opt_hash(name_ref name, std::optional<uint64_t>& out) {
    mitem it;
    if (!r_.next(it))
      return fatal();
    if (it.kind == mkind::nil) {
      out.reset();
      return verdict::ok;
    }
    uint64_t h;
    if (!hash_value(it, h))
      return wrong_type(name, "int, bytes or nil", it);
    out = h;
    return verdict::ok;
  }

  /// An int64 from an item; false (with `why`) when it is not one.
  static bool int64_value(const mitem& it, int64_t& out, const char*& why) {
    if (it.kind == mkind::sint) {
      out = it.i;
      return true;
    }
    if (it.kind == mkind::uint) {
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

  verdict tokens(name_ref name, std::vector<int64_t>& out) {
    mitem it;
    if (!r_.next(it))
      return fatal();
    if (it.kind != mkind::array)
      return wrong_type(name, "array", it);
    const uint32_t n = it.len;
    if (!r_.fits(n))
      return fatal();
    out.resize(n);
    int64_t* dst = out.data();
    for (uint32_t k = r_.small_uints(dst, n); k < n; ++k) {
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
    return verdict::ok;
  }

  verdict opt_int(name_ref name, std::optional<int64_t>& out, bool nil_ok) {
    mitem it;
    if (!r_.next(it))
      return fatal();
    if (it.kind == mkind::nil && nil_ok) {
      out.reset();
      return verdict::ok;
    }
    int64_t v;
    const char* why;
    if (!int64_value(it, v, why))
      return why ? bad_field(name, why) : wrong_type(name, nil_ok ? "int or nil" : "int", it);
    out = v;
    return verdict::ok;
  }

  verdict opt_str(name_ref name, std::optional<std::string>& out) {
    mitem it;
    if (!r_.next(it))
      return fatal();
    if (it.kind == mkind::nil) {
      out.reset();
      return verdict::ok;
    }
    if (it.kind != mkind::str)
      return wrong_type(name, "str or nil", it);
    if (!valid_utf8(it.ptr, it.len))
      return bad_field(name, "invalid UTF-8");
    out.emplace(reinterpret_cast<const char*>(it.ptr), it.len);
    return verdict::ok;
  }

  /// vLLM 0.33: list[list[int]] | None.
  verdict lookahead(name_ref name, std::optional<std::vector<std::vector<int64_t>>>& out) {
    mitem it;
    if (!r_.next(it))
      return fatal();
    if (it.kind == mkind::nil) {
      out.reset();
      return verdict::ok;
    }
    if (it.kind != mkind::array)
      return wrong_type(name, "array or nil", it);
    const uint32_t n = it.len;
    if (!r_.fits(n))
      return fatal();
    auto& lists = out.emplace(n);
    for (uint32_t k = 0; k < n; ++k) {
      verdict s = tokens(name, lists[k]);
      if (s != verdict::ok) {
        if (s == verdict::drop)
          detail_ += " (in element " + std::to_string(k) + ")";
        return s;
      }
    }
    return verdict::ok;
  }

  /// vLLM: list[tuple[Any, ...] | None] | None. Kept as raw msgpack.
  verdict extra_keys(name_ref name, std::optional<std::string>& out) {
    size_t start = r_.offset();
    mitem it;
    if (!r_.next(it))
      return fatal();
    if (it.kind == mkind::nil) {
      out.reset();
      return verdict::ok;
    }
    if (it.kind != mkind::array)
      return wrong_type(name, "array or nil", it);
    uint32_t n = it.len;
    bool bad_utf8 = false;
    for (uint32_t k = 0; k < n; ++k) {
      if (!r_.next(it))
        return fatal();
      if (it.kind == mkind::nil)
        continue;
      if (it.kind != mkind::array)
        return bad_field(name, "element " + std::to_string(k) + ": expected array or nil, got " +
                                   kind_name(it.kind));
      if (!r_.skip(it.len, &bad_utf8))
        return fatal();
    }
    if (bad_utf8)
      return bad_field(name, "invalid UTF-8 in a str");
    out.emplace(reinterpret_cast<const char*>(r_.at(start)), r_.offset() - start);
    return verdict::ok;
  }

  reader& r_;
  const char* kind_ = "";
  std::string detail_;
  bool stored_032_ = false;
};

error not_a_batch(std::string detail) {
  return error{"not_a_batch", std::move(detail)};
}

/// One walk over a payload frame, shared by the decoders below: open() reads
/// the envelope up to the events, event() decodes the next one, close() reads
/// dp_rank and refuses trailing bytes. Errors are "not_a_batch".
class batch_walker {
public:
  batch_walker(const uint8_t* data, size_t size) : r_(data, size), parser_(r_) {}

  /// Reads [ts, [ and returns the number of events the frame claims.
  expected<uint32_t> open(double& ts) {
    mitem it;
    if (!r_.next(it))
      return not_a_batch("envelope: " + r_.error());
    if (it.kind != mkind::array)
      return not_a_batch(std::string("envelope: expected array, got ") + kind_name(it.kind));
    if (it.len != 2 && it.len != 3)
      return not_a_batch("envelope: expected 2 or 3 elements, got " + std::to_string(it.len));
    envelope_len_ = it.len;
    if (!r_.next(it))
      return not_a_batch("ts: " + r_.error());
    switch (it.kind) {
      case mkind::float32:
      case mkind::float64: ts = it.f; break;
      case mkind::uint: ts = static_cast<double>(it.u); break;
      case mkind::sint: ts = static_cast<double>(it.i); break;
      default: return not_a_batch(std::string("ts: expected float, got ") + kind_name(it.kind));
    }
    if (!r_.next(it))
      return not_a_batch("events: " + r_.error());
    if (it.kind != mkind::array)
      return not_a_batch(std::string("events: expected array, got ") + kind_name(it.kind));
    return it.len;
  }

  size_t remaining() const { return r_.remaining(); }
  /// The event event() just decoded is vLLM 0.32's BlockStored map.
  bool stored_032() const { return parser_.stored_032(); }

  /// Decodes event k into `slot`: true when it decoded, false when it was
  /// dropped (its error appended to `dropped`, the cursor past it).
  expected<bool> event(uint32_t k, kv_event& slot, std::vector<error>& dropped) {
    size_t start = r_.offset();
    switch (parser_.parse(slot)) {
      case verdict::ok: return true;
      case verdict::drop:
        // Step over the rest of the bad event so the next one can decode.
        r_.seek(start);
        if (!r_.skip(1))
          return not_a_batch("event " + std::to_string(k) + ": " + r_.error());
        dropped.push_back(
            error{parser_.kind(), "event " + std::to_string(k) + ": " + parser_.detail()});
        return false;
      case verdict::fatal: break;
    }
    return not_a_batch("event " + std::to_string(k) + ": " + r_.error());
  }

  /// Reads dp_rank (when the envelope has it) and the end of the frame.
  status close(std::optional<int64_t>& dp_rank) {
    mitem it;
    if (envelope_len_ == 3) {
      if (!r_.next(it))
        return not_a_batch("dp_rank: " + r_.error());
      if (it.kind == mkind::sint) {
        dp_rank = it.i;
      } else if (it.kind == mkind::uint &&
                 it.u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        dp_rank = static_cast<int64_t>(it.u);
      } else if (it.kind != mkind::nil) {
        return not_a_batch(std::string("dp_rank: expected int or nil, got ") +
                           (it.kind == mkind::uint ? "int out of int64 range" : kind_name(it.kind)));
      }
    }
    if (r_.remaining() != 0)
      return not_a_batch(std::to_string(r_.remaining()) +
                         " trailing bytes after the batch at byte " + std::to_string(r_.offset()));
    return {};
  }

private:
  reader r_;
  event_parser parser_;
  uint32_t envelope_len_ = 0;
};

} // namespace

expected<event_decode_result> decode_event_batch(const uint8_t* data, size_t size) {
  batch_walker w(data, size);
  event_decode_result result;
  auto n = w.open(result.batch.ts);
  if (!n)
    return n.error_value();
  // Reserved at once (growing a vector of ~450-byte events by doubling
  // moved every event several times and was a fifth of the indexer's time at
  // 256 events per batch), but only for events the payload can hold: no
  // event is shorter than min_event_bytes, so a claimed count beyond what
  // the bytes left could carry reserves no more than decoding real events
  // would allocate anyway; and at most max_reserved_events (~2 MB), past
  // which a batch grows as it is actually decoded.
  constexpr size_t min_event_bytes = 8;
  constexpr size_t max_reserved_events = 4096;
  auto& events = result.batch.events;
  events.reserve(std::min<size_t>({*n, w.remaining() / min_event_bytes, max_reserved_events}));
  // vLLM 0.32's layout when every BlockStored kept is 0.32's (and there is
  // one): the encoder then writes them as 0.32 did.
  bool stored = false, all_032 = true;
  for (uint32_t k = 0; k < *n; ++k) {
    // The event is decoded where it will stay: a move of the ~470-byte
    // struct would cost more.
    auto got = w.event(k, events.emplace_back(all_blocks_cleared{}), result.dropped);
    if (!got)
      return got.error_value();
    if (!*got)
      events.pop_back();
    else if (std::holds_alternative<block_stored>(events.back())) {
      stored = true;
      all_032 &= w.stored_032();
    }
  }
  if (stored && all_032)
    result.batch.stored_layout = vllm_stored_layout::v0_32;
  if (auto closed = w.close(result.batch.dp_rank); !closed)
    return closed.error_value();
  return result;
}

expected<kv_event> decode_one_event(const uint8_t* data, size_t size) {
  reader r(data, size);
  event_parser parser(r);
  kv_event ev;
  switch (parser.parse(ev)) {
    case verdict::ok:
      if (r.remaining() != 0)
        return error{"bad_event", std::to_string(r.remaining()) + " bytes after the event"};
      return ev;
    case verdict::drop: return error{parser.kind(), parser.detail()};
    case verdict::fatal: break;
  }
  return error{"bad_event", r.error()};
}

bool clears_all_blocks(const kv_event_batch& batch) {
  auto is_clear = [](const kv_event& e) { return std::holds_alternative<all_blocks_cleared>(e); };
  if (!batch.wire)
    return std::any_of(batch.events.begin(), batch.events.end(), is_clear);
  const auto& bytes = *batch.wire->bytes;
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  if (!batch.wire->events) { // no record of the check: decode it whole
    auto res = decode_event_batch(data, bytes.size());
    return res && std::any_of(res->batch.events.begin(), res->batch.events.end(), is_clear);
  }
  // On the live path: an event whose bytes do not hold the tag is not
  // decoded (BlockRemoved is the common one), the rest are confirmed.
  static constexpr std::string_view tag = "AllBlocksCleared";
  for (const auto& ev : batch.wire->events->events) {
    if (ev.stored || ev.at + static_cast<size_t>(ev.size) > bytes.size())
      continue;
    if (std::string_view{bytes.data() + ev.at, ev.size}.find(tag) == std::string_view::npos)
      continue;
    if (auto one = decode_one_event(data + ev.at, ev.size); one && is_clear(*one))
      return true;
  }
  return false;
}

std::optional<vllm_stored_layout> stored_layout_of(const kv_event_batch& batch) {
  if (batch.wire)
    return batch.wire->layout.stored_layout;
  for (const auto& e : batch.events)
    if (std::holds_alternative<block_stored>(e))
      return batch.stored_layout;
  return std::nullopt;
}

void decode_wire_events(kv_event_batch& batch) {
  if (!batch.wire)
    return;
  const std::string& bytes = *batch.wire->bytes;
  auto res = decode_event_batch(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  // A canonical payload always decodes whole (test_events_passthrough).
  if (res) {
    batch.events = std::move(res->batch.events);
    batch.stored_layout = res->batch.stored_layout;
  }
  batch.wire.reset();
}

} // namespace kvs
