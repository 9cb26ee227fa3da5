// Host backend: the engine's KV pools are POSIX shared-memory objects
// (engines without a GPU, and the integration tests). Each object is mapped
// read/write once per instance; a copy is one memcpy per page (per head_dim
// row for head-major pages), done before
// copy() returns, so its completion is always ready. The engine may shrink an
// object after it was mapped: copies run under a SIGBUS guard
// (gpu/fault_guard.hpp), so that fails the one copy, not the process.
// With host_backend_options::prefault a thread per opened instance faults
// the mappings in after open() and is stopped and joined before they are
// unmapped (release()).
#include "core/admit_budget.hpp"
#include "core/populate.hpp"
#include "core/thread_nice.hpp"
#include "gpu/copy_crew.hpp"
#include "gpu/copy_plan.hpp"
#include "gpu/fault_guard.hpp"
#include "gpu/transfer_backend.hpp"
#include "log/log.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

namespace kvs {

namespace {

class host_pools final : public opened_pools {
public:
  struct mapping {
    std::string name;
    uint8_t* base = nullptr;
    size_t size = 0;
    bool fully_backed = false; ///< every byte allocated (no holes) when mapped
  };

  explicit host_pools(kv_layout l) : opened_pools(std::move(l)) {}
  ~host_pools() override { release(); }

  const char* backend_name() const override { return "host"; }
  bool is_open() const override { return open_; }
  uint64_t prefaulted_bytes() const override { return prefaulted_.load(); }
  bool prefault_finished() const override { return prefault_done_.load(); }

  /// Starts the background prefault of every fully backed mapping when
  /// `budget` admits their bytes; logs why not otherwise.
  void start_prefault(std::shared_ptr<admit_budget> budget) {
    int64_t bytes = 0;
    for (const mapping& m : maps)
      if (m.fully_backed) bytes += static_cast<int64_t>(m.size);
    if (!budget->admit(bytes)) {
      KVS_INFO(log::label("host_backend", "prefault", 0),
               "'{}' and {} more: not faulted in ({:.1f} MiB would pass the {:.1f} GiB other "
               "registered instances hold); copies fault page by page",
               maps.empty() ? std::string() : maps.front().name,
               maps.empty() ? 0 : maps.size() - 1, static_cast<double>(bytes) / (1 << 20),
               static_cast<double>(budget->limit()) / (1 << 30));
      return;
    }
    budget_ = std::move(budget);
    budget_bytes_ = bytes;
    prefault_done_ = false;
    prefaulter_ = std::thread([this] { prefault(); });
  }

  void release() {
    // The prefault thread reads the mappings: stopped (within one step)
    // and joined before anything is unmapped.
    stop_prefault_ = true;
    if (prefaulter_.joinable()) prefaulter_.join();
    if (budget_) {
      budget_->release(budget_bytes_);
      budget_.reset();
    }
    for (mapping& m : maps)
      if (m.base != nullptr) munmap(m.base, m.size);
    maps.clear();
    ranges.clear();
    plane_base.clear();
    open_ = false;
  }

  std::vector<mapping> maps;
  std::vector<guarded_range> ranges;  ///< maps[i]'s bytes, for the copy's SIGBUS guard
  std::vector<uint8_t*> plane_base;  ///< [kv * num_layers + layer]: block 0 of the plane
  bool open_ = true;

private:
  /// ~10-30 ms of kernel work: release() waits at most that long.
  static constexpr size_t prefault_step = size_t{64} << 20;

