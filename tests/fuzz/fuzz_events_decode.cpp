// libFuzzer target for the KV event codec: decoding any bytes must neither
// crash nor throw, and whatever decodes must encode, in both dialects, to
// bytes that decode again to the same number of events, with nothing dropped,
// and re-encode to the very same bytes (the encoder's output is a fixed point).
#include "messages/kv_event_codec.hpp"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <variant>

namespace {

const kvs::event_decode_result& must_decode(const std::string& bytes) {
  static std::variant<kvs::event_decode_result, kvs::wire_error> keep;
  keep = kvs::decode_event_batch(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  auto* ok = std::get_if<kvs::event_decode_result>(&keep);
  if (!ok || !ok->dropped.empty())
    std::abort();
  return *ok;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto decoded = kvs::decode_event_batch(data, size);
  auto* ok = std::get_if<kvs::event_decode_result>(&decoded);
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
  }
  return 0;
}
