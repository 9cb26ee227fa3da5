// Torch tensor views and CUDA share tuples: the checks LMCache's
// TensorMetadata and torch's storage sharing imply, shared by both encodings
// of an LMCache IPC wrapper (the 0.5.6 descriptor, tensor_wrappers.cpp, and
// the legacy pickle, pickle_reader.cpp). No msgpack or pickle here.
#pragma once

#include "core/tensor_desc.hpp"
#include "core/error.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvs {

// Helpers shared by both ext-1 encodings (descriptor and pickle).

/// Bytes per element of a torch dtype given by its name without "torch."
/// ("float16", "bfloat16", "float8_e4m3fn", ...), or nullopt if unknown.
std::optional<uint32_t> torch_dtype_size(std::string_view dtype);

/// torch `UntypedStorage._share_cuda_()` tuple, the `handle` of a
/// CudaIPCWrapper: (device, mem handle, storage size bytes, storage offset
/// bytes, ref-counter handle, ref-counter offset, event handle, event sync).
struct torch_cuda_share {
  int64_t device = 0;
  std::optional<std::string> mem_handle;
  int64_t storage_size_bytes = 0;
  int64_t storage_offset_bytes = 0;
  std::optional<std::string> ref_counter_handle;
  int64_t ref_counter_offset = 0;
  std::optional<std::string> event_handle;
  bool event_sync_required = false;
};

/// Fills the cuda_ipc fields of `out` from a torch share tuple. The mem
/// handle is torch's shareable handle: either a bare 64-byte
/// cudaIpcMemHandle_t or `[version 1..3]['c'][64 bytes]`; 'e' (expandable
/// segment) handles are rejected as "unsupported_wrapper".
status apply_torch_cuda_share(const torch_cuda_share& share, tensor_desc& out);

/// Sets and checks the tensor view as LMCache's TensorMetadata does: dtype
/// known, ranks equal (<= 64), sizes, strides and storage_offset >= 0, and,
/// when `check_span`, the view's byte span within `out.storage_size_bytes`.
status apply_tensor_view(std::string dtype, std::vector<int64_t> shape,
                         std::vector<int64_t> stride, int64_t storage_offset,
                         tensor_desc& out, bool check_span = true);

} // namespace kvs
