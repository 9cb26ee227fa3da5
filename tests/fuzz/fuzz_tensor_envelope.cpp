// libFuzzer target: LMCache 0.5.7's inline TensorEnvelope (commit_store's
// `data` from an engine-driven worker without a shared-memory pool). The
// whole input is the envelope. Nothing may crash, leak or read outside the
// input; a decoded envelope's tensors point into the input, and one whose
// tensors share a dtype and shape (what the session accepts) encodes back
// to bytes that decode to the same tensors. The same input is decoded as
// the grouped envelope of hybrid-KV workers too, with the same checks and
// a round trip of groups whose tensors share a dtype and shape and whose
// chunk indices are consecutive (what the session encodes).
#include "tests/fuzz/fuzz_fail.hpp"
#include "lmcache_wire/tensor_envelope.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace {

bool inside(std::string_view in, std::string_view d) {
  return d.empty() || (d.data() >= in.data() && d.data() + d.size() <= in.data() + in.size());
}

void grouped(std::string_view in) {
  auto got = kvs::decode_grouped_tensor_envelope(in);
  if (!got) {
    if (got.error_value().detail.empty())
      KVS_FUZZ_FAIL();
    return;
  }
  if (got->size() > kvs::envelope_max_groups)
    KVS_FUZZ_FAIL();
  std::vector<kvs::envelope_group_out> out;
  for (const auto& g : *got) {
    if (g.chunk_indices.size() != g.tensors.size())
      KVS_FUZZ_FAIL();
    for (size_t k = 0; k < g.chunk_indices.size(); ++k)
      if (g.chunk_indices[k] < 0 || (k > 0 && g.chunk_indices[k] <= g.chunk_indices[k - 1]))
        KVS_FUZZ_FAIL();
    kvs::envelope_group_out o;
    for (size_t k = 0; k < g.tensors.size(); ++k) {
      const auto& t = g.tensors[k];
      if (!inside(in, t.data) || t.shape.size() > kvs::envelope_max_rank)
        KVS_FUZZ_FAIL();
      if (k > 0 && (t.dtype != g.tensors[0].dtype || t.shape != g.tensors[0].shape
                    || g.chunk_indices[k] != g.chunk_indices[k - 1] + 1))
        return; // not what the session encodes: no round trip
      o.datas.push_back(t.data);
    }
    if (!g.tensors.empty()) {
      o.dtype = g.tensors[0].dtype;
      o.shape = g.tensors[0].shape;
      o.first = static_cast<uint64_t>(g.chunk_indices[0]);
    }
    out.push_back(std::move(o));
  }
  std::string again;
  kvs::encode_grouped_tensor_envelope(again, out);
  auto back = kvs::decode_grouped_tensor_envelope(again);
  if (!back || back->size() != got->size())
    KVS_FUZZ_FAIL();
  for (size_t g = 0; g < got->size(); ++g) {
    const auto& a = (*got)[g];
    const auto& b = (*back)[g];
    if (a.chunk_indices != b.chunk_indices || a.tensors.size() != b.tensors.size())
      KVS_FUZZ_FAIL();
    for (size_t k = 0; k < a.tensors.size(); ++k)
      if (a.tensors[k].data != b.tensors[k].data || a.tensors[k].shape != b.tensors[k].shape
          || a.tensors[k].dtype != b.tensors[k].dtype)
        KVS_FUZZ_FAIL();
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  grouped(in);
  auto got = kvs::decode_tensor_envelope(in);
  if (!got) {
    if (got.error_value().detail.empty())
      KVS_FUZZ_FAIL(); // every refusal names what was wrong
    return 0;
  }
  std::vector<std::string_view> datas;
  bool uniform = true;
  for (const auto& t : *got) {
    if (t.data.size() > 0 &&
        (t.data.data() < in.data() || t.data.data() + t.data.size() > in.data() + in.size()))
      KVS_FUZZ_FAIL();
    if (t.shape.size() > kvs::envelope_max_rank)
      KVS_FUZZ_FAIL();
    uniform &= t.dtype == got->front().dtype && t.shape == got->front().shape;
    datas.push_back(t.data);
  }
  if (got->empty() || !uniform)
    return 0;
  std::string again;
  kvs::encode_tensor_envelope(again, got->front().dtype, got->front().shape, datas);
  auto back = kvs::decode_tensor_envelope(again);
  if (!back || back->size() != got->size())
    KVS_FUZZ_FAIL();
  for (size_t k = 0; k < got->size(); ++k)
    if ((*back)[k].dtype != (*got)[k].dtype || (*back)[k].shape != (*got)[k].shape ||
        (*back)[k].data != (*got)[k].data)
      KVS_FUZZ_FAIL();
  return 0;
}
