// The interface the gpu-transfer actor drives: open an instance's KV pools
// once at registration, copy pages between them and L1 chunk slots, close
// them at unregistration. Two implementations: host (POSIX shared memory,
// memcpy, synchronous) and CUDA (IPC handles, one kernel per request,
// asynchronous and ordered after the engine's event).
//
// How the actor uses a copy:
//   auto c = backend.copy(req);              // validated before anything is written
//   if (!c) -> reply [b"", false], commit/unlock nothing from this copy
//   reply [c->event_handle(), true] at once  // 64 bytes (CUDA) or empty (host)
//   later: c->poll() / c->wait() == done     -> STORE: commit the chunks
//                                               RETRIEVE: release the read locks
//          == failed                         -> STORE: discard the reservations
// Slots stay reserved/locked until then, so the copy never outlives them.
//
// Nothing in gpu/ throws: failures are kvs::error (core/error.hpp) of kind
//   "layout"        registration shape/stride/dtype we cannot handle
//   "unsupported"   a valid layout or engine this build does not copy
//   "bad_request"   a copy request that does not fit the registration
//   "open"          shm_open/mmap/cudaIpcOpenMemHandle and friends
//   "shm_truncated" host backend: the engine shrank a registered shared-memory
//                   object and a copy touched a page it no longer backs
//   "cuda"          any other CUDA runtime failure
//   "no_cuda"       no CUDA backend in this build or no usable GPU
// which the gpu-transfer actor turns into one log line and ok=false.
#pragma once

#include "core/error.hpp"
#include "gpu/kv_layout.hpp"
#include "core/tensor_desc.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvs {

enum class copy_direction {
  to_l1,    ///< STORE: engine pages -> L1 chunk slots
  from_l1,  ///< RETRIEVE: L1 chunk slots -> engine pages
};

/// An instance's registered pools, opened by one backend (mappings, streams).
/// Owned by the actor's per-instance state; released by close() or on
/// destruction, whichever comes first.
class opened_pools {
public:
  virtual ~opened_pools() = default;
  const kv_layout& layout() const { return layout_; }
  /// Name of the backend that opened these pools ("host", "cuda").
  virtual const char* backend_name() const = 0;
  virtual bool is_open() const = 0;
  /// Host backend (gpu.host_prefault): bytes of the pools' mappings the
  /// background prefault has faulted in, and whether it has ended.
  virtual uint64_t prefaulted_bytes() const { return 0; }
  virtual bool prefault_finished() const { return true; }

protected:
  explicit opened_pools(kv_layout l) : layout_(std::move(l)) {}

private:
  kv_layout layout_;
};

/// One L1 chunk taking part in a copy.
struct l1_chunk {
  /// Position of the chunk in the request, counted from the key's start
  /// token: selects block ids [chunk_index*bpc, (chunk_index+1)*bpc) of each
  /// group. Lets a STORE copy only the chunks L1 does not hold yet.
  uint64_t chunk_index = 0;
  /// Host memory, slot_bytes long, layout [2, num_layers, chunk_tokens, token_bytes].
  uint8_t* slot = nullptr;
};

struct copy_request {
  copy_direction direction = copy_direction::to_l1;
  opened_pools* pools = nullptr;                  ///< not owned
  std::vector<std::vector<int64_t>> block_ids;    ///< per engine group, as on the wire
  std::vector<l1_chunk> chunks;                   ///< one per chunk copied
  uint64_t chunk_tokens = 0;                      ///< LMCache chunk size (256)
  uint64_t slot_bytes = 0;                        ///< capacity of every slot; >= chunk_bytes
  /// RETRIEVE only: the first N entries of each block-id list are never
  /// written (the engine already holds those pages; their ids are
  /// placeholders and are not even range-checked).
  uint64_t skip_prefix_n_blocks = 0;
  /// The engine's 64-byte cudaIpcEventHandle_t to order after, or empty.
  std::string engine_event_handle;
};

