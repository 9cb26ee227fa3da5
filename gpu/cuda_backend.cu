// CUDA backend: the engine's KV pools are CUDA IPC allocations on one GPU,
// L1 slots are page-locked host memory mapped for device access. A copy is
// ordered after the engine's interprocess event, runs as ONE kernel launch
// for all layers of all chunks (block_copy.hpp math), and is followed by
// our own interprocess event whose handle goes back to the engine at once.
//
// Lifetimes, and why:
// - IPC mappings are per (process, allocation): the driver hands out one
//   mapping however often a handle is opened and one cudaIpcCloseMemHandle
//   unmaps it for everyone, so opens are refcounted process-wide by handle.
// - Our exported events must outlive the engine's wait on them, which we
//   cannot observe: like LMCache (event_ipc.py, 2048-entry ring) we keep the
//   last `event_ring_size` per instance alive and recycle only the oldest.
// - Per-request parameters (block ids, slot pointers) travel in a pinned
//   staging buffer copied to device memory on the stream; a buffer is reused
//   only after the event recorded behind its copy has completed.
#include "gpu/block_copy.hpp"
#include "gpu/copy_plan.hpp"
#include "gpu/device_uuid.hpp"
#include "gpu/transfer_backend.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace kvs {

namespace {

constexpr size_t event_ring_size = 2048;
constexpr size_t ipc_handle_bytes = 64;
static_assert(sizeof(cudaIpcMemHandle_t) == ipc_handle_bytes, "cudaIpcMemHandle_t is 64 bytes");
static_assert(sizeof(cudaIpcEventHandle_t) == ipc_handle_bytes, "cudaIpcEventHandle_t is 64 bytes");

error cuda_err(cudaError_t e, const std::string& what) {
  return make_error("cuda", what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

#define KVS_CUDA_TRY(call, what)                     \
  do {                                               \
    const cudaError_t kvs_e_ = (call);               \
    if (kvs_e_ != cudaSuccess) return cuda_err(kvs_e_, (what)); \
  } while (0)

// ---------------------------------------------------------------- kernel

struct kernel_args {
  block_copy::geometry g;
  uint64_t total_units;
  uint64_t skip_blocks;
  int to_l1;
  uint8_t* const* slots;         ///< per chunk position, device-accessible L1 pointers
  const uint64_t* chunk_index;   ///< per chunk position
  const int64_t* blocks;         ///< packed [chunk position][group][page]
  uint8_t* const* plane_base;    ///< [kv * num_layers + layer]
  const uint32_t* layer_group;   ///< per layer
};

// Four loads in flight per thread before the stores: host-mapped L1 memory
// sits behind PCIe, where latency, not bandwidth, limits a naive loop.
template <typename V>
__device__ __forceinline__ void copy_run(uint8_t* dst, const uint8_t* src, uint64_t n) {
  const V* s = reinterpret_cast<const V*>(src);
  V* d = reinterpret_cast<V*>(dst);
  const uint64_t count = n / sizeof(V);
  const uint64_t step = blockDim.x;
  constexpr int unroll = 4;
  uint64_t i = threadIdx.x;
  for (; i + (unroll - 1) * step < count; i += unroll * step) {
    V r[unroll];
#pragma unroll
    for (int k = 0; k < unroll; ++k) r[k] = s[i + k * step];
#pragma unroll
    for (int k = 0; k < unroll; ++k) d[i + k * step] = r[k];
  }
  for (; i < count; i += step) d[i] = s[i];
}

__device__ __forceinline__ void copy_page(uint8_t* dst, const uint8_t* src, uint64_t n) {
  const uint64_t align = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | n;
  if ((align & 15) == 0)
    copy_run<uint4>(dst, src, n);
  else if ((align & 7) == 0)
    copy_run<uint2>(dst, src, n);
  else if ((align & 3) == 0)
    copy_run<unsigned int>(dst, src, n);
  else
    copy_run<unsigned char>(dst, src, n);
}

// A head-major page: its runs of head_dim, vectors spread over the block's
// threads (a run alone is too short to keep them busy).
template <typename V>
__device__ __forceinline__ void copy_runs(uint8_t* l1, uint8_t* engine,
                                          const block_copy::geometry& g, bool to_l1) {
  const uint64_t per = block_copy::run_bytes(g) / sizeof(V);
  const uint64_t total = block_copy::runs_per_unit(g) * per;
  for (uint64_t i = threadIdx.x; i < total; i += blockDim.x) {
    const uint64_t r = i / per, k = i % per;
    V* e = reinterpret_cast<V*>(engine + block_copy::engine_run_offset(g, r)) + k;
    V* c = reinterpret_cast<V*>(l1 + block_copy::l1_run_offset(g, r)) + k;
    if (to_l1)
      *c = *e;
    else
      *e = *c;
  }
}

__device__ __forceinline__ void copy_strided_page(uint8_t* l1, uint8_t* engine,
                                                  const block_copy::geometry& g, bool to_l1) {
  const uint64_t align = reinterpret_cast<uintptr_t>(l1) | reinterpret_cast<uintptr_t>(engine) |
                         g.head_bytes | g.head_stride_bytes | g.token_stride_bytes;
  if ((align & 15) == 0)
    copy_runs<uint4>(l1, engine, g, to_l1);
  else if ((align & 7) == 0)
    copy_runs<uint2>(l1, engine, g, to_l1);
  else if ((align & 3) == 0)
    copy_runs<unsigned int>(l1, engine, g, to_l1);
  else
    copy_runs<unsigned char>(l1, engine, g, to_l1);
}

// One thread block per unit (a page of one layer's K or V of one chunk),
// grid-striding over all units of the request.
__global__ void block_copy_kernel(kernel_args a) {
  for (uint64_t u = blockIdx.x; u < a.total_units; u += gridDim.x) {
    const block_copy::unit x = block_copy::unit_at(a.g, u);
    const uint64_t chunk_index = a.chunk_index[x.chunk];
    if (!a.to_l1 && page_skipped(a.g, a.skip_blocks, chunk_index, x.page)) continue;
    const uint32_t group = a.layer_group[x.layer];
    const int64_t block = a.blocks[block_copy::packed_block_index(a.g, x.chunk, group, x.page)];
    uint8_t* engine = a.plane_base[block_copy::plane_index(a.g, x.kv, x.layer)] +
                      block_copy::engine_offset(a.g, static_cast<uint64_t>(block), 0);
    uint8_t* l1 = a.slots[x.chunk] + block_copy::l1_page_offset(a.g, x);
    if (a.g.strided_heads != 0)
      copy_strided_page(l1, engine, a.g, a.to_l1 != 0);
    else if (a.to_l1)
      copy_page(l1, engine, a.g.page_bytes);
    else
      copy_page(engine, l1, a.g.page_bytes);
  }
}

// ---------------------------------------------------------------- devices

expected<int> device_by_uuid(const std::string& uuid) {
  auto parsed = parse_device_uuid(uuid);
  if (!parsed)
    return make_error("open", "device UUID '" + uuid + "' is not a GPU UUID");
  const device_uuid_bytes& want = *parsed;
  int n = 0;
  KVS_CUDA_TRY(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
  std::string seen;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    KVS_CUDA_TRY(cudaGetDeviceProperties(&prop, i), "cudaGetDeviceProperties");
    device_uuid_bytes have{};
    std::memcpy(have.data(), prop.uuid.bytes, have.size());
    if (have == want) return i;
    seen += (seen.empty() ? "" : ", ") + format_device_uuid(have);
  }
  return make_error("open", "no visible GPU has UUID " + uuid + " (visible: " +
                               (seen.empty() ? "none" : seen) +
                               "); the sidecar must see the engine's GPUs");
}

// ---------------------------------------------------------------- IPC mappings

struct ipc_mapping {
  void* ptr = nullptr;
  int refs = 0;
};
std::mutex g_ipc_mu;
std::map<std::string, ipc_mapping> g_ipc;  // key: device ordinal + ':' + handle bytes

std::string ipc_key(int device, const std::string& handle) {
  return std::to_string(device) + ':' + handle;
}

expected<uint8_t*> ipc_acquire(int device, const std::string& handle) {
  std::lock_guard<std::mutex> lk(g_ipc_mu);
  ipc_mapping& m = g_ipc[ipc_key(device, handle)];
  if (m.refs == 0) {
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof h);
    void* p = nullptr;
    const cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      g_ipc.erase(ipc_key(device, handle));
      return cuda_err(e, "cudaIpcOpenMemHandle (is the engine alive and on this host, and "
                         "is its KV cache cudaMalloc-backed, not expandable segments/VMM?)");
    }
    m.ptr = p;
  }
  ++m.refs;
  return static_cast<uint8_t*>(m.ptr);
}

void ipc_release(int device, const std::string& handle) {
  std::lock_guard<std::mutex> lk(g_ipc_mu);
  auto it = g_ipc.find(ipc_key(device, handle));
  if (it == g_ipc.end()) return;
  if (--it->second.refs == 0) {
    cudaIpcCloseMemHandle(it->second.ptr);
    g_ipc.erase(it);
  }
}

// ---------------------------------------------------------------- events

/// Our exported event plus the imported engine event it was ordered after.
struct event_pair {
  int device = 0;
  cudaEvent_t ours = nullptr;
  cudaEvent_t engine = nullptr;
  std::string handle;  ///< ours, exported

