#include "cache/slot_pool.hpp"
#include "core/populate.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
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
  p->by_len_.resize(1);
  p->arenas_.resize(1);
  p->arenas_[0].open = true;
  p->hugepages_ = opts.hugepages;
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
  p->slot_end_ = usable_slots;
  // Extents are remapped one by one: whole pages (huge pages when advised),
  // whole slot_align units.
  const size_t unit = std::max(region_align, opts.slot_align);
  p->extent_ = std::min(round_up(std::max<size_t>(opts.extent_bytes, 1), unit),
                        round_up(std::max<size_t>(usable_slots, 1), unit));
  if (usable_slots) p->add_run(0, usable_slots);
  return p;
}

status slot_pool::prefault(size_t offset, size_t len) const {
  return populate(offset, len, true);
}

status slot_pool::populate(size_t offset, size_t len, bool skip_arenas) const {
  if (offset >= map_len_ || len == 0)
    return {};
  len = std::min(len, map_len_ - offset);
  // One huge page per call: the kernel holds the process's mmap lock for
  // the whole call, and a low-priority caller preempted inside a long one
  // stalls every thread that maps memory meanwhile (measured: a 64 MiB call
  // at nice 19 on a loaded machine made lookups 0.9 -> 120 ms).
  // prefault() leaves extents mapped from an arena's object alone: they
  // were reserved when claimed (posix_fallocate) and may be shrunk by
  // their client.
  const std::atomic<int>* arena_fds =
    skip_arenas ? extent_fd_view_.load(std::memory_order_acquire) : nullptr;
  for (size_t done = 0; done < len; done += k_huge_page) {
    const size_t piece = std::min(k_huge_page, len - done);
    if (arena_fds != nullptr && extent_ != 0 && (offset + done) / extent_ < extents_count_ &&
        arena_fds[(offset + done) / extent_].load(std::memory_order_acquire) >= 0)
      continue;
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
  if (heal_added_) arena_heal_remove(&heal_);
  for (auto& a : arenas_) {
    if (a.open && a.fd >= 0) ::shm_unlink(a.name.c_str());
    if (a.fd >= 0) ::close(a.fd);
  }
  if (base_) ::munmap(base_, map_len_);
}

size_t slot_pool::stride_for(size_t bytes) const {
  const size_t stride = round_up(bytes, align_);
  return stride < bytes ? 0 : stride;
}

void slot_pool::add_run(size_t offset, size_t len) {
  runs_.emplace(offset, len);
  by_len_[arena_at(offset)].emplace(len, offset);
}

void slot_pool::drop_run(std::map<size_t, size_t>::iterator it) {
  by_len_[arena_at(it->first)].erase({it->second, it->first});
  runs_.erase(it);
}

bool slot_pool::mergeable(size_t a, size_t b) const {
  if (extents_.empty()) return true;
  const arena_id x = arena_at(a);
  if (x != arena_at(b)) return false;
  return x == anonymous_arena || a / extent_ == b / extent_;
}

void slot_pool::insert_free(size_t off, size_t len) {
  auto next = runs_.lower_bound(off);
  if (next != runs_.end() && next->first == off + len && mergeable(off, next->first)) {
    len += next->second;
    auto victim = next++;
    drop_run(victim);
  }
  if (next != runs_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off && mergeable(prev->first, off)) {
      off = prev->first;
      len += prev->second;
      drop_run(prev);
    }
  }
  add_run(off, len);
}

std::pair<size_t, size_t> slot_pool::merged_if_freed(slot_id s) const {
  const slot_rec& r = slots_[s];
  size_t lo = r.offset, hi = r.offset + r.stride;
  auto next = runs_.lower_bound(r.offset);
  if (next != runs_.end() && next->first == hi && mergeable(r.offset, next->first))
    hi += next->second;
  if (next != runs_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == r.offset && mergeable(prev->first, r.offset))
      lo = prev->first;
  }
  return {lo, hi};
}

slot_id slot_pool::alloc(size_t bytes, arena_id a) {
  const size_t stride = stride_for(bytes);
  if (bytes == 0 || stride == 0 || !arena_open(a)) return invalid_slot;
  if (a != anonymous_arena && stride > extent_) return invalid_slot;
  // The index packs entry numbers (one per slot in use) into 31 bits.
  if (free_ids_.empty() && slots_.size() >= k_max_slots) return invalid_slot;
  auto fit = lens(a).lower_bound({stride, 0});
  if (fit == lens(a).end()) {
    const bool more = a == anonymous_arena ? reclaim_for_anonymous(stride)
                                           : claim_extent(a, stride);
    if (!more) return invalid_slot;
    fit = lens(a).lower_bound({stride, 0});
    if (fit == lens(a).end()) return invalid_slot;
  }
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
  if (a != anonymous_arena) ++extents_[off / extent_].slots;
  if (off + stride > high_water_.load(std::memory_order_relaxed))
    high_water_.store(off + stride, std::memory_order_relaxed);
  ++used_count_;
  bytes_used_ += stride;
  return s;
}

