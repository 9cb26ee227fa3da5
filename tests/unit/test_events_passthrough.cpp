// The relay's pass-through fast path (check_canonical_event_batch +
// encode_canonical_with_rank) must give exactly the bytes of decode + encode,
// for every golden, every batch our encoder writes, and random mutations of
// them; and it must refuse every input decode + encode would change.
#include "messages/kv_event_codec.hpp"
#include "tests/unit/events_golden.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <random>
#include <string>
#include <variant>
#include <vector>

using namespace kvs;

namespace {

template <size_t N>
std::string frame(const unsigned char (&a)[N]) {
  return std::string(reinterpret_cast<const char*>(a), N);
}

std::string hex(const std::string& s) {
  std::string out;
  char buf[4];
  for (unsigned char c : s) {
    std::snprintf(buf, sizeof buf, "%02x ", c);
    out += buf;
  }
  return out;
}

const uint8_t* u8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

std::optional<canonical_batch> canonical(const std::string& s, event_dialect d) {
  return check_canonical_event_batch(u8(s), s.size(), d);
}

const std::vector<std::optional<int64_t>> ranks = {std::nullopt, 0, 3, 127, 300, -5, -70000,
                                                   int64_t{1} << 40};

/// The property: when `in` is canonical for `d`, the fast path and decode +
/// encode agree byte for byte for every rank, decode keeps every event, and
/// the bytes with their own rank are `in` itself. Returns whether it was.
bool check_same_as_decode_encode(const std::string& in, event_dialect d) {
  auto c = canonical(in, d);
  if (!c)
    return false;
  auto res = decode_event_batch(u8(in), in.size());
  auto* ok = res ? &res.value() : nullptr;
  REQUIRE(ok != nullptr);
  CHECK(ok->dropped.empty());
  CHECK(ok->batch.events.size() == c->events);
  CHECK(ok->batch.dp_rank == c->dp_rank);
  std::string own;
  encode_event_batch(ok->batch, d, own);
  CHECK(hex(own) == hex(in));
  for (const auto& r : ranks) {
    kv_event_batch b = ok->batch;
    b.dp_rank = r;
    std::string slow, fast = "x"; // appends, like encode_event_batch
    encode_event_batch(b, d, slow);
    encode_canonical_with_rank(u8(in), *c, r, fast);
    CHECK(hex(fast) == hex("x" + slow));
  }
  return true;
}

struct named {
  const char* name;
  std::string bytes;
};

std::vector<named> all_goldens() {
  namespace g = kvs_golden;
#define G(n) named{#n, frame(g::n)}
  return {G(vllm_stored_required), G(vllm_stored_all_fields), G(vllm_removed_required),
          G(vllm_removed_all_fields), G(vllm_cleared), G(vllm_mixed_no_rank), G(vllm_16x16),
          G(vllm_empty), G(tokenspeed_seed_example), G(tokenspeed_all_types),
          G(tokenspeed_from_all_fields), G(vllm_bytes_hashes), G(vllm_bytes_hashes_as_int),
          G(vllm_legacy_positional), G(vllm_legacy_equivalent), G(vllm_v09_positional),
          G(vllm_v09_equivalent), G(mixed_dialects), G(mixed_dialects_equivalent),
          G(unknown_tag_middle), G(type_not_first), G(newer_vllm_map16), G(vllm_032_fixmap),
          G(vllm_032_equivalent), G(sglang_salted), G(sglang_salted_equivalent),
          G(sglang_continuation), G(sglang_continuation_equivalent)};
#undef G
}

// -- random batches, written by our encoder ------------------------------------------

struct rng {
  std::mt19937_64 g{20261201};
  uint64_t u() { return g(); }
  bool coin() { return u() & 1; }
  uint64_t below(uint64_t n) { return u() % n; }
  /// Values across every msgpack width, both signs.
  int64_t any_int() {
    static const int64_t edges[] = {0, 1, 127, 128, 255, 256, 65535, 65536, 4294967295LL,
                                    4294967296LL, -1, -32, -33, -128, -129, -32768, -32769,
                                    -2147483648LL, -2147483649LL, INT64_MAX, INT64_MIN};
    if (coin())
      return edges[below(sizeof edges / sizeof edges[0])];
    return static_cast<int64_t>(u()) >> below(64);
  }
  uint64_t any_hash() { return coin() ? u() : u() >> below(64); }
  std::string any_str() {
    static const char* strs[] = {"", "GPU", "sliding_window", "s\xc3\xa9ssion",
                                 "0123456789012345678901234567890123456789"};
    if (below(8) == 0)
      return std::string(300 + below(100), 'x');
    return strs[below(5)];
  }
  template <typename T, typename F>
  std::optional<T> maybe(F f) {
    if (coin())
      return f();
    return std::nullopt;
  }
};

kv_event random_event(rng& r) {
  switch (r.below(3)) {
    case 0: {
      block_stored s;
      for (uint64_t k = r.below(20); k > 0; --k)
        s.block_hashes.push_back(r.any_hash());
      s.parent_block_hash = r.maybe<uint64_t>([&] { return r.any_hash(); });
      for (uint64_t k = r.below(40); k > 0; --k)
        s.token_ids.push_back(r.any_int());
      s.block_size = static_cast<int64_t>(r.below(1u << 20));
      s.lora_id = r.maybe<int64_t>([&] { return r.any_int(); });
      s.medium = r.maybe<std::string>([&] { return r.any_str(); });
      s.lora_name = r.maybe<std::string>([&] { return r.any_str(); });
      if (r.coin())
        s.extra_keys_msgpack = std::string("\x92\xc0\x92\xa1x\x05", 6);
      s.group_idx = r.maybe<int64_t>([&] { return r.any_int(); });
      s.kv_cache_spec_kind = r.maybe<std::string>([&] { return r.any_str(); });
      s.kv_cache_spec_sliding_window = r.maybe<int64_t>([&] { return r.any_int(); });
      s.locality = r.maybe<std::string>([&] { return r.any_str(); });
      s.ownership = r.maybe<std::string>([&] { return r.any_str(); });
      s.session_id = r.maybe<std::string>([&] { return r.any_str(); });
      if (r.coin()) {
        s.lookahead_token_ids.emplace();
        for (uint64_t k = r.below(4); k > 0; --k)
          s.lookahead_token_ids->push_back({r.any_int(), r.any_int()});
      }
      if (r.below(4) == 0)
        s.cache_salt = "tenant";
      return s;
    }
    case 1: {
      block_removed e;
      for (uint64_t k = r.below(20); k > 0; --k)
        e.block_hashes.push_back(r.any_hash());
      e.medium = r.maybe<std::string>([&] { return r.any_str(); });
      e.group_idx = r.maybe<int64_t>([&] { return r.any_int(); });
      e.locality = r.maybe<std::string>([&] { return r.any_str(); });
      e.ownership = r.maybe<std::string>([&] { return r.any_str(); });
      return e;
    }
    default: return all_blocks_cleared{};
  }
}

kv_event_batch random_batch(rng& r) {
  kv_event_batch b;
  b.ts = static_cast<double>(r.any_int()) / 3.0;
  for (uint64_t k = r.below(r.coin() ? 5 : 40); k > 0; --k)
    b.events.push_back(random_event(r));
  b.dp_rank = r.maybe<int64_t>([&] { return r.any_int(); });
  return b;
}

} // namespace

