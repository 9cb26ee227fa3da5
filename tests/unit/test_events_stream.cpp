// for_each_event, how the indexer decodes pass-through batches: one reused
// slot, and a BlockStored whose fields after token_ids are the previous
// event's bytes keeps their decode. It must hand over exactly the events
// decode_event_batch returns, in order, for any input (goldens, random
// batches with runs of shared tails, random mutations of them), fail where
// it fails, and say same_tail only where the tail really is the previous
// event's.
#include "messages/kv_event_codec.hpp"
#include "tests/unit/events_golden.hpp"
#include "tests/unit/frame_bytes.hpp"
#include "tests/unit/random_events.hpp"

#include <doctest/doctest.h>

#include <string>
#include <variant>
#include <vector>

using namespace kvs;
using kvs_test::frame;
using kvs_test::random_batch;
using kvs_test::rng;

namespace {

/// `s` without its per-block head (hashes, parent, tokens): its tail.
block_stored tail_of(const block_stored& s) {
  block_stored t = s;
  t.block_hashes.clear();
  t.parent_block_hash.reset();
  t.token_ids.clear();
  return t;
}

struct streamed {
  status result;
  std::vector<kv_event> events;
  std::vector<bool> same_tail;
};

streamed stream(const std::string& bytes) {
  streamed out;
  out.result = for_each_event(bytes, [&](const kv_event& ev, bool same_tail) {
    out.events.push_back(ev);
    out.same_tail.push_back(same_tail);
  });
  return out;
}

/// The property; returns how many events kept the previous tail.
size_t check_like_decode(const std::string& bytes) {
  auto decoded = decode_event_batch(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  streamed got = stream(bytes);
  REQUIRE(got.result.has_value() == decoded.has_value());
  if (!decoded) {
    CHECK(got.result.error_value().kind == decoded.error_value().kind);
    CHECK(got.result.error_value().detail == decoded.error_value().detail);
    return 0;
  }
  const auto& want = decoded->batch.events;
  REQUIRE(got.events.size() == want.size());
  size_t same = 0;
  for (size_t k = 0; k < want.size(); ++k) {
    CAPTURE(k);
    CHECK(got.events[k] == want[k]);
    if (!got.same_tail[k])
      continue;
    ++same;
    REQUIRE(k > 0);
    auto* now = std::get_if<block_stored>(&want[k]);
    auto* before = std::get_if<block_stored>(&want[k - 1]);
    REQUIRE(now != nullptr);
    REQUIRE(before != nullptr);
    CHECK(tail_of(*now) == tail_of(*before));
  }
  return same;
}

} // namespace

TEST_CASE("every golden streams to decode_event_batch's events") {
  namespace g = kvs_golden;
  for (const std::string& s :
       {frame(g::vllm_stored_required), frame(g::vllm_stored_all_fields), frame(g::vllm_16x16),
        frame(g::vllm_mixed_no_rank), frame(g::tokenspeed_all_types), frame(g::mixed_dialects),
        frame(g::unknown_tag_middle), frame(g::type_not_first), frame(g::newer_vllm_map16),
        frame(g::vllm_legacy_positional), frame(g::vllm_v09_positional), frame(g::sglang_salted)})
    check_like_decode(s);
  // vllm_16x16: sixteen BlockStored of one engine, all sharing their tail.
  streamed got = stream(frame(g::vllm_16x16));
  REQUIRE(got.same_tail.size() == 16);
  CHECK(!got.same_tail[0]);
  for (size_t k = 1; k < 16; ++k)
    CHECK(got.same_tail[k]);
}

TEST_CASE("a tail is kept only when it is the previous event's, with as many fields") {
  block_stored a;
  a.block_hashes = {1};
  a.parent_block_hash = 7;
  a.token_ids = {1, 2, 300, 70000};
  a.block_size = 4;
  a.medium = "GPU";
  a.extra_keys_msgpack = std::string("\x91\xc0", 2);
  a.group_idx = 0;
  a.kv_cache_spec_kind = "full_attention";
  block_stored b = a;          // the same tail
  b.block_hashes = {2};
  b.parent_block_hash = 1;
  b.token_ids = {5, 6, 7, 8};
  block_stored c = b;          // the same bytes, then one more field
  c.block_hashes = {3};
  c.locality = "node-1";
  block_removed r;
  r.block_hashes = {1};
  r.medium = "GPU";
  block_stored d = a;          // a's tail again, after a BlockRemoved
  d.block_hashes = {4};
  block_stored e = a;          // and again
  e.block_hashes = {5};
  block_stored f = a;          // one byte different: block_size 5
  f.block_hashes = {6};
  f.block_size = 5;
  kv_event_batch batch;
  batch.events = {a, b, c, r, d, e, f};
  for (event_dialect dialect : {event_dialect::vllm, event_dialect::tokenspeed}) {
    CAPTURE(dialect == event_dialect::vllm);
    std::string bytes;
    encode_event_batch(batch, dialect, bytes);
    check_like_decode(bytes);
    streamed got = stream(bytes);
    REQUIRE(got.same_tail.size() == 7);
    // tokenspeed writes no locality: c's tail is b's there.
    const bool c_same = dialect == event_dialect::tokenspeed;
    CHECK(got.same_tail == std::vector<bool>{false, true, c_same, false, false, true, false});
  }
}

TEST_CASE("random batches with runs of shared tails stream like decode, in both dialects") {
  rng r;
  size_t same = 0;
  for (int k = 0; k < 2000; ++k) {
    kv_event_batch b = random_batch(r);
    for (event_dialect d : {event_dialect::vllm, event_dialect::tokenspeed}) {
      std::string bytes;
      encode_event_batch(b, d, bytes);
      same += check_like_decode(bytes);
    }
  }
  CHECK(same > 1000); // the memo was exercised, not just the general walk
}

TEST_CASE("random mutations stream like decode: same events, same errors") {
  rng r;
  size_t failed = 0, decoded = 0;
  for (int k = 0; k < 3000; ++k) {
    kv_event_batch b = random_batch(r);
    std::string bytes;
    encode_event_batch(b, r.coin() ? event_dialect::vllm : event_dialect::tokenspeed, bytes);
    if (bytes.empty())
      continue;
    kvs_test::mutate(bytes, r);
    auto res = decode_event_batch(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    (res ? decoded : failed) += 1;
    check_like_decode(bytes);
  }
  CHECK(decoded > 0);
  CHECK(failed > 0);
}
