// The KV-cache wrappers LMCache clients send in register_kv_cache's kv_cache
// list, decoded into tensor descriptors. Never throws: every problem is a
// error naming the field.
#pragma once

#include "core/tensor_desc.hpp"
#include "core/error.hpp"

#include <cstdint>
#include <string_view>

namespace kvs {

// ---------------------------------------------------------------------------
// KV-cache wrappers (the elements of register_kv_cache's kv_cache list)
// ---------------------------------------------------------------------------

/// msgpack ext code LMCache uses for every DeviceIPCWrapper (custom_types.py).
constexpr int8_t lmcache_ipc_wrapper_ext = 1;
/// kvsidecar's own ext code for a host shared-memory tensor (not an LMCache
/// code; LMCache 0.5.6 uses only 1). Payload: a msgpack map
/// {"shm_name": str, "offset": int, "dtype": str, "shape": [int], "stride": [int],
///  "storage_offset": int, "nbytes": int (optional)}. See docs/lmcache-mp-compat.md.
constexpr int8_t kvs_host_shm_ext = 0x4b;

/// Decodes one wrapper from its msgpack ext type and payload:
///  - ext 1, 0.5.6 data-only descriptor (a tagged map): "cuda" (torch
///    storage IPC) and "cuda_raw" -> cuda_ipc, "cpu_shm" -> host_shm;
///    "cuda_vmm", "musa", "npu" -> error kind "unsupported_wrapper";
///  - ext 1, legacy pickle (clients before 0.5.6, e.g. the SGLang seed's era):
///    read by the strict pickle reader (lmcache_wire/pickle_reader.hpp);
///  - ext kvs_host_shm_ext: our host shared-memory extension.
expected<tensor_desc> decode_kv_cache_wrapper(int8_t ext_type, std::string_view payload);

} // namespace kvs