  event_pair() = default;
  event_pair(const event_pair&) = delete;
  event_pair& operator=(const event_pair&) = delete;
  ~event_pair() {
    if (ours == nullptr && engine == nullptr) return;
    cudaSetDevice(device);
    drop_engine();
    if (ours != nullptr) cudaEventDestroy(ours);
  }
  void drop_engine() {
    // Safe once the wait is enqueued: CUDA releases an event's resources
    // after the work that references it completes.
    if (engine != nullptr) cudaEventDestroy(engine);
    engine = nullptr;
  }
};

class cuda_completion final : public copy_completion {
public:
  explicit cuda_completion(std::shared_ptr<event_pair> ev) : ev_(std::move(ev)) {
    event_handle_ = ev_->handle;
  }
  state poll() override { return check(cudaEventQuery(ev_->ours), "cudaEventQuery"); }
  state wait() override { return check(cudaEventSynchronize(ev_->ours), "cudaEventSynchronize"); }
  std::string error() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return error_;
  }

private:
  state check(cudaError_t e, const char* what) {
    std::lock_guard<std::mutex> lk(mu_);
    if (state_ != state::pending) return state_;
    if (e == cudaSuccess) {
      state_ = state::done;
    } else if (e != cudaErrorNotReady) {
      state_ = state::failed;
      error_ = cuda_err(e, std::string(what) + " on the copy's event").detail;
    }
    return state_;
  }

