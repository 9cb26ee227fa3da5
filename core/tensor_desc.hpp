// A registered KV-cache tensor as the engine described it, decoded from the
// wire (LMCache's DeviceIPCWrapper: the 0.5.6 data-only descriptor or an
// older client's pickle; or our host shared-memory extension). The registry
// keeps these; the transfer backends open them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvs {

struct tensor_desc {
  enum class memory_kind { cuda_ipc, host_shm };
  memory_kind kind = memory_kind::cuda_ipc;

  // --- cuda_ipc (torch storage._share_cuda_() + CudaIPCWrapper attributes)
  std::string device_uuid;       ///< "GPU-xxxxxxxx-..." as torch reports it
  int64_t device_index = -1;     ///< ordinal in the engine process (a hint only)
  std::string ipc_mem_handle;    ///< the 64-byte cudaIpcMemHandle_t
  /// Bytes of the storage the view lives in (cuda_ipc: torch storage size or
  /// raw byte range; host_shm: the segment from shm_offset_bytes, 0 = not sent).
  uint64_t storage_size_bytes = 0;
  uint64_t storage_offset_bytes = 0; ///< offset of the storage inside the IPC allocation
  /// torch's event for the storage (64-byte cudaIpcEventHandle_t; empty when
  /// torch sent None). When event_sync_required, wait on it before first use.
  std::string ipc_event_handle;
  bool event_sync_required = false;

  // --- host_shm (our extension, see lmcache_wire/lmcache_protocol.hpp)
  std::string shm_name;          ///< POSIX shm object name, e.g. "/kvs_pool_123_0"
  uint64_t shm_offset_bytes = 0; ///< byte offset of the storage inside the shm object

  // --- the tensor view (both kinds)
  std::string dtype;             ///< torch name without prefix: "float16", "bfloat16", ...
  uint32_t element_size = 0;     ///< bytes per element
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;   ///< in elements
  int64_t storage_offset = 0;    ///< in elements, from the start of the storage
};

} // namespace kvs
