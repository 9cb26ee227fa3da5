#include "gpu/staging_pool.hpp"

#include "gpu/fault_guard.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <signal.h>
#include <cstring>
#include <fcntl.h>
#include <random>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kvs {

namespace {

error sys_error(const std::string& what, const std::string& name, int e) {
  return make_error("staging", what + "('" + name + "'): " + std::strerror(e));
}

struct copy_job {
  uint8_t* base;
  uint64_t origin;
  uint64_t slot_bytes;
  const std::vector<uint64_t>* offsets;
  const std::vector<uint8_t*>* l1;
  bool to_l1;
  const std::vector<uint64_t>* lengths; ///< empty: slot_bytes each
};

/// Under run_guarded: plain memcpy over checked addresses, nothing owned.
void copy_slots(void* arg) {
  const auto* j = static_cast<const copy_job*>(arg);
  for (size_t i = 0; i < j->offsets->size(); ++i) {
    uint8_t* slot = j->base + ((*j->offsets)[i] - j->origin);
    const uint64_t n = j->lengths->empty() ? j->slot_bytes : (*j->lengths)[i];
    if (j->to_l1)
      std::memcpy((*j->l1)[i], slot, n);
    else
      std::memcpy(slot, (*j->l1)[i], n);
  }
}

/// Bytes of `slots` slots of `slot_bytes`, or why that is no pool.
expected<uint64_t> pool_bytes(uint64_t slot_bytes, uint32_t slots) {
  if (slot_bytes == 0 || slots == 0)
    return make_error("staging", "a staging pool needs at least one slot of at least one byte");
  uint64_t size = 0;
  if (__builtin_mul_overflow(slot_bytes, uint64_t{slots}, &size) || size > (uint64_t{1} << 46))
    return make_error("staging", std::to_string(slots) + " slots of " +
                                     std::to_string(slot_bytes) + " bytes is too large");
  return size;
}

} // namespace

staging_pool::staging_pool(std::string name, uint8_t* base, uint64_t size, uint64_t slot_bytes,
                           uint32_t slots)
    : name_(std::move(name)), base_(base), size_(size), slot_bytes_(slot_bytes) {
  taken_.assign(slots, false);
  free_.reserve(slots);
  for (uint32_t s = slots; s > 0; --s) free_.push_back(s - 1);
}

status staging_pool::copy(const std::vector<uint64_t>& offsets, const std::vector<uint8_t*>& l1,
                          bool to_l1, const std::vector<uint64_t>& lengths) const {
  if (offsets.size() != l1.size())
    return make_error("staging", std::to_string(offsets.size()) + " staging slots for " +
                                     std::to_string(l1.size()) + " L1 chunks");
  if (!lengths.empty() && lengths.size() != offsets.size())
    return make_error("staging", std::to_string(lengths.size()) + " lengths for " +
                                     std::to_string(offsets.size()) + " slots");
  for (auto n : lengths)
    if (n > slot_bytes_)
      return make_error("staging", "a copy of " + std::to_string(n) + " bytes into slots of " +
                                       std::to_string(slot_bytes_));
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (!is_taken(offsets[i]))
      return make_error("staging", "offset " + std::to_string(offsets[i]) + " of '" + name_ +
                                       "' is not a slot handed out");
    if (l1[i] == nullptr) return make_error("staging", "L1 chunk " + std::to_string(i) + " is null");
  }
  copy_job job{base_, origin_, slot_bytes_, &offsets, &l1, to_l1, &lengths};
  const guarded_range range{base_, size_};
  const guard_result g = run_guarded(&range, 1, &copy_slots, &job);
  if (g.faulted)
    return make_error("shm_truncated", "staging object '" + name_ + "' no longer backs byte " +
                                           std::to_string(g.offset) + " of its " +
                                           std::to_string(size_) +
                                           " (the engine truncated it); the copy was abandoned");
  return {};
}

size_t remove_stale_staging_pools(const std::string& shm_dir) {
  DIR* d = opendir(shm_dir.c_str());
  if (d == nullptr)
    return 0;
  size_t removed = 0;
  const std::string prefix = "kvsidecar.";
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0 || name.find(".ed.") == std::string::npos)
      continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + prefix.size(), &end, 10);
    if (pid <= 0 || end == nullptr || std::strncmp(end, ".ed.", 4) != 0)
      continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH)
      continue; // alive (or not ours to judge)
    if (shm_unlink(("/" + name).c_str()) == 0)
      ++removed;
  }
  closedir(d);
  return removed;
}

std::string staging_pool_name(int64_t instance_id) {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(r));
  return "/kvsidecar." + std::to_string(getpid()) + ".ed." + std::to_string(instance_id) + "." +
         hex;
}

