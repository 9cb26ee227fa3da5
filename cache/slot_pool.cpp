#include "cache/slot_pool.hpp"
#include "core/populate.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

#include <sys/mman.h>
#include <unistd.h>

namespace kvs {
namespace {

constexpr size_t k_huge_page = size_t{2} << 20;
constexpr size_t k_max_slots = (size_t{1} << 31) - 2;

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

bool is_pow2(size_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Faults every page in now. MADV_POPULATE_WRITE (Linux 5.14) does it in the
// kernel and reports a shortage as an error; kernels without it (EINVAL) get
// one write per page. Returns 0 or the errno.
int populate_region(void* addr, size_t len, size_t page) {
  if (const int e = populate_write(addr, len); e != EINVAL) return e;
  auto* p = static_cast<volatile unsigned char*>(addr);
  for (size_t off = 0; off < len; off += page) p[off] = 0;
  return 0;
}

} // namespace

expected<std::unique_ptr<slot_pool>> slot_pool::create(const pool_options& opts) {
  auto fail = [](std::string why) { return make_error("mmap", std::move(why)); };
  if (!is_pow2(opts.slot_align))
    return make_error("bad_option", "slot_align " + std::to_string(opts.slot_align) +
                                        " is not a power of two");
  std::unique_ptr<slot_pool> p(new slot_pool());
  p->capacity_ = opts.capacity_bytes;
  p->align_ = opts.slot_align;
  if (opts.capacity_bytes == 0) return p;  // a pool with no slots is valid


  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t region_align = opts.hugepages ? k_huge_page : page;
  const size_t usable = round_up(opts.capacity_bytes, region_align);
  // Over-map by one alignment unit so the start can be moved to a 2 MiB
  // boundary; the slack at both ends is unmapped again below.
  const size_t len = opts.hugepages ? usable + region_align : usable;
  int flags = MAP_PRIVATE | MAP_ANONYMOUS;
  // With huge pages the region is populated only after the advice below,
  // or its pages would all be faulted in as small pages.
  if (!opts.populate) flags |= MAP_NORESERVE;
  else if (!opts.hugepages) flags |= MAP_POPULATE;
  void* addr = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (addr == MAP_FAILED)
    return fail("mmap of " + std::to_string(len) +
                " bytes failed: " + std::strerror(errno));

  auto start = reinterpret_cast<uintptr_t>(addr);
  uintptr_t aligned = round_up(start, region_align);
  if (opts.hugepages) {
    const size_t head = aligned - start;
    const size_t tail = len - head - usable;
    if (head) ::munmap(addr, head);
    if (tail) ::munmap(reinterpret_cast<void*>(aligned + usable), tail);
    p->base_ = reinterpret_cast<std::byte*>(aligned);
    p->map_len_ = usable;
#ifdef MADV_HUGEPAGE
    // Advice only: failure (THP disabled) costs speed, not correctness.
    (void)::madvise(p->base_, usable, MADV_HUGEPAGE);
#endif
    if (opts.populate) {
      if (int err = populate_region(p->base_, usable, page))
        return fail("populating " + std::to_string(usable) +
                    " bytes failed: " + std::strerror(err));  // p unmaps
    }
  } else {
    p->base_ = static_cast<std::byte*>(addr);  // page-aligned already
    p->map_len_ = len;
  }
  // Slots are carved from the capacity asked for, not the rounded mapping,
  // so fill fractions mean what the operator configured.
  const size_t usable_slots = opts.capacity_bytes / opts.slot_align * opts.slot_align;
  if (usable_slots) p->add_run(0, usable_slots);
  return p;
}

status slot_pool::prefault(size_t offset, size_t len) const {
  if (offset >= map_len_ || len == 0)
    return {};
  len = std::min(len, map_len_ - offset);
  // One huge page per call: the kernel holds the process's mmap lock for
  // the whole call, and a low-priority caller preempted inside a long one
  // stalls every thread that maps memory meanwhile (measured: a 64 MiB call
  // at nice 19 on a loaded machine made lookups 0.9 -> 120 ms).
  for (size_t done = 0; done < len; done += k_huge_page) {
    const size_t piece = std::min(k_huge_page, len - done);
    const int e = populate_write(base_ + offset + done, piece);
    if (e == EINVAL)
      return make_error("unsupported", "MADV_POPULATE_WRITE needs Linux 5.14 or later");
    if (e != 0)
      return make_error("mmap", "MADV_POPULATE_WRITE of " + std::to_string(piece) +
                                  " bytes at " + std::to_string(offset + done) + ": " +
                                  std::strerror(e));
  }
  return {};
}

slot_pool::~slot_pool() {
  if (base_) ::munmap(base_, map_len_);
}

size_t slot_pool::stride_for(size_t bytes) const {
  const size_t stride = round_up(bytes, align_);
  return stride < bytes ? 0 : stride;
}

void slot_pool::add_run(size_t offset, size_t len) {
  runs_.emplace(offset, len);
  by_len_.emplace(len, offset);
}

void slot_pool::drop_run(std::map<size_t, size_t>::iterator it) {
  by_len_.erase({it->second, it->first});
  runs_.erase(it);
}

slot_id slot_pool::alloc(size_t bytes) {
  const size_t stride = stride_for(bytes);
  if (bytes == 0 || stride == 0) return invalid_slot;
  auto fit = by_len_.lower_bound({stride, 0});
  if (fit == by_len_.end()) return invalid_slot;
  // The index packs entry numbers (one per slot in use) into 31 bits.
  if (free_ids_.empty() && slots_.size() >= k_max_slots) return invalid_slot;
  const size_t off = fit->second, len = fit->first;
  drop_run(runs_.find(off));
  if (len > stride) add_run(off + stride, len - stride);
  slot_id s;
  if (!free_ids_.empty()) {
    s = free_ids_.back();
    free_ids_.pop_back();
  } else {
    s = static_cast<slot_id>(slots_.size());
    slots_.emplace_back();
  }
  slots_[s] = slot_rec{off, stride, bytes, true};
  if (off + stride > high_water_.load(std::memory_order_relaxed))
    high_water_.store(off + stride, std::memory_order_relaxed);
  ++used_count_;
  bytes_used_ += stride;
  return s;
}

bool slot_pool::free(slot_id s) {
  if (!in_use(s)) return false;
  slot_rec& r = slots_[s];
  size_t off = r.offset, len = r.stride;
  // Merge with the free runs that touch this slot on either side.
  auto next = runs_.lower_bound(off);
  if (next != runs_.end() && next->first == off + len) {
    len += next->second;
    auto victim = next++;
    drop_run(victim);
  }
  if (next != runs_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      drop_run(prev);
    }
  }
  add_run(off, len);
  --used_count_;
  bytes_used_ -= r.stride;
  r = slot_rec{};
  free_ids_.push_back(s);
  return true;
}

size_t slot_pool::run_if_freed(slot_id s) const {
  if (!in_use(s)) return 0;
  const slot_rec& r = slots_[s];
  size_t len = r.stride;
  auto next = runs_.lower_bound(r.offset);
  if (next != runs_.end() && next->first == r.offset + r.stride) len += next->second;
  if (next != runs_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == r.offset) len += prev->second;
  }
  return len;
}

size_t slot_pool::largest_free_run() const {
  return by_len_.empty() ? 0 : by_len_.rbegin()->first;
}

} // namespace kvs
