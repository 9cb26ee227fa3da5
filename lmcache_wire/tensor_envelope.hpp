// LMCache 0.5.7's inline transfer data (transfer_context/tensor_wire.py):
// what an engine-driven worker without a shared-memory pool sends in
// commit_store's `data` and reads back from prepare_retrieve's `data`.
//
//   TensorEnvelope {"version": 1, "tensors": [{"dtype": str, "shape": [int],
//                                              "data": bin}, ...]}
//
// One tensor per chunk of the key's range, in chunk order, each the chunk
// as the engine views it ([2, NL, T, H], or [NL, T, H] with use_mla) in
// C order: exactly an L1 chunk's bytes. Decoded as msgspec does with
// forbid_unknown_fields, within tensor_wire.py's limits.
//
// Multi-group (hybrid-KV) workers send and expect the group-major form:
//
//   GroupedTensorEnvelope {"version": 1, "groups": [{"chunk_indices": [int],
//                                                    "tensors": [...]}, ...]}
//
// one entry per registered engine group, each with the chunk positions
// (within the key's range, strictly increasing) its tensors fill, in that
// group's own layout. All-null chunks of a sliding-window group are absent
// from a store; a retrieve carries each group's in-window suffix.
#pragma once

#include "core/error.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvs {

/// tensor_wire.py's bounds.
constexpr size_t envelope_max_tensors = 65536;
constexpr size_t envelope_max_rank = 16;
constexpr uint64_t envelope_max_tensor_bytes = uint64_t{2} << 30;

struct envelope_tensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string_view data; ///< into the decoded bytes
};

constexpr size_t envelope_max_groups = 64;

/// Every tensor of `bytes`, or what is wrong where ("tensors[3]: field
/// 'shape': ...").
expected<std::vector<envelope_tensor>> decode_tensor_envelope(std::string_view bytes);

/// Appends a TensorEnvelope of `datas` (each of `dtype` and `shape`) to `out`.
void encode_tensor_envelope(std::string& out, const std::string& dtype,
                            const std::vector<int64_t>& shape,
                            const std::vector<std::string_view>& datas);

struct envelope_group {
  std::vector<int64_t> chunk_indices;
  std::vector<envelope_tensor> tensors;
};

/// Every group of a GroupedTensorEnvelope, each group's chunk_indices
/// checked (one per tensor, strictly increasing, non-negative), or what is
/// wrong where ("groups[1]: chunk_indices: ...").
expected<std::vector<envelope_group>> decode_grouped_tensor_envelope(std::string_view bytes);

/// One group to encode: `datas` fill chunk positions first, first + 1, ...
struct envelope_group_out {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t first = 0;
  std::vector<std::string_view> datas;
};
/// Appends a GroupedTensorEnvelope of `groups` to `out`.
void encode_grouped_tensor_envelope(std::string& out, const std::vector<envelope_group_out>& groups);

} // namespace kvs