/// Completion of one copy. Destroying it early is safe: backends keep what
/// the device still uses alive on their own.
class copy_completion {
public:
  enum class state { pending, done, failed };
  virtual ~copy_completion() = default;
  /// Our event's handle to answer the engine with: 64 bytes (CUDA) or empty.
  const std::string& event_handle() const { return event_handle_; }
  /// Non-blocking.
  virtual state poll() = 0;
  /// Blocks until the copy finished or failed.
  virtual state wait() = 0;
  /// Why it failed; empty otherwise.
  virtual std::string error() const = 0;

protected:
  std::string event_handle_;
};

/// A run of bytes of one K/V plane (layout.planes' index), `offset` bytes
/// past the plane's block 0 (POST /cache/checksums: gpu/block_checksum.hpp).
struct plane_read {
  uint32_t plane = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

class transfer_backend {
public:
  virtual ~transfer_backend() = default;
  virtual const char* name() const = 0;
  /// Maps every registered tensor (once per distinct memory object) and
  /// checks the layout fits inside the mappings.
  virtual expected<std::unique_ptr<opened_pools>> open(const std::vector<tensor_desc>& tensors,
                                                       const kv_layout& layout) = 0;
  /// Waits for in-flight copies on these pools and releases the mappings.
  /// Idempotent.
  virtual void close(opened_pools& pools) = 0;
  /// Validates the whole request (block ids, slots, sizes) before touching
  /// any memory: an invalid request writes nothing. A valid one can still
  /// fail part-way when the engine shrinks its memory under the copy (host:
  /// "shm_truncated"); the caller then treats every chunk as not copied.
  virtual expected<std::unique_ptr<copy_completion>> copy(const copy_request& req) = 0;
  /// Copies each run, in order and end to end, into `out` (the runs' bytes
  /// long): host, a memcpy from the mapping under the SIGBUS guard; CUDA,
  /// device-to-host copies on the instance's stream (after its copies in
  /// flight). The runs must lie inside the planes (callers check block ids).
  virtual status read_planes(opened_pools& pools, const std::vector<plane_read>& runs,
                             uint8_t* out) = 0;
  /// Makes [p, p+n) usable as L1 slot memory for copies (CUDA: page-locks and
  /// maps it for device access). Host backend: no-op.
  virtual status pin_host_memory(void* p, size_t n) = 0;
  virtual void unpin_host_memory(void* p) = 0;
};

struct host_backend_options {
  /// gpu.host_prefault: after open(), a nice-19 thread faults the sidecar's
  /// mapping of each registered shared-memory object in
  /// (MADV_POPULATE_WRITE, 64 MiB a step). Otherwise the first copy to or
  /// from every 4 KiB of the engine's pool pays a minor fault in the
  /// sidecar (~10x the memcpy: 1.5 ms instead of 0.15 ms for 4 MiB), which
  /// a CPU engine cycling through its free blocks hits on almost every
  /// request. The engine has already written its pool, so this allocates
  /// nothing; an object with holes (never fully written) is skipped, so a
  /// client cannot make the sidecar commit memory it registered sparse.
  bool prefault = true;
  /// Bytes of engine pools faulted in at once, over every live instance:
  /// page tables cost ~2 MiB per GiB, so a client registering instance
  /// after instance cannot grow them without bound. An instance whose
  /// objects would pass it is not prefaulted (its copies fault lazily, as
  /// with prefault off); its bytes count until its pools are released.
  int64_t prefault_max_bytes = int64_t{256} << 30;
  /// gpu.host_copy_threads: a copy of 8 MiB or more is split over this many
  /// threads, the transfer actor's included (gpu/copy_crew.hpp); 1 = the
  /// actor's thread alone.
  size_t copy_threads = 2;
};

std::unique_ptr<transfer_backend> make_host_backend(host_backend_options opts = {});
/// The CUDA backend, or error kind "no_cuda" (the reason in `detail`) when
/// built without CUDA or no GPU is usable.
expected<std::unique_ptr<transfer_backend>> make_cuda_backend();
/// Which devices the CUDA runtime sees ("2 CUDA device(s): [0] ..."), or
/// error kind "no_cuda" saying why there is none.
expected<std::string> cuda_device_present();

} // namespace kvs