  void prefault() {
    // Background work yields to the copies and everything else.
    (void)lower_this_thread_priority(background_thread_nice);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string who = log::label("host_backend", "prefault", 0);
    size_t sparse = 0;
    std::string stopped;
    for (const mapping& m : maps) {
      if (!stopped.empty())
        break;
      if (!m.fully_backed) {
        ++sparse;
        continue;
      }
      for (size_t off = 0; off < m.size && !stop_prefault_;) {
        const size_t len = std::min(prefault_step, m.size - off);
        // A page the object no longer backs (shrunk) fails with EFAULT
        // here, never SIGBUS.
        if (const int e = populate_write(m.base + off, len); e != 0) {
          stopped = e == EINVAL ? std::string("MADV_POPULATE_WRITE needs Linux 5.14 or later")
                                : "madvise(MADV_POPULATE_WRITE) of '" + m.name + "' at byte " +
                                    std::to_string(off) + ": " + std::strerror(e);
          break;
        }
        off += len;
        prefaulted_ += len;
      }
    }
    const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!stop_prefault_) {
      const std::string first = maps.empty() ? std::string() : maps.front().name;
      if (!stopped.empty())
        KVS_INFO(who, "'{}' and {} more: faulted in {:.1f} MiB, then stopped: {} (copies into "
                      "the rest fault page by page)", first, maps.size() - 1,
                 static_cast<double>(prefaulted_.load()) / (1 << 20), stopped);
      else
        KVS_INFO(who, "'{}' and {} more: {:.1f} MiB faulted in in {:.2f} s (gpu.host_prefault){}",
                 first, maps.size() - 1, static_cast<double>(prefaulted_.load()) / (1 << 20), s,
                 sparse ? ", " + std::to_string(sparse) + " object(s) with holes skipped" : "");
    }
    prefault_done_ = true;
  }