  std::shared_ptr<event_pair> ev_;
  mutable std::mutex mu_;
  state state_ = state::pending;
  std::string error_;
};

// ---------------------------------------------------------------- instance

/// Pinned staging + device copy of one request's parameters.
struct param_lease {
  uint8_t* host = nullptr;
  uint8_t* dev = nullptr;
  size_t capacity = 0;
  cudaEvent_t done = nullptr;  ///< recorded after the H2D copy of these params
  bool used = false;
};

class cuda_pools final : public opened_pools {
public:
  explicit cuda_pools(kv_layout l) : opened_pools(std::move(l)) {}
  ~cuda_pools() override { release(); }

  const char* backend_name() const override { return "cuda"; }
  bool is_open() const override { return open_; }

  void release() {
    std::lock_guard<std::mutex> lk(mu);
    if (!open_ && stream == nullptr && handles.empty()) return;
    cudaSetDevice(device);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    ring.clear();
    for (param_lease& l : leases) {
      if (l.done != nullptr) cudaEventDestroy(l.done);
      if (l.dev != nullptr) cudaFree(l.dev);
      if (l.host != nullptr) cudaFreeHost(l.host);
    }
    leases.clear();
    if (d_plane_base != nullptr) cudaFree(d_plane_base);
    if (d_layer_group != nullptr) cudaFree(d_layer_group);
    d_plane_base = nullptr;
    d_layer_group = nullptr;
    for (const std::string& h : handles) ipc_release(device, h);
    handles.clear();
    if (stream != nullptr) cudaStreamDestroy(stream);
    stream = nullptr;
    open_ = false;
  }

