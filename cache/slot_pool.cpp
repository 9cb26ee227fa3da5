#include "cache/slot_pool.hpp"

#include <cerrno>
#include <cstring>

#include <sys/mman.h>
#include <unistd.h>

namespace kvs {
namespace {

constexpr size_t k_huge_page = size_t{2} << 20;

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

bool is_pow2(size_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Faults every page in now. MADV_POPULATE_WRITE (Linux 5.14) does it in the
// kernel and reports a shortage as an error; kernels without it (EINVAL) get
// one write per page. Returns 0 or the errno.
int populate_region(void* addr, size_t len, size_t page) {
#ifdef MADV_POPULATE_WRITE
  if (::madvise(addr, len, MADV_POPULATE_WRITE) == 0) return 0;
  if (errno != EINVAL) return errno;
#endif
  auto* p = static_cast<volatile unsigned char*>(addr);
  for (size_t off = 0; off < len; off += page) p[off] = 0;
  return 0;
}

} // namespace

std::unique_ptr<slot_pool> slot_pool::create(const pool_options& opts,
                                             std::string* error) {
  auto fail = [&](std::string why) -> std::unique_ptr<slot_pool> {
    if (error) *error = std::move(why);
    return nullptr;
  };
  if (!is_pow2(opts.slot_align))
    return fail("slot_align " + std::to_string(opts.slot_align) +
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
  return p;
}

slot_pool::~slot_pool() {
  if (base_) ::munmap(base_, map_len_);
}

bool slot_pool::configure(size_t slot_bytes, std::string* error) {
  auto fail = [&](std::string why) {
    if (error) *error = std::move(why);
    return false;
  };
  if (slot_bytes == 0) return fail("slot size 0");
  if (slots_used() != 0)
    return fail("slot size can change only while the pool is empty (" +
                std::to_string(slots_used()) + " slots in use)");
  const size_t stride = round_up(slot_bytes, align_);
  if (stride < slot_bytes || stride > capacity_)
    return fail("slot of " + std::to_string(slot_bytes) +
                " bytes does not fit in a pool of " +
                std::to_string(capacity_) + " bytes");
  const size_t count = capacity_ / stride;
  // The index packs slot-bounded entry numbers into 31 bits.
  if (count >= (size_t{1} << 31) - 1)
    return fail("too many slots (" + std::to_string(count) + ")");
  slot_bytes_ = slot_bytes;
  stride_ = stride;
  used_.assign(count, 0);
  free_.resize(count);
  // Top of the stack is slot 0: allocation walks the region from its start.
  for (size_t i = 0; i < count; ++i)
    free_[i] = static_cast<slot_id>(count - 1 - i);
  return true;
}

slot_id slot_pool::alloc() {
  if (free_.empty()) return invalid_slot;
  slot_id s = free_.back();
  free_.pop_back();
  used_[s] = 1;
  return s;
}

bool slot_pool::free(slot_id s) {
  if (s >= used_.size() || !used_[s]) return false;
  used_[s] = 0;
  free_.push_back(s);
  return true;
}

} // namespace kvs
