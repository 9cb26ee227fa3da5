// KV event codec: golden bytes from msgspec (tests/unit/events_golden.hpp,
// made by tests/tools/make_event_goldens.py), roundtrips, and every malformed
// input we could think of.
#include "events_wire/kv_event_codec.hpp"
#include "tests/unit/events_golden.hpp"
#include "tests/unit/frame_bytes.hpp"

#include <doctest/doctest.h>
#include <msgpack.hpp>

#include <cstdio>
#include <functional>
#include <sstream>

using namespace kvs;
using kvs_test::frame;
using kvs_test::hex;

namespace {

// -- helpers -----------------------------------------------------------------

expected<event_decode_result> decode(const std::string& s) {
  return decode_event_batch(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

event_decode_result decode_ok(const std::string& s) {
  auto r = decode(s);
  if (auto* e = r ? nullptr : &r.error_value())
    FAIL("unexpected error ", e->kind, ": ", e->detail);
  return std::move(r).value();
}

error decode_err(const std::string& s) {
  auto r = decode(s);
  if (r.has_value())
    FAIL("decoded, expected an error: ", hex(s));
  return std::move(r).error_value();
}

std::string encode(const kv_event_batch& b, event_dialect d) {
  std::string out;
  encode_event_batch(b, d, out);
  return out;
}

template <typename T>
std::string opt(const std::optional<T>& v) {
  if (!v)
    return "None";
  std::ostringstream o;
  o << *v;
  return o.str();
}

template <typename T>
std::string list(const std::vector<T>& v) {
  std::ostringstream o;
  o << "[";
  for (const T& x : v)
    o << x << ",";
  o << "]";
  return o.str();
}

/// Every field, as text: equal descriptions <=> equal batches, and a readable
/// diff when not.
std::string describe(const kv_event& e) {
  std::ostringstream o;
  if (auto* s = std::get_if<block_stored>(&e)) {
    o << "BlockStored(" << list(s->block_hashes) << " parent=" << opt(s->parent_block_hash)
      << " tokens=" << list(s->token_ids) << " bs=" << s->block_size << " lora=" << opt(s->lora_id)
      << " medium=" << opt(s->medium) << " lora_name=" << opt(s->lora_name)
      << " extra=" << (s->extra_keys_msgpack ? hex(*s->extra_keys_msgpack) : "None")
      << " group=" << opt(s->group_idx) << " kind=" << opt(s->kv_cache_spec_kind)
      << " window=" << opt(s->kv_cache_spec_sliding_window) << " locality=" << opt(s->locality)
      << " ownership=" << opt(s->ownership) << " session=" << opt(s->session_id)
      << " lookahead=";
    if (s->lookahead_token_ids) {
      for (const auto& l : *s->lookahead_token_ids)
        o << list(l);
    } else {
      o << "None";
    }
    o << " salt=" << opt(s->cache_salt) << ")";
  } else if (auto* r = std::get_if<block_removed>(&e)) {
    o << "BlockRemoved(" << list(r->block_hashes) << " medium=" << opt(r->medium)
      << " group=" << opt(r->group_idx) << " locality=" << opt(r->locality)
      << " ownership=" << opt(r->ownership) << ")";
  } else {
    o << "AllBlocksCleared()";
  }
  return o.str();
}

std::string describe(const kv_event_batch& b) {
  std::ostringstream o;
  o.precision(17);
  o << "ts=" << b.ts << " dp=" << opt(b.dp_rank) << "\n";
  for (const kv_event& e : b.events)
    o << "  " << describe(e) << "\n";
  return o.str();
}

/// msgpack bytes built by hand, for inputs msgspec would never write.
struct mp {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk{buf};
  std::string str() const { return std::string(buf.data(), buf.size()); }
};

/// [ts, [<event written by f>...], 0]
std::string batch_of(std::initializer_list<std::function<void(msgpack::packer<msgpack::sbuffer>&)>> events) {
  mp m;
  m.pk.pack_array(3);
  m.pk.pack_double(1.5); // non-integral: pack_double writes integral doubles as ints
  m.pk.pack_array(static_cast<uint32_t>(events.size()));
  for (auto& f : events)
    f(m.pk);
  m.pk.pack_int(0);
  return m.str();
}

void key(msgpack::packer<msgpack::sbuffer>& pk, const char* k) { pk.pack(std::string(k)); }

// -- the values the golden script uses -------------------------------------

constexpr double ts = 1757500000.25;
constexpr uint64_t h_big = 0xFEDCBA9876543210ull;
constexpr uint64_t u64_max = ~0ull;
const std::vector<uint64_t> hashes_widths = {h_big, 1, 200, 300, 70000, 1ull << 40};
const std::vector<int64_t> tokens_a = {128000, 128006, 9125, 128007, 271, 0,     1,  127,
                                       128,    255,    256,  65535,  65536, 128255, 42, 2};
const std::vector<int64_t> tokens_neg = {-1, -32, -33, -200, -40000, -(1ll << 40), 5};

block_stored stored(std::vector<uint64_t> hashes, std::optional<uint64_t> parent,
                    std::vector<int64_t> tokens, int64_t block_size) {
  block_stored s;
  s.block_hashes = std::move(hashes);
  s.parent_block_hash = parent;
  s.token_ids = std::move(tokens);
  s.block_size = block_size;
  return s;
}

block_removed removed(std::vector<uint64_t> hashes, std::optional<std::string> medium) {
  block_removed r;
  r.block_hashes = std::move(hashes);
  r.medium = std::move(medium);
  return r;
}

kv_event_batch make(double t, std::vector<kv_event> events, std::optional<int64_t> dp) {
  kv_event_batch b;
  b.ts = t;
  b.events = std::move(events);
  b.dp_rank = dp;
  return b;
}

/// msgpack of [None, ("lora1", 5), ("x"*40, b"\x01\x02")]
std::string extra_keys_bytes() {
  mp m;
  m.pk.pack_array(3);
  m.pk.pack_nil();
  m.pk.pack_array(2);
  m.pk.pack(std::string("lora1"));
  m.pk.pack_int(5);
  m.pk.pack_array(2);
  m.pk.pack(std::string(40, 'x'));
  m.pk.pack_bin(2);
  m.pk.pack_bin_body("\x01\x02", 2);
  return m.str();
}

block_stored stored_all_fields() {
  block_stored s = stored({h_big}, u64_max, tokens_neg, 16);
  s.lora_id = 7;
  s.medium = "CPU";
  s.lora_name = "adapter-a";
  s.extra_keys_msgpack = extra_keys_bytes();
  s.group_idx = 1;
  s.kv_cache_spec_kind = "sliding_window";
  s.kv_cache_spec_sliding_window = 4096;
  s.locality = "REMOTE";
  s.ownership = "tier-2";
  s.session_id = "sess-\xc3\xa9";
  s.lookahead_token_ids = std::vector<std::vector<int64_t>>{{5, 70000, -1}};
  return s;
}

kv_event_batch vllm_stored_required() {
  block_stored s = stored(hashes_widths, std::nullopt, tokens_a, 16);
  s.medium = "GPU";
  return make(ts, {s}, 0);
}

kv_event_batch vllm_stored_all_fields() { return make(ts, {stored_all_fields()}, 3); }

kv_event_batch vllm_removed_required() { return make(ts, {removed({h_big, 5}, "GPU")}, 1); }

kv_event_batch vllm_removed_all_fields() {
  block_removed r = removed({7}, std::nullopt);
  r.group_idx = 2;
  r.locality = "LOCAL";
  r.ownership = "tier-2";
  return make(ts, {r}, 0);
}

kv_event_batch vllm_cleared() { return make(0.0, {all_blocks_cleared{}}, 0); }

kv_event_batch vllm_mixed_no_rank() {
  return make(-2.5, {stored({}, 3, {}, 0), removed({h_big}, "STORAGE"), all_blocks_cleared{}},
              std::nullopt);
}

kv_event_batch vllm_16x16() {
  std::vector<kv_event> events;
  std::optional<uint64_t> parent;
  for (int i = 0; i < 16; ++i) {
    uint64_t h = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1);
    std::vector<int64_t> tokens;
    for (int t = 0; t < 16; ++t)
      tokens.push_back(1000 * i + t);
    block_stored s = stored({h}, parent, tokens, 16);
    s.medium = "GPU";
    events.emplace_back(s);
    parent = h;
  }
  return make(ts, events, 0);
}

kv_event_batch vllm_empty() { return make(ts, {}, 7); }

kv_event_batch tokenspeed_seed_example() {
  return make(1.5, {stored({123}, std::nullopt, {1, 2}, 2), removed({123}, std::nullopt)}, 2);
}

kv_event_batch tokenspeed_all_types() {
  return make(ts,
              {stored(hashes_widths, h_big, tokens_a, 16), removed({h_big, 5}, std::nullopt),
               all_blocks_cleared{}},
              std::nullopt);
}

struct golden_case {
  const char* name;
  std::string bytes;
  std::function<kv_event_batch()> batch;
  event_dialect dialect;
};

std::vector<golden_case> goldens() {
  namespace g = kvs_golden;
  return {
      {"vllm_stored_required", frame(g::vllm_stored_required), vllm_stored_required,
       event_dialect::vllm},
      {"vllm_stored_all_fields", frame(g::vllm_stored_all_fields), vllm_stored_all_fields,
       event_dialect::vllm},
      {"vllm_removed_required", frame(g::vllm_removed_required), vllm_removed_required,
       event_dialect::vllm},
      {"vllm_removed_all_fields", frame(g::vllm_removed_all_fields), vllm_removed_all_fields,
       event_dialect::vllm},
      {"vllm_cleared", frame(g::vllm_cleared), vllm_cleared, event_dialect::vllm},
      {"vllm_mixed_no_rank", frame(g::vllm_mixed_no_rank), vllm_mixed_no_rank,
       event_dialect::vllm},
      {"vllm_16x16", frame(g::vllm_16x16), vllm_16x16, event_dialect::vllm},
      {"vllm_empty", frame(g::vllm_empty), vllm_empty, event_dialect::vllm},
      {"tokenspeed_seed_example", frame(g::tokenspeed_seed_example), tokenspeed_seed_example,
       event_dialect::tokenspeed},
      {"tokenspeed_all_types", frame(g::tokenspeed_all_types), tokenspeed_all_types,
       event_dialect::tokenspeed},
  };
}
} // namespace

// -- golden bytes ---------------------------------------------------------------

TEST_CASE("encoder writes exactly msgspec's bytes for every event type in both dialects") {
  for (const golden_case& c : goldens()) {
    CAPTURE(std::string(c.name));
    CHECK(hex(encode(c.batch(), c.dialect)) == hex(c.bytes));
  }
}

TEST_CASE("encoder drops vLLM-only fields in the tokenspeed dialect") {
  CHECK(hex(encode(vllm_stored_all_fields(), event_dialect::tokenspeed)) ==
        hex(frame(kvs_golden::tokenspeed_from_all_fields)));
}

TEST_CASE("encoder appends to the caller's buffer") {
  std::string out = "prefix";
  encode_event_batch(vllm_cleared(), event_dialect::vllm, out);
  encode_event_batch(vllm_cleared(), event_dialect::vllm, out);
  std::string one = frame(kvs_golden::vllm_cleared);
  CHECK(hex(out) == hex("prefix" + one + one));
}

TEST_CASE("decoder reads every golden back into the batch it was made from") {
  for (const golden_case& c : goldens()) {
    CAPTURE(std::string(c.name));
    event_decode_result r = decode_ok(c.bytes);
    CHECK(r.dropped.empty());
    CHECK(describe(r.batch) == describe(c.batch()));
  }
}

TEST_CASE("roundtrip: decode then encode in the same dialect gives the same bytes") {
  for (const golden_case& c : goldens()) {
    CAPTURE(std::string(c.name));
    CHECK(hex(encode(decode_ok(c.bytes).batch, c.dialect)) == hex(c.bytes));
  }
}

TEST_CASE("roundtrip across dialects keeps what tokenspeed can carry") {
  event_decode_result r = decode_ok(frame(kvs_golden::tokenspeed_all_types));
  event_decode_result back = decode_ok(encode(r.batch, event_dialect::vllm));
  CHECK(describe(back.batch) == describe(tokenspeed_all_types()));
}

TEST_CASE("u64 hashes >= 2^63 travel as msgpack uint64 and come back unchanged") {
  std::string bytes = encode(make(1.0, {removed({h_big, u64_max, 1ull << 63}, "GPU")}, 0),
                             event_dialect::vllm);
  CHECK(hex(bytes).find("cf fe dc ba 98 76 54 32 10") != std::string::npos);
  CHECK(hex(bytes).find("cf ff ff ff ff ff ff ff ff") != std::string::npos);
  CHECK(hex(bytes).find("cf 80 00 00 00 00 00 00 00") != std::string::npos);
  auto r = decode_ok(bytes);
  REQUIRE(r.batch.events.size() == 1);
  CHECK(std::get<block_removed>(r.batch.events[0]).block_hashes ==
        std::vector<uint64_t>{h_big, u64_max, 1ull << 63});
}

TEST_CASE("negative int hashes are read as their two's complement") {
  std::string in = batch_of({[](auto& pk) {
    pk.pack_array(2);
    pk.pack(std::string("BlockRemoved"));
    pk.pack_array(2);
    pk.pack_int64(-1);
    pk.pack_int64(static_cast<int64_t>(h_big));
  }});
  auto r = decode_ok(in);
  REQUIRE(r.batch.events.size() == 1);
  CHECK(std::get<block_removed>(r.batch.events[0]).block_hashes ==
        std::vector<uint64_t>{u64_max, h_big});
}

TEST_CASE("bytes hashes become vLLM's maybe_convert_block_hash value") {
  // 32-byte sha256 digests, b"" and b"\x01\x02\x03" (bin), checked against
  // the same batch with Python's conversion applied.
  event_decode_result r = decode_ok(frame(kvs_golden::vllm_bytes_hashes));
  CHECK(r.dropped.empty());
  CHECK(hex(encode(r.batch, event_dialect::vllm)) ==
        hex(frame(kvs_golden::vllm_bytes_hashes_as_int)));
  REQUIRE(r.batch.events.size() == 2);
  CHECK(std::get<block_removed>(r.batch.events[1]).block_hashes[0] == 0);
  CHECK(std::get<block_removed>(r.batch.events[1]).block_hashes[1] == 0x010203);

  // More than 8 bytes: the low 64 bits, big-endian; str is read like bin.
  std::string in = batch_of({[](auto& pk) {
    pk.pack_array(2);
    pk.pack(std::string("BlockRemoved"));
    pk.pack_array(2);
    pk.pack_bin(9);
    pk.pack_bin_body("\x01\x02\x03\x04\x05\x06\x07\x08\x09", 9);
    pk.pack(std::string("\x0a\x0b"));
  }});
  auto r2 = decode_ok(in);
  REQUIRE(r2.batch.events.size() == 1);
  CHECK(std::get<block_removed>(r2.batch.events[0]).block_hashes ==
        std::vector<uint64_t>{0x0203040506070809ull, 0x0a0bull});
}

TEST_CASE("older and other engines' layouts decode to today's events") {
  struct other {
    const char* name;
    std::string in;
    std::string today;
  };
  namespace g = kvs_golden;
  std::vector<other> cases = {
      {"vLLM pre-#42892 positional", frame(g::vllm_legacy_positional),
       frame(g::vllm_legacy_equivalent)},
      {"vLLM 0.9 (2-element envelope)", frame(g::vllm_v09_positional),
       frame(g::vllm_v09_equivalent)},
      {"mixed dialects in one batch", frame(g::mixed_dialects),
       frame(g::mixed_dialects_equivalent)},
      {"SGLang 0.5.23, salted chain start", frame(g::sglang_salted),
       frame(g::sglang_salted_equivalent)},
      {"SGLang 0.5.23, salted continuation", frame(g::sglang_continuation),
       frame(g::sglang_continuation_equivalent)},
  };
  for (const other& c : cases) {
    CAPTURE(std::string(c.name));
    event_decode_result r = decode_ok(c.in);
    CHECK(r.dropped.empty());
    CHECK(hex(encode(r.batch, event_dialect::vllm)) == hex(c.today));
  }
  // vLLM 0.32's BlockStored (fixmap) is re-encoded as 0.32 wrote it, and
  // as 0.33 writes it (map16) once the batch says 0.33's layout.
  {
    event_decode_result r32 = decode_ok(frame(g::vllm_032_fixmap));
    CHECK(r32.dropped.empty());
    CHECK(r32.batch.stored_layout == vllm_stored_layout::v0_32);
    CHECK(hex(encode(r32.batch, event_dialect::vllm)) == hex(frame(g::vllm_032_fixmap)));
    r32.batch.stored_layout = vllm_stored_layout::v0_33;
    CHECK(hex(encode(r32.batch, event_dialect::vllm)) == hex(frame(g::vllm_032_equivalent)));
    event_decode_result r33 = decode_ok(frame(g::vllm_032_equivalent));
    CHECK(r33.batch.stored_layout == vllm_stored_layout::v0_33);
    CHECK(r33.batch.events == r32.batch.events);
  }
  // The newer vLLM event: every known field read, event_version ignored.
  event_decode_result r = decode_ok(frame(g::newer_vllm_map16));
  REQUIRE(r.batch.events.size() == 1);
  block_stored want = stored({1}, std::nullopt, {1}, 1);
  want.medium = "GPU";
  CHECK(describe(r.batch.events[0]) == describe(kv_event{want}));
}

TEST_CASE("a map whose 'type' key is not first still decodes") {
  event_decode_result r = decode_ok(frame(kvs_golden::type_not_first));
  CHECK(r.dropped.empty());
  REQUIRE(r.batch.events.size() == 1);
  CHECK(describe(r.batch.events[0]) == describe(kv_event{removed({9}, "GPU")}));
}

TEST_CASE("an unknown event type is dropped alone and reported") {
  event_decode_result r = decode_ok(frame(kvs_golden::unknown_tag_middle));
  REQUIRE(r.batch.events.size() == 2);
  CHECK(describe(r.batch.events[0]) == describe(kv_event{removed({1}, "GPU")}));
  CHECK(std::holds_alternative<all_blocks_cleared>(r.batch.events[1]));
  REQUIRE(r.dropped.size() == 1);
  CHECK(r.dropped[0].kind == "unknown_tag");
  CHECK(r.dropped[0].detail == "event 1: unknown tag 'BlockMigrated'");
  CHECK(r.batch.dp_rank == 0);
}

// -- malformed input: the whole frame --------------------------------------------

TEST_CASE("frames that are not a batch are rejected with not_a_batch naming the place") {
  struct bad {
    const char* name;
    std::string in;
    const char* detail; // substring
  };
  auto raw = [](std::initializer_list<unsigned> bytes) {
    std::string s;
    for (unsigned b : bytes)
      s.push_back(static_cast<char>(b));
    return s;
  };
  mp events_map, ts_str, ts_nil, dp_str, dp_huge, one, four, not_array, dp_float;
  events_map.pk.pack_array(3);
  events_map.pk.pack_double(1.5);
  events_map.pk.pack_map(0);
  events_map.pk.pack_int(0);
  ts_str.pk.pack_array(3);
  ts_str.pk.pack(std::string("now"));
  ts_str.pk.pack_array(0);
  ts_str.pk.pack_int(0);
  ts_nil.pk.pack_array(2);
  ts_nil.pk.pack_nil();
  ts_nil.pk.pack_array(0);
  dp_str.pk.pack_array(3);
  dp_str.pk.pack_double(1.5);
  dp_str.pk.pack_array(0);
  dp_str.pk.pack(std::string("0"));
  dp_float.pk.pack_array(3);
  dp_float.pk.pack_double(1.5);
  dp_float.pk.pack_array(0);
  dp_float.pk.pack_double(0.5);
  dp_huge.pk.pack_array(3);
  dp_huge.pk.pack_double(1.5);
  dp_huge.pk.pack_array(0);
  dp_huge.pk.pack_uint64(u64_max);
  one.pk.pack_array(1);
  one.pk.pack_double(1.5);
  four.pk.pack_array(4);
  four.pk.pack_double(1.5);
  four.pk.pack_array(0);
  four.pk.pack_int(0);
  four.pk.pack_int(0);
  not_array.pk.pack_map(1);
  not_array.pk.pack(std::string("ts"));
  not_array.pk.pack_double(1.5);

  std::vector<bad> cases = {
      {"empty frame", "", "envelope: truncated at byte 0"},
      {"reserved byte 0xc1", raw({0xc1}), "invalid msgpack byte 0xc1 at byte 0"},
      {"text, not msgpack", "hello", "envelope: expected array, got int"},
      {"a map envelope", not_array.str(), "envelope: expected array, got map"},
      {"an int envelope", raw({0x05}), "envelope: expected array, got int"},
      {"envelope of 1", one.str(), "envelope: expected 2 or 3 elements, got 1"},
      {"envelope of 4", four.str(), "envelope: expected 2 or 3 elements, got 4"},
      {"ts a str", ts_str.str(), "ts: expected float, got str"},
      {"ts nil", ts_nil.str(), "ts: expected float, got nil"},
      {"events a map", events_map.str(), "events: expected array, got map"},
      {"dp_rank a str", dp_str.str(), "dp_rank: expected int or nil, got str"},
      {"dp_rank a float", dp_float.str(), "dp_rank: expected int or nil, got float"},
      {"dp_rank beyond int64", dp_huge.str(), "dp_rank: expected int or nil, got int out of int64"},
      {"trailing bytes", frame(kvs_golden::vllm_cleared) + "x", "1 trailing bytes"},
      {"2^32-1 events claimed", raw({0x93, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0}),
       "event 1: truncated"},
      {"2^32-1 hashes claimed",
       raw({0x93, 0x00, 0x91, 0x92, 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e',
            'd', 0xdd, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00}),
       "event 0: truncated"},
      {"str8 past the end", raw({0x93, 0x00, 0x91, 0xd9, 0xff, 'a'}), "event 0: truncated"},
      {"ts float64 cut short", raw({0x93, 0xcb, 0x41, 0xda}), "ts: truncated at byte 1"},
      {"dp_rank missing", raw({0x93, 0x00, 0x90}), "dp_rank: truncated at byte 3"},
  };
  for (const bad& c : cases) {
    CAPTURE(std::string(c.name));
    error e = decode_err(c.in);
    CHECK(e.kind == "not_a_batch");
    CHECK_MESSAGE(e.detail.find(c.detail) != std::string::npos, e.detail);
  }
}

TEST_CASE("every truncation of every golden is rejected, never decoded or crashed on") {
  for (const golden_case& c : goldens()) {
    for (size_t n = 0; n < c.bytes.size(); ++n) {
      CAPTURE(std::string(c.name));
      CAPTURE(n);
      error e = decode_err(c.bytes.substr(0, n));
      CHECK(e.kind == "not_a_batch");
      CHECK(!e.detail.empty());
    }
  }
}

// -- malformed input: one event ------------------------------------------------------

using pk_t = msgpack::packer<msgpack::sbuffer>;

/// A valid vLLM BlockStored map whose field `field` is written by `value`
/// (or left out when value is null).
std::function<void(pk_t&)> stored_map_with(const char* field,
                                           std::function<void(pk_t&)> value) {
  return [field, value](pk_t& pk) {
    const char* names[] = {"block_hashes", "parent_block_hash", "token_ids", "block_size",
                           "lora_id",      "medium",            "lora_name"};
    uint32_t n = 1;
    for (const char* name : names)
      n += (std::string(name) != field || value) ? 1 : 0;
    pk.pack_map(n);
    key(pk, "type");
    pk.pack(std::string("BlockStored"));
    for (const char* name : names) {
      bool replaced = std::string(name) == field;
      if (replaced && !value)
        continue;
      key(pk, name);
      if (replaced) {
        value(pk);
        continue;
      }
      std::string f = name;
      if (f == "block_hashes") {
        pk.pack_array(1);
        pk.pack_uint64(1);
      } else if (f == "token_ids") {
        pk.pack_array(1);
        pk.pack_int(1);
      } else if (f == "block_size") {
        pk.pack_int(1);
      } else {
        pk.pack_nil();
      }
    }
  };
}

std::function<void(pk_t&)> good_removed() {
  return [](pk_t& pk) {
    pk.pack_array(2);
    pk.pack(std::string("BlockRemoved"));
    pk.pack_array(1);
    pk.pack_uint64(42);
  };
}

TEST_CASE("a malformed event is dropped alone, with its index, field and what was wrong") {
  struct bad {
    const char* name;
    std::function<void(pk_t&)> event;
    const char* kind;
    const char* detail; // exact, without the "event 1: " prefix
  };
  auto str = [](std::string s) { return [s](pk_t& pk) { pk.pack(s); }; };
  std::vector<bad> cases = {
      {"an int", [](pk_t& pk) { pk.pack_int(5); }, "bad_event", "expected map or array, got int"},
      {"a str", str("BlockStored"), "bad_event", "expected map or array, got str"},
      {"nil", [](pk_t& pk) { pk.pack_nil(); }, "bad_event", "expected map or array, got nil"},
      {"empty array", [](pk_t& pk) { pk.pack_array(0); }, "bad_event", "empty array"},
      {"array tag an int",
       [](pk_t& pk) {
         pk.pack_array(2);
         pk.pack_int(1);
         pk.pack_array(0);
       },
       "bad_event", "tag: expected str, got int"},
      {"unknown positional tag",
       [](pk_t& pk) {
         pk.pack_array(1);
         pk.pack(std::string("BlockEvicted"));
       },
       "unknown_tag", "unknown tag 'BlockEvicted'"},
      {"map without type",
       [](pk_t& pk) {
         pk.pack_map(1);
         key(pk, "block_hashes");
         pk.pack_array(0);
       },
       "bad_event", "map without a 'type' key"},
      {"map type an int",
       [](pk_t& pk) {
         pk.pack_map(1);
         key(pk, "type");
         pk.pack_int(3);
       },
       "bad_event", "tag: expected str, got int"},
      {"map with an int key",
       [](pk_t& pk) {
         pk.pack_map(2);
         key(pk, "type");
         pk.pack(std::string("AllBlocksCleared"));
         pk.pack_int(1);
         pk.pack_int(2);
       },
       "bad_event", "map key of type int"},
      {"map unknown tag",
       [](pk_t& pk) {
         pk.pack_map(1);
         key(pk, "type");
         pk.pack(std::string("Nope"));
       },
       "unknown_tag", "unknown tag 'Nope'"},
      {"missing block_size (map)", stored_map_with("block_size", nullptr), "bad_field",
       "field 'block_size': missing"},
      {"missing parent_block_hash (map)", stored_map_with("parent_block_hash", nullptr),
       "bad_field", "field 'parent_block_hash': missing"},
      {"missing block_size (array)",
       [](pk_t& pk) {
         pk.pack_array(4);
         pk.pack(std::string("BlockStored"));
         pk.pack_array(0);
         pk.pack_nil();
         pk.pack_array(0);
       },
       "bad_field", "field 'block_size': missing"},
      {"BlockRemoved without hashes",
       [](pk_t& pk) {
         pk.pack_array(1);
         pk.pack(std::string("BlockRemoved"));
       },
       "bad_field", "field 'block_hashes': missing"},
      {"block_size a str", stored_map_with("block_size", str("16")), "bad_field",
       "field 'block_size': expected int, got str"},
      {"block_size a float", stored_map_with("block_size", [](pk_t& pk) { pk.pack_double(16.5); }),
       "bad_field", "field 'block_size': expected int, got float"},
      {"block_size nil", stored_map_with("block_size", [](pk_t& pk) { pk.pack_nil(); }),
       "bad_field", "field 'block_size': expected int, got nil"},
      {"block_size negative", stored_map_with("block_size", [](pk_t& pk) { pk.pack_int(-16); }),
       "bad_field", "field 'block_size': negative: -16"},
      {"block_hashes an int", stored_map_with("block_hashes", [](pk_t& pk) { pk.pack_int(1); }),
       "bad_field", "field 'block_hashes': expected array, got int"},
      {"a float hash",
       stored_map_with("block_hashes",
                       [](pk_t& pk) {
                         pk.pack_array(2);
                         pk.pack_int(1);
                         pk.pack_double(1.5);
                       }),
       "bad_field", "field 'block_hashes': element 1: expected int or bytes, got float"},
      {"a nil hash",
       stored_map_with("block_hashes",
                       [](pk_t& pk) {
                         pk.pack_array(1);
                         pk.pack_nil();
                       }),
       "bad_field", "field 'block_hashes': element 0: expected int or bytes, got nil"},
      {"a bool hash",
       stored_map_with("block_hashes",
                       [](pk_t& pk) {
                         pk.pack_array(1);
                         pk.pack_true();
                       }),
       "bad_field", "field 'block_hashes': element 0: expected int or bytes, got bool"},
      {"parent a float", stored_map_with("parent_block_hash", [](pk_t& pk) { pk.pack_double(1.5); }),
       "bad_field", "field 'parent_block_hash': expected int, bytes or nil, got float"},
      {"parent an array",
       stored_map_with("parent_block_hash", [](pk_t& pk) { pk.pack_array(0); }), "bad_field",
       "field 'parent_block_hash': expected int, bytes or nil, got array"},
      {"token_ids a map", stored_map_with("token_ids", [](pk_t& pk) { pk.pack_map(0); }),
       "bad_field", "field 'token_ids': expected array, got map"},
      {"a str token",
       stored_map_with("token_ids",
                       [](pk_t& pk) {
                         pk.pack_array(1);
                         pk.pack(std::string("a"));
                       }),
       "bad_field", "field 'token_ids': element 0: expected int, got str"},
      {"a token beyond int64",
       stored_map_with("token_ids",
                       [](pk_t& pk) {
                         pk.pack_array(3);
                         pk.pack_int(1);
                         pk.pack_int(2);
                         pk.pack_uint64(u64_max);
                       }),
       "bad_field", "field 'token_ids': element 2: out of int64 range"},
      {"lora_id a str", stored_map_with("lora_id", str("7")), "bad_field",
       "field 'lora_id': expected int or nil, got str"},
      {"medium an int", stored_map_with("medium", [](pk_t& pk) { pk.pack_int(1); }), "bad_field",
       "field 'medium': expected str or nil, got int"},
      {"medium bin", stored_map_with("medium", [](pk_t& pk) {
         pk.pack_bin(3);
         pk.pack_bin_body("GPU", 3);
       }),
       "bad_field", "field 'medium': expected str or nil, got bin"},
      {"medium invalid UTF-8", stored_map_with("medium", str("G\xff")), "bad_field",
       "field 'medium': invalid UTF-8"},
      {"lora_name a surrogate", stored_map_with("lora_name", str("\xed\xa0\x80")), "bad_field",
       "field 'lora_name': invalid UTF-8"},
      {"lora_name overlong", stored_map_with("lora_name", str("\xc0\xaf")), "bad_field",
       "field 'lora_name': invalid UTF-8"},
      {"group_idx a float (positional)",
       [](pk_t& pk) {
         pk.pack_array(10);
         pk.pack(std::string("BlockStored"));
         pk.pack_array(0);
         pk.pack_nil();
         pk.pack_array(0);
         pk.pack_int(16);
         pk.pack_nil();
         pk.pack_nil();
         pk.pack_nil();
         pk.pack_nil();
         pk.pack_double(0.5);
       },
       "bad_field", "field 'group_idx': expected int or nil, got float"},
      {"extra_keys an int",
       [](pk_t& pk) {
         pk.pack_array(9);
         pk.pack(std::string("BlockStored"));
         pk.pack_array(0);
         pk.pack_nil();
         pk.pack_array(0);
         pk.pack_int(16);
         pk.pack_nil();
         pk.pack_nil();
         pk.pack_nil();
         pk.pack_int(1);
       },
       "bad_field", "field 'extra_keys': expected array or nil, got int"},
      {"extra_keys element a str",
       [](pk_t& pk) {
         pk.pack_array(9);
         pk.pack(std::string("BlockStored"));
         pk.pack_array(0);
         pk.pack_nil();
         pk.pack_array(0);
         pk.pack_int(16);
         pk.pack_nil();
         pk.pack_nil();
         pk.pack_nil();
         pk.pack_array(2);
         pk.pack_nil();
         pk.pack(std::string("x"));
       },
       "bad_field", "field 'extra_keys': element 1: expected array or nil, got str"},
      {"extra_keys with invalid UTF-8 deep inside",
       [](pk_t& pk) {
         pk.pack_array(9);
         pk.pack(std::string("BlockStored"));
         pk.pack_array(0);
         pk.pack_nil();
         pk.pack_array(0);
         pk.pack_int(16);
         pk.pack_nil();
         pk.pack_nil();
         pk.pack_nil();
         pk.pack_array(1);
         pk.pack_array(1);
         pk.pack_map(1);
         pk.pack(std::string("k"));
         pk.pack(std::string("\xff"));
       },
       "bad_field", "field 'extra_keys': invalid UTF-8 in a str"},
      {"BlockRemoved medium a bool",
       [](pk_t& pk) {
         pk.pack_array(3);
         pk.pack(std::string("BlockRemoved"));
         pk.pack_array(0);
         pk.pack_false();
       },
       "bad_field", "field 'medium': expected str or nil, got bool"},
      {"BlockRemoved locality an int (map)",
       [](pk_t& pk) {
         pk.pack_map(3);
         key(pk, "type");
         pk.pack(std::string("BlockRemoved"));
         key(pk, "block_hashes");
         pk.pack_array(0);
         key(pk, "locality");
         pk.pack_int(1);
       },
       "bad_field", "field 'locality': expected str or nil, got int"},
  };
  for (const bad& c : cases) {
    CAPTURE(std::string(c.name));
    // The bad event sits between two good ones: both must survive.
    auto r = decode(batch_of({good_removed(), c.event, good_removed()}));
    if (auto* e = r ? nullptr : &r.error_value())
      FAIL("whole batch rejected: ", e->kind, ": ", e->detail);
    auto& res = r.value();
    CHECK(res.batch.events.size() == 2);
    REQUIRE(res.dropped.size() == 1);
    CHECK(res.dropped[0].kind == c.kind);
    CHECK(res.dropped[0].detail == std::string("event 1: ") + c.detail);
  }
}

TEST_CASE("what msgspec tolerates is accepted: unknown keys, extra elements, int ts") {
  std::string in = batch_of({
      [](pk_t& pk) { // unknown key with a nested value
        pk.pack_map(4);
        key(pk, "type");
        pk.pack(std::string("BlockRemoved"));
        key(pk, "block_hashes");
        pk.pack_array(1);
        pk.pack_int(1);
        key(pk, "future");
        pk.pack_map(1);
        key(pk, "a");
        pk.pack_array(2);
        pk.pack_int(1);
        pk.pack_nil();
        key(pk, "medium");
        pk.pack(std::string("GPU"));
      },
      [](pk_t& pk) { // positional with elements beyond every known field
        pk.pack_array(4);
        pk.pack(std::string("BlockRemoved"));
        pk.pack_array(1);
        pk.pack_int(2);
        pk.pack(std::string("CPU"));
        pk.pack_int(1); // group_idx
      },
      [](pk_t& pk) {
        pk.pack_array(8);
        pk.pack(std::string("BlockRemoved"));
        pk.pack_array(0);
        for (int i = 0; i < 6; ++i)
          pk.pack_nil();
      },
      [](pk_t& pk) { // AllBlocksCleared with stray content
        pk.pack_array(2);
        pk.pack(std::string("AllBlocksCleared"));
        pk.pack_map(0);
      },
      [](pk_t& pk) { // a defaulted field explicitly nil
        pk.pack_map(3);
        key(pk, "type");
        pk.pack(std::string("BlockRemoved"));
        key(pk, "block_hashes");
        pk.pack_array(0);
        key(pk, "group_idx");
        pk.pack_nil();
      },
  });
  event_decode_result r = decode_ok(in);
  CHECK(r.dropped.empty());
  REQUIRE(r.batch.events.size() == 5);
  CHECK(describe(r.batch.events[0]) == describe(kv_event{removed({1}, "GPU")}));
  block_removed second = removed({2}, "CPU");
  second.group_idx = 1;
  CHECK(describe(r.batch.events[1]) == describe(kv_event{second}));
  CHECK(describe(r.batch.events[2]) == describe(kv_event{removed({}, std::nullopt)}));
  CHECK(std::holds_alternative<all_blocks_cleared>(r.batch.events[3]));
  CHECK(describe(r.batch.events[4]) == describe(kv_event{removed({}, std::nullopt)}));

  // ts as an int, dp_rank negative, 2-element envelope.
  mp m;
  m.pk.pack_array(3);
  m.pk.pack_int(17);
  m.pk.pack_array(0);
  m.pk.pack_int(-1);
  auto r2 = decode_ok(m.str());
  CHECK(r2.batch.ts == 17.0);
  CHECK(r2.batch.dp_rank == -1);
  mp m2;
  m2.pk.pack_array(2);
  m2.pk.pack_float(0.5f);
  m2.pk.pack_array(0);
  auto r3 = decode_ok(m2.str());
  CHECK(r3.batch.ts == 0.5);
  CHECK(!r3.batch.dp_rank);
  CHECK(hex(encode(r3.batch, event_dialect::vllm)) == "93 cb 3f e0 00 00 00 00 00 00 90 c0 ");
}

TEST_CASE("a duplicate map key keeps the last value, like msgspec") {
  std::string in = batch_of({[](pk_t& pk) {
    pk.pack_map(3);
    key(pk, "type");
    pk.pack(std::string("BlockRemoved"));
    key(pk, "block_hashes");
    pk.pack_array(2);
    pk.pack_int(1);
    pk.pack_int(2);
    key(pk, "block_hashes");
    pk.pack_array(1);
    pk.pack_int(3);
  }});
  event_decode_result r = decode_ok(in);
  REQUIRE(r.batch.events.size() == 1);
  CHECK(std::get<block_removed>(r.batch.events[0]).block_hashes == std::vector<uint64_t>{3});
}

// -- vLLM 0.33 and SGLang 0.5.23 specifics -----------------------------------------

TEST_CASE("vLLM 0.33 BlockStored is written with a map16 header, as msgspec does") {
  // 15 fields + the tag: msgspec sizes the header for that maximum, so even
  // the 8 entries of a minimal event get `de 00 08`, never fixmap `88`.
  std::string bytes = encode(vllm_stored_required(), event_dialect::vllm);
  CHECK(hex(bytes).substr(0, 42) == "93 cb 41 da 30 54 98 10 00 00 91 de 00 08 ");
  // 15 entries (every field but the ones left unset) -> still map16.
  CHECK(hex(encode(vllm_stored_all_fields(), event_dialect::vllm)).find("91 de 00 10 ") !=
        std::string::npos);
  // BlockRemoved (6 entries at most) keeps fixmap.
  CHECK(hex(encode(vllm_removed_required(), event_dialect::vllm)).find("91 83 ") !=
        std::string::npos);
}

/// [ts, [{"type": "BlockStored", required fields..., extra key: value}], 0]
std::string stored_with_extra(const char* name, std::function<void(pk_t&)> value) {
  return batch_of({[name, value](pk_t& pk) {
    pk.pack_map(6);
    key(pk, "type");
    pk.pack(std::string("BlockStored"));
    key(pk, "block_hashes");
    pk.pack_array(2);
    pk.pack_int(1);
    pk.pack_int(2);
    key(pk, "parent_block_hash");
    pk.pack_nil();
    key(pk, "token_ids");
    pk.pack_array(0);
    key(pk, "block_size");
    pk.pack_int(1);
    key(pk, name);
    value(pk);
  }});
}

TEST_CASE("lookahead_token_ids is read, relayed and checked like token_ids") {
  auto r = decode_ok(stored_with_extra("lookahead_token_ids", [](pk_t& pk) {
    pk.pack_array(2);
    pk.pack_array(2);
    pk.pack_int(7);
    pk.pack_int(-70000);
    pk.pack_array(0);
  }));
  REQUIRE(r.dropped.empty());
  const auto& s = std::get<block_stored>(r.batch.events.at(0));
  REQUIRE(s.lookahead_token_ids);
  CHECK(*s.lookahead_token_ids == std::vector<std::vector<int64_t>>{{7, -70000}, {}});
  CHECK(hex(encode(r.batch, event_dialect::vllm))
            .find("b3 6c 6f 6f 6b 61 68 65 61 64 5f 74 6f 6b 65 6e 5f 69 64 73 92 92 07 d2 ff fe "
                  "ee 90 90 ") != std::string::npos);

  auto nil = decode_ok(stored_with_extra("lookahead_token_ids", [](pk_t& pk) { pk.pack_nil(); }));
  CHECK(!std::get<block_stored>(nil.batch.events.at(0)).lookahead_token_ids);

  struct bad {
    const char* name;
    std::function<void(pk_t&)> value;
    const char* detail;
  };
  std::vector<bad> cases = {
      {"a str", [](pk_t& pk) { pk.pack(std::string("x")); },
       "event 0: field 'lookahead_token_ids': expected array or nil, got str"},
      {"a list of ints",
       [](pk_t& pk) {
         pk.pack_array(1);
         pk.pack_int(3);
       },
       "event 0: field 'lookahead_token_ids': expected array, got int (in element 0)"},
      {"a token out of int64",
       [](pk_t& pk) {
         pk.pack_array(2);
         pk.pack_array(0);
         pk.pack_array(1);
         pk.pack_uint64(1ull << 63);
       },
       "event 0: field 'lookahead_token_ids': element 0: out of int64 range (in element 1)"},
  };
  for (const bad& c : cases) {
    CAPTURE(std::string(c.name));
    auto rb = decode_ok(stored_with_extra("lookahead_token_ids", c.value));
    CHECK(rb.batch.events.empty());
    REQUIRE(rb.dropped.size() == 1);
    CHECK(rb.dropped[0].kind == "bad_field");
    CHECK(rb.dropped[0].detail == c.detail);
  }
}

TEST_CASE("SGLang's cache_salt goes into extra_keys the way vLLM publishes a salt") {
  auto salted = [](std::optional<uint64_t> parent) {
    block_stored s = stored({1, 2}, parent, {}, 1);
    s.cache_salt = "tenant-a";
    return make(1.5, {s}, 0);
  };
  // Chain start: ["tenant-a"] for block 0, None for the others.
  auto start = decode_ok(encode(salted(std::nullopt), event_dialect::vllm));
  const auto& s0 = std::get<block_stored>(start.batch.events.at(0));
  REQUIRE(s0.extra_keys_msgpack);
  CHECK(hex(*s0.extra_keys_msgpack) == "92 91 a8 74 65 6e 61 6e 74 2d 61 c0 ");
  CHECK(!s0.cache_salt); // a vLLM consumer has no cache_salt key
  // Continuation: implied by the parent chain, like vLLM.
  auto cont = decode_ok(encode(salted(5), event_dialect::vllm));
  CHECK(!std::get<block_stored>(cont.batch.events.at(0)).extra_keys_msgpack);
  // An event that has extra_keys keeps them unchanged.
  kv_event_batch with_keys = salted(std::nullopt);
  std::get<block_stored>(with_keys.events[0]).extra_keys_msgpack = extra_keys_bytes();
  auto kept = decode_ok(encode(with_keys, event_dialect::vllm));
  CHECK(hex(*std::get<block_stored>(kept.batch.events.at(0)).extra_keys_msgpack) ==
        hex(extra_keys_bytes()));
  // tokenspeed cannot carry it.
  CHECK(hex(encode(salted(std::nullopt), event_dialect::tokenspeed)) ==
        hex(encode(make(1.5, {stored({1, 2}, std::nullopt, {}, 1)}, 0),
                   event_dialect::tokenspeed)));
  // A cache_salt that is not a str is a bad field, like any other.
  auto bad = decode_ok(stored_with_extra("cache_salt", [](pk_t& pk) { pk.pack_int(1); }));
  REQUIRE(bad.dropped.size() == 1);
  CHECK(bad.dropped[0].detail == "event 0: field 'cache_salt': expected str or nil, got int");
}
