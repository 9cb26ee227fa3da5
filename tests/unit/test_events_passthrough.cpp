// The relay's pass-through fast path (check_canonical_event_batch +
// encode_canonical_with_rank) must give exactly the bytes of decode + encode,
// for every golden, every batch our encoder writes, and random mutations of
// them; and it must refuse every input decode + encode would change.
#include "events_wire/kv_event_codec.hpp"
#include "tests/unit/events_golden.hpp"
#include "tests/unit/frame_bytes.hpp"
#include "tests/unit/random_events.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <variant>
#include <vector>

using namespace kvs;
using kvs_test::frame;
using kvs_test::hex;
using kvs_test::random_batch;
using kvs_test::rng;

// Bytes compared as bytes, shown as hex only when they differ (doctest builds
// the message lazily): hex of every frame on every check made this test run
// into its timeout under ASan.
#define CHECK_SAME_BYTES(got, want) \
  CHECK_MESSAGE((got) == (want), "got  ", hex(got), "\nwant ", hex(want))

namespace {

const uint8_t* u8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

std::optional<canonical_batch> canonical(const std::string& s, event_dialect d) {
  return check_canonical_event_batch(u8(s), s.size(), d);
}

const std::vector<std::optional<int64_t>> ranks = {std::nullopt, 0, 3, 127, 300, -5, -70000,
                                                   int64_t{1} << 40};

size_t same_tails = 0; // events recorded with same_tail, over the whole run

/// A canonical_record (what travels with the batch, one buffer) holds
/// exactly the arrays it was made from, each aligned for its type.
void check_frozen(const canonical_events& rec) {
  const canonical_record frozen{rec};
  REQUIRE(frozen.events.size() == rec.events.size());
  REQUIRE(frozen.hashes.size() == rec.hashes.size());
  REQUIRE(frozen.tokens.size() == rec.tokens.size());
  for (size_t k = 0; k < rec.events.size(); ++k)
    CHECK(std::memcmp(&frozen.events[k], &rec.events[k], sizeof(canonical_event)) == 0);
  CHECK(std::equal(rec.hashes.begin(), rec.hashes.end(), frozen.hashes.begin()));
  CHECK(std::equal(rec.tokens.begin(), rec.tokens.end(), frozen.tokens.begin()));
  CHECK(reinterpret_cast<uintptr_t>(frozen.events.data()) % alignof(canonical_event) == 0);
  CHECK(reinterpret_cast<uintptr_t>(frozen.hashes.data()) % alignof(uint64_t) == 0);
  CHECK(reinterpret_cast<uintptr_t>(frozen.tokens.data()) % alignof(int32_t) == 0);
}

/// What the check records for the indexer is what decode reads: each event's
/// own bytes decode to it; a BlockStored's hashes, parent and (when they fit
/// int32) tokens are its own; same_tail only where the event before is a
/// BlockStored with the same tail.
void check_recorded(const std::string& in, event_dialect d, const std::vector<kv_event>& want) {
  canonical_events rec;
  REQUIRE(check_canonical_event_batch(u8(in), in.size(), d, &rec));
  check_frozen(rec);
  REQUIRE(rec.events.size() == want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    CAPTURE(k);
    const canonical_event& ev = rec.events[k];
    REQUIRE(size_t{ev.at} + ev.size <= in.size());
    auto one = decode_one_event(u8(in) + ev.at, ev.size);
    REQUIRE(one);
    CHECK(*one == want[k]);
    auto* s = std::get_if<block_stored>(&want[k]);
    CHECK(ev.stored == (s != nullptr));
    if (!s) {
      CHECK(!ev.same_tail);
      continue;
    }
    REQUIRE(size_t{ev.hashes_at} + ev.hashes <= rec.hashes.size());
    CHECK(std::vector<uint64_t>(rec.hashes.begin() + ev.hashes_at,
                                rec.hashes.begin() + ev.hashes_at + ev.hashes) == s->block_hashes);
    CHECK(ev.has_parent == s->parent_block_hash.has_value());
    if (ev.has_parent)
      CHECK(ev.parent == *s->parent_block_hash);
    bool fits = true;
    for (int64_t t : s->token_ids)
      fits &= t >= INT32_MIN && t <= INT32_MAX;
    CHECK(ev.narrow == fits);
    REQUIRE(ev.tokens == s->token_ids.size());
    if (fits)
      for (size_t t = 0; t < s->token_ids.size(); ++t)
        CHECK(rec.tokens[ev.tokens_at + t] == s->token_ids[t]);
    if (ev.same_tail) {
      ++same_tails;
      REQUIRE(k > 0);
      auto* before = std::get_if<block_stored>(&want[k - 1]);
      REQUIRE(before != nullptr);
      CHECK(kvs_test::tail_of(*s) == kvs_test::tail_of(*before));
    }
  }
}

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
  CHECK_SAME_BYTES(own, in);
  check_recorded(in, d, ok->batch.events);
  for (const auto& r : ranks) {
    kv_event_batch b = ok->batch;
    b.dp_rank = r;
    std::string slow, fast = "x"; // appends, like encode_event_batch
    encode_event_batch(b, d, slow);
    encode_canonical_with_rank(u8(in), *c, r, fast);
    CHECK_SAME_BYTES(fast, "x" + slow);
    // Into exactly what the publisher reserves (its payload pool's buffer):
    // written in place, never reallocated (that also broke the pool's count).
    std::string exact;
    exact.reserve(c->rank_offset + 9);
    const char* reserved = exact.data();
    encode_canonical_with_rank(u8(in), *c, r, exact);
    CHECK_SAME_BYTES(exact, slow);
    CHECK(exact.data() == reserved);
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
  CHECK(same_tails > 1000); // what the indexer applies without a decode was exercised
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
    kvs_test::mutate(bytes, r);
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
  // vLLM 0.32's fixmap BlockStored passes through as it came (its layout
  // recorded); the tokenspeed dialect rewrites it.
  auto v032 = canonical(frame(kvs_golden::vllm_032_fixmap), event_dialect::vllm);
  REQUIRE(v032);
  CHECK(v032->stored_layout == vllm_stored_layout::v0_32);
  auto v033 = canonical(frame(kvs_golden::vllm_032_equivalent), event_dialect::vllm);
  REQUIRE(v033);
  CHECK(v033->stored_layout == vllm_stored_layout::v0_33);
  CHECK(!canonical(frame(kvs_golden::vllm_032_fixmap), event_dialect::tokenspeed));
}

TEST_CASE("canonical_record: arrays of every size, empty ones, each aligned and exact") {
  std::mt19937_64 r{7};
  for (size_t n_events : {0, 1, 3, 16})
    for (size_t n_hashes : {0, 1, 5, 16})
      for (size_t n_tokens : {0, 1, 7, 256}) {
        CAPTURE(n_events);
        CAPTURE(n_hashes);
        CAPTURE(n_tokens);
        canonical_events rec;
        for (size_t k = 0; k < n_events; ++k) {
          canonical_event ev;
          ev.at = static_cast<uint32_t>(r());
          ev.tail_at = static_cast<uint32_t>(r());
          ev.stored = k % 2 == 0;
          ev.parent = r();
          rec.events.push_back(ev);
        }
        for (size_t k = 0; k < n_hashes; ++k)
          rec.hashes.push_back(r());
        for (size_t k = 0; k < n_tokens; ++k)
          rec.tokens.push_back(static_cast<int32_t>(r()));
        check_frozen(rec);
        // It owns its copy: changing the source afterwards changes nothing.
        const canonical_record frozen{rec};
        const auto hashes = rec.hashes;
        for (auto& h : rec.hashes)
          h = ~h;
        CHECK(std::equal(hashes.begin(), hashes.end(), frozen.hashes.begin()));
      }
}
