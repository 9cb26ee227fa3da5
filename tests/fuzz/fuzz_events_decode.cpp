// libFuzzer target for the KV event codec: decoding any bytes must neither
// crash nor throw, and whatever decodes must encode, in both dialects, to
// bytes that decode again to the same number of events, with nothing dropped,
// and re-encode to the very same bytes (the encoder's output is a fixed point).
// The pass-through fast path must agree: wherever check_canonical_event_batch
// accepts an input (fuzzed, or the encoder's own output, which it must always
// accept), its bytes with any dp_rank equal decode + encode's, and what it
// records of each event for the indexer is what decode reads.
#include "tests/fuzz/fuzz_fail.hpp"
#include "events_wire/kv_event_codec.hpp"

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace {

const kvs::event_decode_result& must_decode(const std::string& bytes) {
  static std::optional<kvs::expected<kvs::event_decode_result>> keep;
  keep = kvs::decode_event_batch(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  if (!*keep || !(*keep)->dropped.empty())
    KVS_FUZZ_FAIL();
  return keep->value();
}

/// What the check records for the indexer must be what decode reads.
void check_recorded(const std::string& in, kvs::event_dialect d,
                    const std::vector<kvs::kv_event>& want) {
  kvs::canonical_events rec;
  const auto* p = reinterpret_cast<const uint8_t*>(in.data());
  if (!kvs::check_canonical_event_batch(p, in.size(), d, &rec) || rec.events.size() != want.size())
    KVS_FUZZ_FAIL();
  for (size_t k = 0; k < want.size(); ++k) {
    const kvs::canonical_event& ev = rec.events[k];
    if (size_t{ev.at} + ev.size > in.size())
      KVS_FUZZ_FAIL();
    auto one = kvs::decode_one_event(p + ev.at, ev.size);
    if (!one || !(*one == want[k]))
      KVS_FUZZ_FAIL();
    auto* s = std::get_if<kvs::block_stored>(&want[k]);
    if (ev.stored != (s != nullptr) || (ev.same_tail && (k == 0 || !s ||
        !std::holds_alternative<kvs::block_stored>(want[k - 1]))))
      KVS_FUZZ_FAIL();
    if (!s)
      continue;
    if (std::vector<uint64_t>(rec.hashes.begin() + ev.hashes_at,
                              rec.hashes.begin() + ev.hashes_at + ev.hashes) != s->block_hashes ||
        ev.has_parent != s->parent_block_hash.has_value() ||
        (ev.has_parent && ev.parent != *s->parent_block_hash) || ev.tokens != s->token_ids.size())
      KVS_FUZZ_FAIL();
    for (size_t t = 0; ev.narrow && t < s->token_ids.size(); ++t)
      if (rec.tokens[ev.tokens_at + t] != s->token_ids[t])
        KVS_FUZZ_FAIL();
  }
}

/// The fast path's output must be decode + encode's for every rank.
void check_passthrough(const std::string& in, kvs::event_dialect d, bool must_accept) {
  auto c = kvs::check_canonical_event_batch(reinterpret_cast<const uint8_t*>(in.data()), in.size(), d);
  if (!c) {
    if (must_accept)
      KVS_FUZZ_FAIL();
    return;
  }
  kvs::event_decode_result ok = must_decode(in);
  if (ok.batch.events.size() != c->events || ok.batch.dp_rank != c->dp_rank)
    KVS_FUZZ_FAIL();
  check_recorded(in, d, ok.batch.events);
  for (std::optional<int64_t> r : {std::optional<int64_t>{}, std::optional<int64_t>{0},
                                   std::optional<int64_t>{-40000}, c->dp_rank}) {
    ok.batch.dp_rank = r;
    std::string slow, fast;
    kvs::encode_event_batch(ok.batch, d, slow);
    kvs::encode_canonical_with_rank(reinterpret_cast<const uint8_t*>(in.data()), *c, r, fast);
    if (slow != fast)
      KVS_FUZZ_FAIL();
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  for (kvs::event_dialect d : {kvs::event_dialect::vllm, kvs::event_dialect::tokenspeed})
    check_passthrough(input, d, false);
  auto decoded = kvs::decode_event_batch(data, size);
  auto* ok = decoded ? &decoded.value() : nullptr;
  if (!ok)
    return 0;
  for (kvs::event_dialect d : {kvs::event_dialect::vllm, kvs::event_dialect::tokenspeed}) {
    std::string first;
    kvs::encode_event_batch(ok->batch, d, first);
    const kvs::event_decode_result& again = must_decode(first);
    if (again.batch.events.size() != ok->batch.events.size())
      KVS_FUZZ_FAIL();
    std::string second;
    kvs::encode_event_batch(again.batch, d, second);
    if (second != first)
      KVS_FUZZ_FAIL();
    check_passthrough(first, d, true);
  }
  return 0;
}
