#include "l2/lmcache_dir_tier.hpp"

#include "l2/file_io.hpp"
#include "l2/lmcache_object_name.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <tuple>

namespace kvs {

namespace {

constexpr std::string_view k_tmp_suffix = ".kvstmp";

} // namespace

lmcache_dir_tier::lmcache_dir_tier(lmcache_dir_options opts) : opts_(std::move(opts)) {
  if (!opts_.writev)
    opts_.writev = default_writev();
}

expected<std::unique_ptr<lmcache_dir_tier>> lmcache_dir_tier::open(lmcache_dir_options opts) {
  if (auto ok = open_dir_rw(opts.path); !ok)
    return ok.error_value();
  std::unique_ptr<lmcache_dir_tier> t{new lmcache_dir_tier(std::move(opts))};
  t->scan();
  return t;
}

void lmcache_dir_tier::scan() {
  DIR* d = ::opendir(opts_.path.c_str());
  if (!d)
    return;
  struct found {
    timespec mtime;
    std::string name;
    uint64_t bytes;
  };
  std::vector<found> kept;
  const time_t stale_before = ::time(nullptr) - static_cast<time_t>(opts_.stale_tmp_age.count());
  while (auto* de = ::readdir(d)) {
    std::string name = de->d_name;
    struct stat sb;
    if (::stat(full_path(name).c_str(), &sb) != 0 || !S_ISREG(sb.st_mode))
      continue;
    if (ends_with(name, k_tmp_suffix)) {
      if (sb.st_mtim.tv_sec < stale_before) { // a put of ours that never finished
        ::unlink(full_path(name).c_str());
        ++stats_.dropped_at_open;
      }
      continue;
    }
    if (!parse_lmcache_file_name(name))
      continue; // not an object name: not ours to touch
    kept.push_back({sb.st_mtim, std::move(name), static_cast<uint64_t>(sb.st_size)});
  }
  ::closedir(d);
  std::sort(kept.begin(), kept.end(), [](const found& a, const found& b) {
    return std::tie(a.mtime.tv_sec, a.mtime.tv_nsec) < std::tie(b.mtime.tv_sec, b.mtime.tv_nsec);
  });
  for (auto& f : kept) {
    lru_.push_back(entry{f.name, f.bytes});
    map_[f.name] = std::prev(lru_.end());
    stats_.bytes += f.bytes;
    ++stats_.recovered;
  }
  stats_.objects = lru_.size();
  while (stats_.bytes > opts_.size && !lru_.empty()) // a smaller `size` than last time
    drop(lru_.begin());
}

void lmcache_dir_tier::index(const std::string& name, uint64_t bytes) {
  make_room(bytes);
  lru_.push_back(entry{name, bytes});
  map_[name] = std::prev(lru_.end());
  stats_.bytes += bytes;
  stats_.objects = lru_.size();
}

void lmcache_dir_tier::forget(const std::string& name) {
  auto it = map_.find(name);
  if (it == map_.end())
    return;
  stats_.bytes -= it->second->bytes;
  lru_.erase(it->second);
  map_.erase(it);
  stats_.objects = lru_.size();
}

size_t lmcache_dir_tier::clear() {
  size_t n = 0;
  for (; !lru_.empty(); ++n)
    drop(lru_.begin(), false);
  return n;
}

void lmcache_dir_tier::drop(std::list<entry>::iterator it, bool count_eviction) {
  auto name = it->name;
  ::unlink(full_path(name).c_str());
  if (count_eviction)
    ++stats_.evictions;
  forget(name);
  if (on_removed)
    on_removed(name);
}

bool lmcache_dir_tier::make_room(uint64_t bytes) {
  if (bytes > opts_.size)
    return false;
  while (stats_.bytes + bytes > opts_.size && !lru_.empty())
    drop(lru_.begin());
  return true;
}

lmcache_dir_put lmcache_dir_tier::put(const std::string& name, const void* data, size_t bytes) {
  if (contains(name)) {
    ++stats_.put_exists;
    return lmcache_dir_put::exists;
  }
  if (!make_room(bytes)) {
    ++stats_.too_large;
    return lmcache_dir_put::too_large;
  }
  const auto final_name = full_path(name);
  // The pid keeps two nodes writing one object from sharing a temporary.
  const auto tmp = final_name + "." + std::to_string(::getpid()) + std::string(k_tmp_suffix);
  iovec iov[1] = {{const_cast<void*>(data), bytes}};
  if (int err = write_then_rename(opts_.writev, tmp, final_name, iov, 1, opts_.fsync); err != 0) {
    if (err == ENOSPC || err == EDQUOT) {
      ++stats_.no_space;
      return lmcache_dir_put::no_space;
    }
    ++stats_.io_errors;
    return lmcache_dir_put::io_error;
  }
  index(name, bytes);
  ++stats_.puts;
  return lmcache_dir_put::stored;
}

bool lmcache_dir_tier::contains(const std::string& name) {
  if (map_.count(name))
    return true;
  struct stat sb;
  if (::stat(full_path(name).c_str(), &sb) != 0 || !S_ISREG(sb.st_mode))
    return false;
  index(name, static_cast<uint64_t>(sb.st_size)); // another writer's, since open()
  ++stats_.adopted;
  return true;
}

bool lmcache_dir_tier::get(const std::string& name, size_t expect_bytes, std::string* out) {
  int fd = expect_bytes == 0 ? -1 : ::open(full_path(name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (expect_bytes != 0 && errno != ENOENT)
      ++stats_.io_errors;
    forget(name); // deleted behind our back (or never there)
    ++stats_.misses;
    return false;
  }
  struct stat sb;
  bool ok = ::fstat(fd, &sb) == 0;
  if (ok && static_cast<uint64_t>(sb.st_size) != expect_bytes) {
    ::close(fd);
    ++stats_.wrong_size;
    ++stats_.misses;
    return false;
  }
  if (ok) {
    out->resize(expect_bytes);
    ok = pread_all(fd, out->data(), expect_bytes, 0);
  }
  ::close(fd);
  if (!ok) {
    ++stats_.io_errors;
    ++stats_.misses;
    return false;
  }
  auto it = map_.find(name);
  if (it == map_.end()) {
    index(name, expect_bytes);
    ++stats_.adopted;
  } else {
    lru_.splice(lru_.end(), lru_, it->second);
  }
  ++stats_.hits;
  return true;
}

std::vector<std::string> lmcache_dir_tier::lru_order() const {
  std::vector<std::string> out;
  for (auto& e : lru_)
    out.push_back(e.name);
  return out;
}

} // namespace kvs