bool slot_pool::free(slot_id s) {
  if (!in_use(s)) return false;
  slot_rec& r = slots_[s];
  const size_t off = r.offset;
  const arena_id a = arena_at(off);
  insert_free(off, r.stride);
  --used_count_;
  bytes_used_ -= r.stride;
  r = slot_rec{};
  free_ids_.push_back(s);
  if (a != anonymous_arena) {
    const size_t i = off / extent_;
    // A closed arena's extent goes back to arena 0 as soon as it empties.
    if (--extents_[i].slots == 0 && !arenas_[a].open) (void)move_extent(i, anonymous_arena);
  }
  return true;
}

size_t slot_pool::run_if_freed(slot_id s, arena_id a) const {
  if (!in_use(s)) return 0;
  const arena_id own = arena_of(s);
  const auto [lo, hi] = merged_if_freed(s);
  if (own == a) return hi - lo;
  if (own != anonymous_arena) {
    // Its extent, emptied, is there for the taking.
    const size_t i = slots_[s].offset / extent_;
    return extents_[i].slots == 1 ? extent_len(i) : 0;
  }
  // Arena 0 to another arena: a whole aligned extent inside the merged run.
  const size_t first = round_up(lo, extent_);
  if (first < slot_end_ && first + extent_len(first / extent_) <= hi)
    return extent_len(first / extent_);
  return 0;
}

// --- arenas ----------------------------------------------------------------------

expected<arena_id> slot_pool::open_arena(std::string name, std::optional<uint32_t> owner_uid,
                                         uint64_t extra_bytes) {
  auto sys = [&](const char* what, int e) {
    return make_error("arena", std::string(what) + "('" + name + "'): " + std::strerror(e));
  };
  if (slot_end_ == 0) return make_error("arena", "an L1 of 0 bytes has no room for arenas");
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return sys("shm_open", errno);
  auto fail = [&](const char* what) {
    const int e = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    return sys(what, e);
  };
  if (owner_uid && *owner_uid != ::geteuid() &&
      ::fchown(fd, *owner_uid, static_cast<gid_t>(-1)) != 0)
    return fail("fchown to the client's uid");
  // As large as the mapping, so every slot offset is an offset in it; no
  // page is taken until an extent is claimed.
  const uint64_t size = map_len_ + extra_bytes;
  if (size < map_len_ || size > (uint64_t{1} << 46)) {
    errno = EOVERFLOW;
    return fail("ftruncate");
  }
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) return fail("ftruncate");
  if (extents_.empty()) {
    const size_t n = (slot_end_ + extent_ - 1) / extent_;
    extents_.resize(n);
    extent_fd_.reset(new std::atomic<int>[n]);
    extent_size_.reset(new std::atomic<uint64_t>[n]);
    for (size_t i = 0; i < n; ++i) {
      extent_fd_[i].store(-1, std::memory_order_relaxed);
      extent_size_[i].store(0, std::memory_order_relaxed);
    }
    heal_ = arena_heal_table{reinterpret_cast<uintptr_t>(base_), map_len_, extent_, n,
                             extent_fd_.get(), extent_size_.get()};
    heal_added_ = arena_heal_add(&heal_);
    extents_count_ = n;
    extent_fd_view_.store(extent_fd_.get(), std::memory_order_release);
  }
  arena_id a;
  if (!free_arena_ids_.empty()) {
    a = free_arena_ids_.back();
    free_arena_ids_.pop_back();
  } else {
    a = static_cast<arena_id>(arenas_.size());
    arenas_.emplace_back();
    by_len_.emplace_back();
  }
  arenas_[a] = arena_rec{std::move(name), fd, true, 0, size};
  return a;
}

bool slot_pool::close_arena(arena_id a) {
  if (a == anonymous_arena || !arena_open(a)) return false;
  arena_rec& r = arenas_[a];
  ::shm_unlink(r.name.c_str());
  r.open = false;
  for (size_t i = 0; i < extents_.size(); ++i)
    if (extents_[i].arena == a && extents_[i].slots == 0) (void)move_extent(i, anonymous_arena);
  if (r.extents == 0) {
    ::close(r.fd);
    r = arena_rec{};
    free_arena_ids_.push_back(a);
  }
  return true;
}

