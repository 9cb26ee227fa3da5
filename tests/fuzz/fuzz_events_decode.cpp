// libFuzzer target for the KV event codec: decoding any bytes must neither
// crash nor throw, and whatever decodes must encode, in both dialects, to
// bytes that decode again to the same number of events, with nothing dropped,
// and re-encode to the very same bytes (the encoder's output is a fixed point).
// The pass-through fast path must agree: wherever check_canonical_event_batch
// accepts an input (fuzzed, or the encoder's own output, which it must always
// accept), its bytes with any dp_rank equal decode + encode's. And
// for_each_event (the indexer's decode) must hand over exactly the events
// decode_event_batch returns, and fail where it fails.
#include "messages/kv_event_codec.hpp"

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
    std::abort();
  return keep->value();
}

/// The fast path's output must be decode + encode's for every rank.
void check_passthrough(const std::string& in, kvs::event_dialect d, bool must_accept) {
  auto c = kvs::check_canonical_event_batch(reinterpret_cast<const uint8_t*>(in.data()), in.size(), d);
  if (!c) {
    if (must_accept)
      std::abort();
    return;
  }
  kvs::event_decode_result ok = must_decode(in);
  if (ok.batch.events.size() != c->events || ok.batch.dp_rank != c->dp_rank)
    std::abort();
  for (std::optional<int64_t> r : {std::optional<int64_t>{}, std::optional<int64_t>{0},
                                   std::optional<int64_t>{-40000}, c->dp_rank}) {
    ok.batch.dp_rank = r;
    std::string slow, fast;
    kvs::encode_event_batch(ok.batch, d, slow);
    kvs::encode_canonical_with_rank(reinterpret_cast<const uint8_t*>(in.data()), *c, r, fast);
    if (slow != fast)
      std::abort();
  }
}

/// for_each_event agrees with decode_event_batch on `in`.
void check_stream(const std::string& in) {
  auto decoded = kvs::decode_event_batch(reinterpret_cast<const uint8_t*>(in.data()), in.size());
  std::vector<kvs::kv_event> got;
  auto streamed = kvs::for_each_event(in, [&](const kvs::kv_event& ev, bool same_tail) {
    if (same_tail && (got.empty() || !std::holds_alternative<kvs::block_stored>(got.back()) ||
                      !std::holds_alternative<kvs::block_stored>(ev)))
      std::abort();
    got.push_back(ev);
  });
  if (streamed.has_value() != decoded.has_value())
    std::abort();
  if (decoded && got != decoded->batch.events)
    std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  check_stream(input);
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
      std::abort();
    std::string second;
    kvs::encode_event_batch(again.batch, d, second);
    if (second != first)
      std::abort();
    check_passthrough(first, d, true);
    check_stream(first);
  }
  return 0;
}