TEST_CASE("every golden: the fast path, where it applies, equals decode + encode") {
  int taken = 0;
  for (const named& g : all_goldens())
    for (event_dialect d : {event_dialect::vllm, event_dialect::tokenspeed}) {
      CAPTURE(std::string(g.name));
      CAPTURE(d == event_dialect::vllm);
      taken += check_same_as_decode_encode(g.bytes, d);
    }
  CHECK(taken > 0);
}

TEST_CASE("what our encoder writes is always canonical for its dialect") {
  // The goldens msgspec wrote for today's structs...
  namespace g = kvs_golden;
  for (const std::string& s :
       {frame(g::vllm_stored_required), frame(g::vllm_stored_all_fields),
        frame(g::vllm_removed_required), frame(g::vllm_removed_all_fields), frame(g::vllm_cleared),
        frame(g::vllm_mixed_no_rank), frame(g::vllm_16x16), frame(g::vllm_empty),
        frame(g::vllm_032_equivalent), frame(g::sglang_salted_equivalent)}) {
    CAPTURE(hex(s));
    CHECK(check_same_as_decode_encode(s, event_dialect::vllm));
    if (s != frame(g::vllm_empty)) // no events: the same bytes in both dialects
      CHECK(!canonical(s, event_dialect::tokenspeed));
  }
  for (const std::string& s : {frame(g::tokenspeed_seed_example), frame(g::tokenspeed_all_types)})
    CHECK(check_same_as_decode_encode(s, event_dialect::tokenspeed));
  // ...and random batches of every field and int width.
  rng r;
  for (int k = 0; k < 2000; ++k) {
    kv_event_batch b = random_batch(r);
    for (event_dialect d : {event_dialect::vllm, event_dialect::tokenspeed}) {
      std::string bytes;
      encode_event_batch(b, d, bytes);
      CAPTURE(hex(bytes));
      REQUIRE(check_same_as_decode_encode(bytes, d));
    }
  }
}

