// Torch tensor views and CUDA share tuples, shared by both encodings of an
// LMCache IPC wrapper (the 0.5.6 descriptor and the legacy pickle).
#include "lmcache_wire/tensor_view.hpp"

#include <utility>

namespace kvs {


std::optional<uint32_t> torch_dtype_size(std::string_view dtype) {
  static constexpr std::pair<const char*, uint32_t> k_dtypes[] = {
      {"float16", 2},        {"bfloat16", 2},        {"float32", 4},         {"float64", 8},
      {"float8_e4m3fn", 1},  {"float8_e5m2", 1},     {"float8_e4m3fnuz", 1}, {"float8_e5m2fnuz", 1},
      {"float8_e8m0fnu", 1}, {"float4_e2m1fn_x2", 1}, {"int8", 1},           {"uint8", 1},
      {"int16", 2},          {"uint16", 2},          {"int32", 4},           {"uint32", 4},
      {"int64", 8},          {"uint64", 8},          {"bool", 1},            {"complex32", 4},
      {"complex64", 8},      {"complex128", 16},
  };
  for (const auto& d : k_dtypes)
    if (dtype == d.first) return d.second;
  return std::nullopt;
}

status apply_torch_cuda_share(const torch_cuda_share& s, tensor_desc& out) {
  if (!s.mem_handle) return error{"bad_wrapper", "handle[1]: no CUDA memory handle"};
  const std::string& h = *s.mem_handle;
  // c10 CUDACachingAllocator::shareIpcHandle: [version][type]['c' payload =
  // cudaIpcMemHandle_t]. Versions 1-3 share the 'c' layout (torch 2.13 moved
  // to 3 without changing it); a bare 64-byte handle predates versioning.
  if (h.size() == 64) {
    out.ipc_mem_handle = h;
  } else if (h.size() >= 2 && h[1] == 'e') {
    return error{"unsupported_wrapper",
                 "handle[1]: expandable-segment handle (PYTORCH_CUDA_ALLOC_CONF=expandable_segments) cannot be opened with cudaIpcOpenMemHandle"};
  } else if (h.size() == 66 && h[1] == 'c' && h[0] >= 1 && h[0] <= 3) {
    out.ipc_mem_handle = h.substr(2);
  } else {
    return error{"bad_wrapper", "handle[1]: unrecognised torch shareable handle (" + std::to_string(h.size()) + " bytes)"};
  }
  if (s.device < 0) return error{"bad_wrapper", "handle[0]: negative device"};
  if (s.storage_size_bytes < 0 || s.storage_offset_bytes < 0)
    return error{"bad_wrapper", "handle[2..3]: negative storage size or offset"};
  if (s.event_handle && !s.event_handle->empty() && s.event_handle->size() != 64)
    return error{"bad_wrapper", "handle[6]: event handle of " + std::to_string(s.event_handle->size()) + " bytes (expected 64)"};
  out.kind = tensor_desc::memory_kind::cuda_ipc;
  out.device_index = s.device;
  out.storage_size_bytes = static_cast<uint64_t>(s.storage_size_bytes);
  out.storage_offset_bytes = static_cast<uint64_t>(s.storage_offset_bytes);
  out.ipc_event_handle = s.event_handle ? *s.event_handle : std::string();
  out.event_sync_required = s.event_sync_required;
  return {};
}

status apply_tensor_view(std::string dtype, std::vector<int64_t> shape, std::vector<int64_t> stride,
                         int64_t storage_offset, tensor_desc& out, bool check_span) {
  auto size = torch_dtype_size(dtype);
  if (!size) return error{"bad_wrapper", "unsupported dtype '" + dtype.substr(0, 32) + "'"};
  if (shape.size() != stride.size())
    return error{"bad_wrapper", "shape rank " + std::to_string(shape.size()) + " != stride rank " + std::to_string(stride.size())};
  if (shape.size() > 64) return error{"bad_wrapper", "rank above 64"};
  if (storage_offset < 0) return error{"bad_wrapper", "negative storage_offset"};
  // TensorMetadata.byte_span(): itemsize * (storage_offset + 1 + sum((size-1)*stride)),
  // 0 for an empty view; computed without overflow.
  bool empty = false;
  for (size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] < 0 || stride[k] < 0) return error{"bad_wrapper", "negative size or stride"};
    if (shape[k] == 0) empty = true;
  }
  if (check_span && !empty) {
    uint64_t elems = static_cast<uint64_t>(storage_offset) + 1, term = 0, span = 0;
    bool overflow = false;
    for (size_t k = 0; k < shape.size() && !overflow; ++k) {
      overflow |= __builtin_mul_overflow(static_cast<uint64_t>(shape[k] - 1), static_cast<uint64_t>(stride[k]), &term);
      overflow |= __builtin_add_overflow(elems, term, &elems);
    }
    overflow |= __builtin_mul_overflow(elems, uint64_t{*size}, &span);
    if (overflow || span > out.storage_size_bytes)
      return error{"bad_wrapper", "view exceeds its storage (" + std::to_string(out.storage_size_bytes) + " bytes)"};
  }
  out.dtype = std::move(dtype);
  out.element_size = *size;
  out.shape = std::move(shape);
  out.stride = std::move(stride);
  out.storage_offset = storage_offset;
  return {};
}

} // namespace kvs