  std::thread prefaulter_;
  std::shared_ptr<admit_budget> budget_; ///< the backend's, while these pools count in it
  int64_t budget_bytes_ = 0;
  std::atomic<bool> stop_prefault_{false};
  std::atomic<bool> prefault_done_{true};
  std::atomic<uint64_t> prefaulted_{0};
};

class host_completion final : public copy_completion {
public:
  state poll() override { return state::done; }
  state wait() override { return state::done; }
  std::string error() const override { return {}; }
};

std::string errno_text(int e) { return std::string(std::strerror(e)); }

expected<host_pools::mapping> map_shm(const std::string& name) {
  if (name.empty() || name.size() > 255)
    return make_error("open", "bad shared-memory name '" + name + "'");
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return make_error("open", "shm_open('" + name + "'): " + errno_text(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    close(fd);
    return make_error("open", "fstat('" + name + "'): " + errno_text(e));
  }
  if (st.st_size <= 0) {
    close(fd);
    return make_error("open", "shared-memory object '" + name + "' is empty");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  close(fd);  // the mapping keeps the object alive
  if (p == MAP_FAILED) return make_error("open", "mmap('" + name + "'): " + errno_text(e));
  host_pools::mapping m;
  m.name = name;
  m.base = static_cast<uint8_t*>(p);
  m.size = size;
  // st_blocks counts 512-byte units actually allocated in tmpfs.
  m.fully_backed = static_cast<uint64_t>(st.st_blocks) * 512 >= size;
  return m;
}

struct copy_job {
  const copy_plan* plan;
  const host_pools* pools;
};

/// Below this many bytes a copy is not split: waking the crew (~tens of
/// microseconds) would cost more than the second core saves.
constexpr uint64_t split_copy_bytes = uint64_t{8} << 20;

/// Part `part` of `parts` of the page copies of one request: a contiguous
/// range of units, so the parts write disjoint bytes. Runs under
/// run_guarded: it may be abandoned at any memcpy, so it owns nothing and
/// allocates nothing.
void copy_pages(void* arg, size_t part, size_t parts) {
  const auto* job = static_cast<const copy_job*>(arg);
  const copy_plan& p = *job->plan;
  const host_pools& hp = *job->pools;
  const uint64_t first = p.total_units * part / parts;
  const uint64_t last = p.total_units * (part + 1) / parts;
  for (uint64_t u = first; u < last; ++u) {
    const block_copy::unit x = block_copy::unit_at(p.geo, u);
    const uint64_t chunk_index = p.chunk_index[x.chunk];
    if (!p.to_l1 && page_skipped(p.geo, p.skip_blocks, chunk_index, x.page)) continue;
    const uint32_t group = hp.layout().layer_group[x.layer];
    const int64_t block = p.blocks[block_copy::packed_block_index(p.geo, x.chunk, group, x.page)];
    uint8_t* engine = hp.plane_base[block_copy::plane_index(p.geo, x.kv, x.layer)] +
                      block_copy::engine_offset(p.geo, static_cast<uint64_t>(block), 0);
    uint8_t* l1 = p.slots[x.chunk] + block_copy::l1_page_offset(p.geo, x);
    const uint64_t runs = block_copy::runs_per_unit(p.geo);
    const uint64_t n = block_copy::run_bytes(p.geo);
    for (uint64_t r = 0; r < runs; ++r) {
      uint8_t* e = engine + block_copy::engine_run_offset(p.geo, r);
      uint8_t* c = l1 + block_copy::l1_run_offset(p.geo, r);
      if (p.to_l1)
        std::memcpy(c, e, n);
      else
        std::memcpy(e, c, n);
    }
  }
}

struct read_job {
  const std::vector<plane_read>* runs;
  const host_pools* pools;
  uint8_t* out;
};

/// POST /cache/checksums' reads; under run_guarded like copy_pages.
void read_runs(void* arg) {
  const auto* job = static_cast<const read_job*>(arg);
  uint8_t* out = job->out;
  for (const plane_read& r : *job->runs) {
    std::memcpy(out, job->pools->plane_base[r.plane] + r.offset, r.bytes);
    out += r.bytes;
  }
}

class host_backend final : public transfer_backend {
public:
  explicit host_backend(host_backend_options opts)
    : opts_(opts), prefault_budget_(std::make_shared<admit_budget>(opts.prefault_max_bytes)),
      crew_(opts.copy_threads) {}
  const char* name() const override { return "host"; }

  expected<std::unique_ptr<opened_pools>> open(const std::vector<tensor_desc>& tensors,
                                               const kv_layout& layout) override {
    if (tensors.size() != layout.tensor_end_bytes.size())
      return make_error("open", "layout was detected for " +
                                   std::to_string(layout.tensor_end_bytes.size()) +
                                   " tensors, " + std::to_string(tensors.size()) + " given");
    auto pools = std::make_unique<host_pools>(layout);
    std::vector<uint8_t*> storage(tensors.size(), nullptr);
    std::vector<size_t> room(tensors.size(), 0);  // mapped bytes from the storage start
    for (size_t i = 0; i < tensors.size(); ++i) {
      const tensor_desc& t = tensors[i];
      if (t.kind != tensor_desc::memory_kind::host_shm)
        return make_error("unsupported", "tensor " + std::to_string(i) +
                                            " is a CUDA IPC tensor; the host backend maps "
                                            "shared memory only (set gpu.backend=cuda)");
      size_t m = 0;
      while (m < pools->maps.size() && pools->maps[m].name != t.shm_name) ++m;
      if (m == pools->maps.size()) {
        auto mapped = map_shm(t.shm_name);
        if (!mapped) return mapped.error_value();  // pools' destructor unmaps the others
        pools->maps.push_back(std::move(mapped.value()));
      }
      const host_pools::mapping& mp = pools->maps[m];
      // The engine's own size for the segment: an object already smaller
      // than that was shrunk (or described wrongly); say so rather than map
      // a pool that faults on first use.
      if (t.storage_size_bytes > 0 && (t.shm_offset_bytes > mp.size ||
                                       t.storage_size_bytes > mp.size - t.shm_offset_bytes))
        return make_error("open", "tensor " + std::to_string(i) + ": '" + t.shm_name + "' has " +
                                     std::to_string(mp.size) + " bytes, but the descriptor "
                                     "declares " + std::to_string(t.storage_size_bytes) +
                                     " from offset " + std::to_string(t.shm_offset_bytes));
      if (t.shm_offset_bytes > mp.size ||
          layout.tensor_end_bytes[i] > mp.size - t.shm_offset_bytes)
        return make_error("open", "tensor " + std::to_string(i) + " needs bytes up to " +
                                     std::to_string(t.shm_offset_bytes + layout.tensor_end_bytes[i]) +
                                     " of '" + t.shm_name + "', which has " +
                                     std::to_string(mp.size));
      storage[i] = mp.base + t.shm_offset_bytes;
      room[i] = mp.size - t.shm_offset_bytes;
    }
    // Every plane's last page must lie inside its mapping (the layout
    // derives planes from the views, so this is belt and braces).
    const uint64_t plane_span =
        (layout.num_blocks - 1) * layout.block_stride_bytes + layout.page_span_bytes;
    for (const kv_plane& p : layout.planes) {
      if (p.tensor >= storage.size() || p.offset_bytes > room[p.tensor] ||
          plane_span > room[p.tensor] - p.offset_bytes)
        return make_error("open", "a K/V plane of tensor " + std::to_string(p.tensor) +
                                     " does not fit in its shared-memory object");
      pools->plane_base.push_back(storage[p.tensor] + p.offset_bytes);
    }
    for (const host_pools::mapping& m : pools->maps)
      pools->ranges.push_back(guarded_range{m.base, m.size});
    if (opts_.prefault) pools->start_prefault(prefault_budget_);
    return std::unique_ptr<opened_pools>(std::move(pools));
  }

  void close(opened_pools& pools) override {
    if (auto* hp = dynamic_cast<host_pools*>(&pools)) hp->release();
  }

  expected<std::unique_ptr<copy_completion>> copy(const copy_request& req) override {
    auto* hp = dynamic_cast<host_pools*>(req.pools);
    if (hp == nullptr) return make_error("bad_request", "pools were not opened by the host backend");
    if (!hp->is_open()) return make_error("bad_request", "pools are closed");
    auto plan = plan_copy(req, hp->layout());
    if (!plan) return plan.error_value();
    copy_job job{&plan.value(), hp};
    const copy_plan& p = plan.value();
    const uint64_t bytes =
        p.total_units * block_copy::runs_per_unit(p.geo) * block_copy::run_bytes(p.geo);
    const guard_result g = crew_.run(hp->ranges.data(), hp->ranges.size(), &copy_pages, &job,
                                     bytes >= split_copy_bytes ? crew_.threads() : 1);
    if (g.faulted) {
      const host_pools::mapping& m = hp->maps[g.range];
      return make_error("shm_truncated",
                        "shared-memory object '" + m.name + "' no longer backs byte " +
                           std::to_string(g.offset) + " of the " + std::to_string(m.size) +
                           " registered (it was truncated after registration); the copy was "
                           "abandoned part-way");
    }
    return std::unique_ptr<copy_completion>(std::make_unique<host_completion>());
  }

  status read_planes(opened_pools& pools, const std::vector<plane_read>& runs,
                     uint8_t* out) override {
    auto* hp = dynamic_cast<host_pools*>(&pools);
    if (hp == nullptr) return make_error("bad_request", "pools were not opened by the host backend");
    if (!hp->is_open()) return make_error("bad_request", "pools are closed");
    for (const plane_read& r : runs)
      if (r.plane >= hp->plane_base.size())
        return make_error("bad_request", "plane " + std::to_string(r.plane) + " of " +
                                            std::to_string(hp->plane_base.size()));
    read_job job{&runs, hp, out};
    const guard_result g = run_guarded(hp->ranges.data(), hp->ranges.size(), &read_runs, &job);
    if (g.faulted)
      return make_error("shm_truncated", "shared-memory object '" + hp->maps[g.range].name +
                                            "' no longer backs byte " + std::to_string(g.offset) +
                                            " (it was truncated after registration)");
    return {};
  }

  status pin_host_memory(void*, size_t) override { return {}; }
  void unpin_host_memory(void*) override {}

private:
  host_backend_options opts_;
  /// Shared with the pools it admitted: they may outlive the backend.
  std::shared_ptr<admit_budget> prefault_budget_;
  copy_crew crew_; ///< splits a large copy over opts_.copy_threads threads
};

} // namespace

std::unique_ptr<transfer_backend> make_host_backend(host_backend_options opts) {
  return std::make_unique<host_backend>(opts);
}

} // namespace kvs