expected<std::unique_ptr<staging_pool>> staging_pool::create(std::string name,
                                                              uint64_t slot_bytes,
                                                              uint32_t slots,
                                                              std::optional<uint32_t> owner_uid) {
  auto size = pool_bytes(slot_bytes, slots);
  if (!size) return size.error_value();
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return sys_error("shm_open", name, errno);
  auto fail = [&](const char* what) {
    const int e = errno;
    close(fd);
    shm_unlink(name.c_str());
    return sys_error(what, name, e);
  };
  if (owner_uid && *owner_uid != geteuid() && fchown(fd, *owner_uid, static_cast<gid_t>(-1)) != 0)
    return fail("fchown to the client's uid");
  if (ftruncate(fd, static_cast<off_t>(*size)) != 0) return fail("ftruncate");
  // Reserve the pages now: tmpfs grants a sparse object of any size, and the
  // engine would die of SIGBUS on its first write past what /dev/shm holds.
  if (int e = posix_fallocate(fd, 0, static_cast<off_t>(*size)); e != 0) {
    close(fd);
    shm_unlink(name.c_str());
    return make_error("staging", "posix_fallocate('" + name + "', " + std::to_string(*size) +
                                     " bytes): " + std::strerror(e) +
                                     " (is /dev/shm large enough? cache.engine_driven_slots "
                                     "sets the slots per instance)");
  }
  void* p = mmap(nullptr, *size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("mmap");
  close(fd);
  return std::unique_ptr<staging_pool>(
    new staging_pool(std::move(name), static_cast<uint8_t*>(p), *size, slot_bytes, slots));
}

expected<std::unique_ptr<staging_pool>> staging_pool::open_in(std::string name, uint64_t origin,
                                                               uint64_t slot_bytes,
                                                               uint32_t slots) {
  auto size = pool_bytes(slot_bytes, slots);
  if (!size) return size.error_value();
  if (origin % static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) != 0)
    return make_error("staging", "origin " + std::to_string(origin) + " is not page-aligned");
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return sys_error("shm_open", name, errno);
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < origin + *size) {
    close(fd);
    return make_error("staging", "'" + name + "' is shorter than its staging slots end (" +
                                     std::to_string(origin + *size) + " bytes)");
  }
  if (int e = posix_fallocate(fd, static_cast<off_t>(origin), static_cast<off_t>(*size)); e != 0) {
    close(fd);
    return make_error("staging", "posix_fallocate('" + name + "', " + std::to_string(*size) +
                                     " bytes): " + std::strerror(e) +
                                     " (is /dev/shm large enough? cache.engine_driven_slots "
                                     "sets the slots per instance)");
  }
  void* p = mmap(nullptr, *size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(origin));
  const int e = errno;
  close(fd);
  if (p == MAP_FAILED) return sys_error("mmap", name, e);
  std::unique_ptr<staging_pool> pool(
    new staging_pool(std::move(name), static_cast<uint8_t*>(p), *size, slot_bytes, slots));
  pool->owns_name_ = false;
  pool->origin_ = origin;
  return pool;
}

staging_pool::~staging_pool() {
  if (base_ != nullptr) munmap(base_, size_);
  if (owns_name_ && !name_.empty()) shm_unlink(name_.c_str());
}

std::vector<uint64_t> staging_pool::take(uint32_t n) {
  std::vector<uint64_t> out;
  while (n-- > 0 && !free_.empty()) {
    const uint32_t s = free_.back();
    free_.pop_back();
    taken_[s] = true;
    out.push_back(origin_ + uint64_t{s} * slot_bytes_);
  }
  return out;
}

bool staging_pool::is_taken(uint64_t offset) const {
  if (offset < origin_) return false;
  offset -= origin_;
  if (offset % slot_bytes_ != 0) return false;
  const uint64_t s = offset / slot_bytes_;
  return s < taken_.size() && taken_[s];
}

status staging_pool::give(const std::vector<uint64_t>& offsets) {
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (!is_taken(offsets[i]))
      return make_error("staging", "offset " + std::to_string(offsets[i]) + " of '" + name_ +
                                       "' is not a slot handed out");
    for (size_t j = 0; j < i; ++j)
      if (offsets[j] == offsets[i])
        return make_error("staging", "offset " + std::to_string(offsets[i]) + " given twice");
  }
  for (uint64_t o : offsets) {
    const auto s = static_cast<uint32_t>((o - origin_) / slot_bytes_);
    taken_[s] = false;
    free_.push_back(s);
  }
  return {};
}

} // namespace kvs