TEST_CASE("random mutations of canonical batches: accepted only where decode + encode agrees") {
  rng r;
  int accepted = 0, refused = 0;
  for (int k = 0; k < 3000; ++k) {
    kv_event_batch b = random_batch(r);
    event_dialect d = r.coin() ? event_dialect::vllm : event_dialect::tokenspeed;
    std::string bytes;
    encode_event_batch(b, d, bytes);
    if (bytes.empty())
      continue;
    for (uint64_t m = 1 + r.below(3); m > 0; --m) {
      size_t at = r.below(bytes.size());
      switch (r.below(4)) {
        case 0: bytes[at] = static_cast<char>(r.u()); break;
        case 1: bytes[at] = static_cast<char>(bytes[at] ^ (1 << r.below(8))); break;
        case 2: bytes.erase(at, 1); break;
        default: bytes.insert(at, 1, static_cast<char>(r.u())); break;
      }
      if (bytes.empty())
        break;
    }
    CAPTURE(hex(bytes));
    if (check_same_as_decode_encode(bytes, d))
      ++accepted;
    else
      ++refused;
  }
  CHECK(accepted > 0);
  CHECK(refused > 0);
}

TEST_CASE("inputs decode + encode would change never take the fast path") {
  // vllm_removed_required: [ts, [{"type": "BlockRemoved", "block_hashes":
  // [H_BIG, 5], "medium": "GPU"}], 1], and variations of it.
  std::string good = frame(kvs_golden::vllm_removed_required);
  REQUIRE(canonical(good, event_dialect::vllm));
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    s.replace(at, from.size(), to);
    return s;
  };
  struct bad {
    const char* why;
    std::string bytes;
  };
  const std::string ts = good.substr(1, 9);
  std::vector<bad> cases = {
      {"2-element envelope", "\x92" + ts + good.substr(10, good.size() - 11)},
      {"int ts", "\x93\x01" + good.substr(10)},
      {"float32 ts", "\x93\xca\x3f\x80\x00\x00" + good.substr(10)},
      {"events array16 for 1 event", with(std::string("\x91\x83", 2), std::string("\xdc\x00\x01\x83", 4))},
      {"map16 for BlockRemoved", with(std::string("\x91\x83", 2), std::string("\x91\xde\x00\x03", 4))},
      {"tag as str8", with("\xac" "BlockRemoved", std::string("\xd9\x0c", 2) + "BlockRemoved")},
      {"hash 5 as uint8", with(std::string("\x05\xa6medium", 7), std::string("\xcc\x05\xa6medium", 8))},
      {"hash as negative int", with(std::string("\x05\xa6medium", 7), std::string("\xff\xa6medium", 7))},
      {"hash as bin", with(std::string("\x05\xa6medium", 7), std::string("\xc4\x01\x05\xa6medium", 9))},
      {"medium str8", with("\xa3GPU", std::string("\xd9\x03GPU", 5))},
      {"medium invalid UTF-8", with("\xa3GPU", "\xa3G\xffU")},
      {"keys out of order", with(std::string("\xac" "block_hashes", 13), "\xac" "block_hashez")},
      {"trailing byte", good + "\xc0"},
      {"truncated", good.substr(0, good.size() - 1)},
  };
  // dp_rank 1 (the last byte) as int8.
  cases.push_back({"rank as int8", good.substr(0, good.size() - 1) + std::string("\xd0\x01", 2)});
  // An explicit None for a defaulted field (the encoder leaves it out),
  // inserted as a 4th entry just before the rank.
  {
    std::string s = with(std::string("\x83\xa4type", 6), std::string("\x84\xa4type", 6));
    s.insert(s.size() - 1, std::string("\xa9group_idx\xc0", 11));
    cases.push_back({"group_idx: None", s});
  }
  for (const bad& c : cases) {
    CAPTURE(std::string(c.why));
    CAPTURE(hex(c.bytes));
    CHECK(!canonical(c.bytes, event_dialect::vllm));
    // Where it still decodes, decode + encode indeed changes it.
    auto res = decode_event_batch(u8(c.bytes), c.bytes.size());
    if (auto* ok = res ? &res.value() : nullptr) {
      std::string again;
      encode_event_batch(ok->batch, event_dialect::vllm, again);
      CHECK(hex(again) != hex(c.bytes));
    }
  }
  // SGLang's cache_salt is mapped, never passed through; a vLLM field the
  // tokenspeed dialect drops is not passed through there either.
  CHECK(!canonical(frame(kvs_golden::sglang_salted), event_dialect::vllm));
  CHECK(!canonical(frame(kvs_golden::vllm_stored_all_fields), event_dialect::tokenspeed));
  CHECK(!canonical(frame(kvs_golden::vllm_032_fixmap), event_dialect::vllm));
}
