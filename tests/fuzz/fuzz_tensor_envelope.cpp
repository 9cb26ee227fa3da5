// libFuzzer target: LMCache 0.5.7's inline TensorEnvelope (commit_store's
// `data` from an engine-driven worker without a shared-memory pool). The
// whole input is the envelope. Nothing may crash, leak or read outside the
// input; a decoded envelope's tensors point into the input, and one whose
// tensors share a dtype and shape (what the session accepts) encodes back
// to bytes that decode to the same tensors.
#include "lmcache_wire/tensor_envelope.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  auto got = kvs::decode_tensor_envelope(in);
  if (!got) {
    if (got.error_value().detail.empty())
      __builtin_trap(); // every refusal names what was wrong
    return 0;
  }
  std::vector<std::string_view> datas;
  bool uniform = true;
  for (const auto& t : *got) {
    if (t.data.size() > 0 &&
        (t.data.data() < in.data() || t.data.data() + t.data.size() > in.data() + in.size()))
      __builtin_trap();
    if (t.shape.size() > kvs::envelope_max_rank)
      __builtin_trap();
    uniform &= t.dtype == got->front().dtype && t.shape == got->front().shape;
    datas.push_back(t.data);
  }
  if (got->empty() || !uniform)
    return 0;
  std::string again;
  kvs::encode_tensor_envelope(again, got->front().dtype, got->front().shape, datas);
  auto back = kvs::decode_tensor_envelope(again);
  if (!back || back->size() != got->size())
    __builtin_trap();
  for (size_t k = 0; k < got->size(); ++k)
    if ((*back)[k].dtype != (*got)[k].dtype || (*back)[k].shape != (*got)[k].shape ||
        (*back)[k].data != (*got)[k].data)
      __builtin_trap();
  return 0;
}