bool slot_pool::move_extent(size_t i, arena_id to) {
  const arena_id from = extents_[i].arena;
  const size_t off = i * extent_;
  const size_t len = extent_len(i);
  // The mapping covers whole pages past the last slot_align unit.
  const size_t map_len = std::min(extent_, map_len_ - off);
  void* at = base_ + off;
  // Reserve the new arena's pages before anything moves: when /dev/shm
  // cannot hold them the extent stays where it was, untouched.
  if (to != anonymous_arena) {
    if (const int fe = ::posix_fallocate(arenas_[to].fd, static_cast<off_t>(off),
                                         static_cast<off_t>(map_len));
        fe != 0) {
      arena_error_ = "reserving " + std::to_string(map_len) + " bytes of '" + arenas_[to].name +
                     "' in /dev/shm: " + std::strerror(fe) + " (is /dev/shm large enough?)";
      return false;
    }
  }
  void* got = to == anonymous_arena
                ? ::mmap(at, map_len, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0)
                : ::mmap(at, map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                         arenas_[to].fd, static_cast<off_t>(off));
  if (got == MAP_FAILED) {
    arena_error_ = std::string("remapping an L1 extent: ") + std::strerror(errno);
    if (to != anonymous_arena) // the pages reserved above go back
      (void)::fallocate(arenas_[to].fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                        static_cast<off_t>(off), static_cast<off_t>(map_len));
    return false;
  }
#ifdef MADV_HUGEPAGE
  if (to == anonymous_arena && hugepages_) (void)::madvise(at, map_len, MADV_HUGEPAGE);
#endif
  if (from != anonymous_arena)
    (void)::fallocate(arenas_[from].fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                      static_cast<off_t>(off), static_cast<off_t>(map_len));
  // Take the extent's free space out of the old arena's runs (arena 0's run
  // may be longer than the extent: split it), then give it to the new one.
  auto it = std::prev(runs_.upper_bound(off));
  const size_t r_off = it->first, r_len = it->second;
  drop_run(it);
  if (r_off < off) add_run(r_off, off - r_off);
  if (r_off + r_len > off + len) add_run(off + len, r_off + r_len - (off + len));
  arena_error_.clear();
  extents_[i].arena = to;
  extents_[i].slots = 0;
  extent_size_[i].store(to == anonymous_arena ? 0 : arenas_[to].object_size,
                        std::memory_order_release);
  extent_fd_[i].store(to == anonymous_arena ? -1 : arenas_[to].fd, std::memory_order_release);
  --arenas_[from].extents;
  ++arenas_[to].extents;
  insert_free(off, len);
  if (from != anonymous_arena && !arenas_[from].open && arenas_[from].extents == 0) {
    ::close(arenas_[from].fd);
    arenas_[from] = arena_rec{};
    free_arena_ids_.push_back(from);
  }
  return true;
}

std::optional<size_t> slot_pool::free_extent(size_t min_len) {
  for (auto it = lens(anonymous_arena).lower_bound({min_len, 0});
       it != lens(anonymous_arena).end(); ++it) {
    const size_t lo = it->second, hi = it->second + it->first;
    for (size_t e = round_up(lo, extent_); e < hi && e < slot_end_; e += extent_) {
      const size_t i = e / extent_;
      if (e + extent_len(i) > hi) break;
      if (extent_len(i) >= min_len) return i;
    }
  }
  return std::nullopt;
}

bool slot_pool::claim_extent(arena_id a, size_t stride) {
  if (auto i = free_extent(stride)) return move_extent(*i, a);
  // An empty extent of another arena, a closed one's first.
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < extents_.size(); ++i) {
      const auto& x = extents_[i];
      if (x.arena == anonymous_arena || x.arena == a || x.slots != 0) continue;
      if ((pass == 0) == arenas_[x.arena].open) continue;
      if (extent_len(i) >= stride) return move_extent(i, a);
    }
  return false;
}

std::optional<std::pair<size_t, size_t>> slot_pool::claim_ahead(arena_id a) {
  if (a == anonymous_arena || !arena_open(a)) return std::nullopt;
  size_t room = 0;
  for (const auto& run : lens(a)) room += run.first;
  if (room >= extent_) return std::nullopt;
  // A whole one (the short last extent is not worth claiming ahead).
  const auto i = free_extent(extent_);
  if (!i || !move_extent(*i, a)) return std::nullopt;
  const size_t off = *i * extent_;
  return std::make_pair(off, std::min(extent_, map_len_ - off));
}

status slot_pool::prefault_extent(size_t offset, size_t len) const {
  return populate(offset, len, false);
}

bool slot_pool::reclaim_for_anonymous(size_t stride) {
  bool moved = false;
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < extents_.size(); ++i) {
      const auto& x = extents_[i];
      if (x.arena == anonymous_arena || x.slots != 0) continue;
      if ((pass == 0) == arenas_[x.arena].open) continue;
      if (!move_extent(i, anonymous_arena)) continue;
      moved = true;
      if (lens(anonymous_arena).lower_bound({stride, 0}) != lens(anonymous_arena).end())
        return true;
    }
  return moved;
}

size_t slot_pool::largest_free_run() const {
  size_t best = 0;
  for (const auto& l : by_len_)
    if (!l.empty()) best = std::max(best, l.rbegin()->first);
  return best;
}

} // namespace kvs