  std::mutex mu;
  bool open_ = false;
  int device = 0;
  int sm_count = 1;
  bool host_ptr_usable = false;  ///< registered host memory usable at its host address
  cudaStream_t stream = nullptr;
  std::vector<std::string> handles;  ///< IPC handles this instance holds a reference on
  uint8_t** d_plane_base = nullptr;
  std::vector<uint8_t*> plane_base;  ///< the same table on the host (checksum reads)
  uint32_t* d_layer_group = nullptr;
  std::vector<param_lease> leases;
  std::deque<std::shared_ptr<event_pair>> ring;
};

size_t align16(size_t n) { return (n + 15) & ~size_t{15}; }

// ---------------------------------------------------------------- backend

class cuda_backend final : public transfer_backend {
public:
  const char* name() const override { return "cuda"; }

  expected<std::unique_ptr<opened_pools>> open(const std::vector<tensor_desc>& tensors,
                                               const kv_layout& layout) override {
    if (tensors.empty() || tensors.size() != layout.tensor_end_bytes.size())
      return make_error("open", "layout was detected for " +
                                   std::to_string(layout.tensor_end_bytes.size()) +
                                   " tensors, " + std::to_string(tensors.size()) + " given");
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].kind != tensor_desc::memory_kind::cuda_ipc)
        return make_error("unsupported", "tensor " + std::to_string(i) +
                                            " is host shared memory; the CUDA backend opens "
                                            "CUDA IPC handles only (set gpu.backend=host)");
      if (tensors[i].ipc_mem_handle.size() != ipc_handle_bytes)
        return make_error("open", "tensor " + std::to_string(i) + " has a " +
                                     std::to_string(tensors[i].ipc_mem_handle.size()) +
                                     "-byte IPC handle; cudaIpcMemHandle_t is 64 bytes");
    }
    auto dev = device_by_uuid(tensors.front().device_uuid);
    if (!dev) return dev.error_value();

    auto pools = std::make_unique<cuda_pools>(layout);
    cuda_pools& p = *pools;
    p.device = dev.value();
    p.open_ = true;
    KVS_CUDA_TRY(cudaSetDevice(p.device), "cudaSetDevice");
    KVS_CUDA_TRY(cudaDeviceGetAttribute(&p.sm_count, cudaDevAttrMultiProcessorCount, p.device),
                 "cudaDeviceGetAttribute(MultiProcessorCount)");
    int host_ptr = 0;
    KVS_CUDA_TRY(cudaDeviceGetAttribute(&host_ptr, cudaDevAttrCanUseHostPointerForRegisteredMem,
                                        p.device),
                 "cudaDeviceGetAttribute(CanUseHostPointerForRegisteredMem)");
    p.host_ptr_usable = host_ptr != 0;

    std::vector<uint8_t*> storage(tensors.size(), nullptr);
    for (size_t i = 0; i < tensors.size(); ++i) {
      const tensor_desc& t = tensors[i];
      auto base = ipc_acquire(p.device, t.ipc_mem_handle);
      if (!base) return base.error_value();  // p.release() drops the ones taken so far
      p.handles.push_back(t.ipc_mem_handle);
      storage[i] = base.value() + t.storage_offset_bytes;
    }
    std::vector<uint8_t*> planes;
    planes.reserve(layout.planes.size());
    for (const kv_plane& pl : layout.planes) planes.push_back(storage[pl.tensor] + pl.offset_bytes);
    p.plane_base = planes;

    KVS_CUDA_TRY(cudaStreamCreateWithFlags(&p.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    KVS_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&p.d_plane_base),
                            planes.size() * sizeof(uint8_t*)),
                 "cudaMalloc(plane table)");
    KVS_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&p.d_layer_group),
                            layout.layer_group.size() * sizeof(uint32_t)),
                 "cudaMalloc(layer groups)");
    KVS_CUDA_TRY(cudaMemcpy(p.d_plane_base, planes.data(), planes.size() * sizeof(uint8_t*),
                            cudaMemcpyHostToDevice),
                 "cudaMemcpy(plane table)");
    KVS_CUDA_TRY(cudaMemcpy(p.d_layer_group, layout.layer_group.data(),
                            layout.layer_group.size() * sizeof(uint32_t), cudaMemcpyHostToDevice),
                 "cudaMemcpy(layer groups)");
    return std::unique_ptr<opened_pools>(std::move(pools));
  }

  void close(opened_pools& pools) override {
    if (auto* cp = dynamic_cast<cuda_pools*>(&pools)) cp->release();
  }

  expected<std::unique_ptr<copy_completion>> copy(const copy_request& req) override {
    auto* cp = dynamic_cast<cuda_pools*>(req.pools);
    if (cp == nullptr) return make_error("bad_request", "pools were not opened by the CUDA backend");
    if (!req.engine_event_handle.empty() && req.engine_event_handle.size() != ipc_handle_bytes)
      return make_error("bad_request", "engine event handle of " +
                                          std::to_string(req.engine_event_handle.size()) +
                                          " bytes; cudaIpcEventHandle_t is 64");
    std::lock_guard<std::mutex> lk(cp->mu);
    if (!cp->open_) return make_error("bad_request", "pools are closed");
    auto plan = plan_copy(req, cp->layout());
    if (!plan) return plan.error_value();
    const copy_plan& pl = plan.value();
    KVS_CUDA_TRY(cudaSetDevice(cp->device), "cudaSetDevice");

    // Device addresses of the L1 slots; each whole chunk must be pinned.
    const uint64_t chunk_bytes = cp->layout().chunk_bytes(req.chunk_tokens);
    std::vector<uint8_t*> dev_slots(pl.slots.size(), nullptr);
    for (size_t c = 0; c < pl.slots.size(); ++c) {
      auto d = device_address(pl.slots[c], chunk_bytes, *cp);
      if (!d) return d.error_value();
      dev_slots[c] = d.value();
    }

    // Parameters: [slot pointers][chunk indices][packed block ids].
    const size_t off_idx = align16(dev_slots.size() * sizeof(uint8_t*));
    const size_t off_blk = off_idx + align16(pl.chunk_index.size() * sizeof(uint64_t));
    const size_t bytes = off_blk + align16(pl.blocks.size() * sizeof(int64_t));
    auto lease = acquire_lease(*cp, bytes);
    if (!lease) return lease.error_value();
    param_lease& pb = *lease.value();
    if (!dev_slots.empty())
      std::memcpy(pb.host, dev_slots.data(), dev_slots.size() * sizeof(uint8_t*));
    if (!pl.chunk_index.empty())
      std::memcpy(pb.host + off_idx, pl.chunk_index.data(), pl.chunk_index.size() * sizeof(uint64_t));
    if (!pl.blocks.empty())
      std::memcpy(pb.host + off_blk, pl.blocks.data(), pl.blocks.size() * sizeof(int64_t));

    auto ev = make_event_pair(*cp);
    if (!ev) return ev.error_value();
    std::shared_ptr<event_pair> pair = std::move(ev.value());

    if (!req.engine_event_handle.empty()) {
      cudaIpcEventHandle_t h;
      std::memcpy(&h, req.engine_event_handle.data(), sizeof h);
      KVS_CUDA_TRY(cudaIpcOpenEventHandle(&pair->engine, h),
                   "cudaIpcOpenEventHandle (engine event)");
      KVS_CUDA_TRY(cudaStreamWaitEvent(cp->stream, pair->engine, 0), "cudaStreamWaitEvent");
    }
    KVS_CUDA_TRY(cudaMemcpyAsync(pb.dev, pb.host, bytes, cudaMemcpyHostToDevice, cp->stream),
                 "cudaMemcpyAsync(copy parameters)");
    KVS_CUDA_TRY(cudaEventRecord(pb.done, cp->stream), "cudaEventRecord(parameters)");
    pb.used = true;

    if (pl.total_units > 0) {
      kernel_args a;
      a.g = pl.geo;
      a.total_units = pl.total_units;
      a.skip_blocks = pl.skip_blocks;
      a.to_l1 = pl.to_l1 ? 1 : 0;
      a.slots = reinterpret_cast<uint8_t* const*>(pb.dev);
      a.chunk_index = reinterpret_cast<const uint64_t*>(pb.dev + off_idx);
      a.blocks = reinterpret_cast<const int64_t*>(pb.dev + off_blk);
      a.plane_base = cp->d_plane_base;
      a.layer_group = cp->d_layer_group;
      const uint64_t vecs = pl.geo.page_bytes / 16;
      const unsigned threads =
          static_cast<unsigned>(std::min<uint64_t>(256, std::max<uint64_t>(32, (vecs + 31) / 32 * 32)));
      const unsigned blocks = static_cast<unsigned>(
          std::min<uint64_t>(pl.total_units, static_cast<uint64_t>(cp->sm_count) * 16));
      block_copy_kernel<<<blocks, threads, 0, cp->stream>>>(a);
      KVS_CUDA_TRY(cudaGetLastError(), "block copy kernel launch");
    }

    KVS_CUDA_TRY(cudaEventRecord(pair->ours, cp->stream), "cudaEventRecord(completion)");
    cudaIpcEventHandle_t out;
    KVS_CUDA_TRY(cudaIpcGetEventHandle(&out, pair->ours), "cudaIpcGetEventHandle");
    pair->handle.assign(reinterpret_cast<const char*>(&out), sizeof out);
    cp->ring.push_back(pair);
    return std::unique_ptr<copy_completion>(std::make_unique<cuda_completion>(std::move(pair)));
  }

  status read_planes(opened_pools& pools, const std::vector<plane_read>& runs,
                     uint8_t* out) override {
    auto* cp = dynamic_cast<cuda_pools*>(&pools);
    if (cp == nullptr) return make_error("bad_request", "pools were not opened by the CUDA backend");
    std::lock_guard<std::mutex> lk(cp->mu);
    if (!cp->open_) return make_error("bad_request", "pools are closed");
    for (const plane_read& r : runs)
      if (r.plane >= cp->plane_base.size())
        return make_error("bad_request", "plane " + std::to_string(r.plane) + " of " +
                                            std::to_string(cp->plane_base.size()));
    KVS_CUDA_TRY(cudaSetDevice(cp->device), "cudaSetDevice");
    // On the instance's stream: after the copies already submitted, so a
    // checksum taken after a STORE's or RETRIEVE's answer sees its bytes.
    for (const plane_read& r : runs) {
      KVS_CUDA_TRY(cudaMemcpyAsync(out, cp->plane_base[r.plane] + r.offset, r.bytes,
                                   cudaMemcpyDeviceToHost, cp->stream),
                   "cudaMemcpyAsync(checksum read)");
      out += r.bytes;
    }
    KVS_CUDA_TRY(cudaStreamSynchronize(cp->stream), "cudaStreamSynchronize(checksum read)");
    return {};
  }

  status pin_host_memory(void* p, size_t n) override {
    if (p == nullptr || n == 0) return make_error("bad_request", "nothing to pin");
    std::lock_guard<std::mutex> lk(mu_);
    const auto* b = static_cast<uint8_t*>(p);
    for (const region& r : regions_)
      if (b < r.host + r.bytes && r.host < b + n)
        return make_error("bad_request", "memory overlaps a region already pinned");
    KVS_CUDA_TRY(cudaHostRegister(p, n, cudaHostRegisterPortable | cudaHostRegisterMapped),
                 "cudaHostRegister(" + std::to_string(n) + " bytes of L1)");
    region r;
    r.host = static_cast<uint8_t*>(p);
    r.bytes = n;
    regions_.push_back(r);
    return {};
  }

  void unpin_host_memory(void* p) override {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = regions_.begin(); it != regions_.end(); ++it)
      if (it->host == p) {
        cudaHostUnregister(p);
        regions_.erase(it);
        return;
      }
  }

private:
  struct region {
    uint8_t* host = nullptr;
    size_t bytes = 0;
    std::map<int, uint8_t*> dev;  ///< device base per device, when not the host address
  };

  expected<uint8_t*> device_address(uint8_t* p, uint64_t n, const cuda_pools& cp) {
    std::lock_guard<std::mutex> lk(mu_);
    for (region& r : regions_) {
      if (p < r.host || p >= r.host + r.bytes) continue;
      if (n > static_cast<uint64_t>(r.host + r.bytes - p))
        return make_error("bad_request", "an L1 slot runs past the end of its pinned region");
      if (cp.host_ptr_usable) return p;
      auto it = r.dev.find(cp.device);
      if (it == r.dev.end()) {
        void* d = nullptr;
        KVS_CUDA_TRY(cudaHostGetDevicePointer(&d, r.host, 0), "cudaHostGetDevicePointer");
        it = r.dev.emplace(cp.device, static_cast<uint8_t*>(d)).first;
      }
      return it->second + (p - r.host);
    }
    return make_error("bad_request",
                      "an L1 slot is not inside memory registered with pin_host_memory");
  }

  // Caller holds cp.mu.
  expected<param_lease*> acquire_lease(cuda_pools& cp, size_t bytes) {
    param_lease* best = nullptr;
    for (param_lease& l : cp.leases) {
      if (l.capacity < bytes) continue;
      if (l.used) {
        const cudaError_t e = cudaEventQuery(l.done);
        if (e == cudaErrorNotReady) continue;
        if (e != cudaSuccess) return cuda_err(e, "cudaEventQuery(parameters)");
      }
      if (best == nullptr || l.capacity < best->capacity) best = &l;
    }
    if (best != nullptr) return best;
    param_lease l;
    l.capacity = std::max<size_t>(align16(bytes), 64 * 1024);
    KVS_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&l.host), l.capacity, cudaHostAllocDefault),
                 "cudaHostAlloc(copy parameters)");
    cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&l.dev), l.capacity);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&l.done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      if (l.dev != nullptr) cudaFree(l.dev);
      cudaFreeHost(l.host);
      return cuda_err(e, "allocating copy parameters");
    }
    cp.leases.push_back(l);
    return &cp.leases.back();
  }

  // Caller holds cp.mu. Recycles the oldest ring entry once the ring is
  // full and nobody else holds it; otherwise creates a new event.
  expected<std::shared_ptr<event_pair>> make_event_pair(cuda_pools& cp) {
    while (cp.ring.size() >= event_ring_size) {
      std::shared_ptr<event_pair> old = std::move(cp.ring.front());
      cp.ring.pop_front();
      if (old.use_count() == 1 && cudaEventQuery(old->ours) == cudaSuccess) {
        old->drop_engine();
        old->handle.clear();
        return old;
      }
      // Still referenced or running: let it go from the ring; the last
      // shared_ptr (a completion) destroys it.
    }
    auto pair = std::make_shared<event_pair>();
    pair->device = cp.device;
    KVS_CUDA_TRY(cudaEventCreateWithFlags(&pair->ours, cudaEventInterprocess | cudaEventDisableTiming),
                 "cudaEventCreate(interprocess)");
    return pair;
  }

  std::mutex mu_;
  std::vector<region> regions_;
};

} // namespace

expected<std::string> cuda_device_present() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess)
    return make_error("no_cuda", std::string("no usable CUDA device: ") + cudaGetErrorName(e) + " (" +
                                     cudaGetErrorString(e) + ")");
  if (n == 0)
    return make_error("no_cuda", "no CUDA device visible");
  std::string s = std::to_string(n) + " CUDA device(s):";
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    device_uuid_bytes u{};
    std::memcpy(u.data(), prop.uuid.bytes, u.size());
    s += " [" + std::to_string(i) + "] " + prop.name + " GPU-" + format_device_uuid(u);
  }
  return s;
}

expected<std::unique_ptr<transfer_backend>> make_cuda_backend() {
  auto present = cuda_device_present();
  if (!present) return present.error_value();
  return std::unique_ptr<transfer_backend>(std::make_unique<cuda_backend>());
}

} // namespace kvs
