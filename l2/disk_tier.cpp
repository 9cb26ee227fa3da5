#include "l2/disk_tier.hpp"
#include "l2/file_io.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <tuple>

namespace kvs {

namespace {

constexpr const char* k_suffix = ".kvl2";
constexpr const char* k_tmp_suffix = ".tmp";

} // namespace

disk_tier::disk_tier(disk_tier_options opts) : opts_(std::move(opts)) {
  if (!opts_.writev)
    opts_.writev = default_writev();
}

expected<std::unique_ptr<disk_tier>> disk_tier::open(disk_tier_options opts) {
  if (auto ok = open_dir_rw(opts.path); !ok)
    return ok.error_value();
  std::unique_ptr<disk_tier> t{new disk_tier(std::move(opts))};
  t->scan();
  return t;
}

std::string disk_tier::file_name(key k) const {
  char name[48];
  std::snprintf(name, sizeof name, "/%08x@%016" PRIx64 "%s", static_cast<uint32_t>(k.rank), k.hash,
                k_suffix);
  return opts_.path + name;
}

void disk_tier::scan() {
  DIR* d = ::opendir(opts_.path.c_str());
  if (!d)
    return;
  struct found {
    timespec mtime;
    key k;
    uint64_t bytes;
  };
  std::vector<found> kept;
  while (auto* de = ::readdir(d)) {
    std::string name = de->d_name;
    if (name == "." || name == "..")
      continue;
    std::string full = opts_.path + "/" + name;
    if (ends_with(name, k_tmp_suffix)) {
      ::unlink(full.c_str()); // a put that never finished
      ++stats_.dropped_at_open;
      continue;
    }
    if (!ends_with(name, k_suffix))
      continue; // not ours: leave it alone
    int fd = ::open(full.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      continue;
    struct stat sb;
    uint8_t h[l2_header_bytes];
    l2_object_id id;
    uint64_t payload = 0;
    bool ok = ::fstat(fd, &sb) == 0 && pread_all(fd, h, sizeof h, 0)
              && peek_l2_header(h, &id, &payload)
              && static_cast<uint64_t>(sb.st_size) == payload + l2_header_bytes
              && full == file_name(key{id.hash, id.rank});
    ::close(fd);
    if (!ok) {
      ::unlink(full.c_str());
      ++stats_.dropped_at_open;
      continue;
    }
    kept.push_back({sb.st_mtim, key{id.hash, id.rank}, static_cast<uint64_t>(sb.st_size)});
  }
  ::closedir(d);
  std::sort(kept.begin(), kept.end(), [](const found& a, const found& b) {
    return std::tie(a.mtime.tv_sec, a.mtime.tv_nsec) < std::tie(b.mtime.tv_sec, b.mtime.tv_nsec);
  });
  for (auto& f : kept) {
    lru_.push_back(entry{f.k, f.bytes});
    map_[f.k] = std::prev(lru_.end());
    stats_.bytes += f.bytes;
    ++stats_.recovered;
  }
  stats_.objects = lru_.size();
  // A smaller `size` than last time: trim the oldest.
  while (stats_.bytes > opts_.size && !lru_.empty())
    drop(lru_.begin(), true);
}

void disk_tier::drop(std::list<entry>::iterator it, bool count_eviction) {
  ::unlink(file_name(it->k).c_str());
  stats_.bytes -= it->bytes;
  if (count_eviction)
    ++stats_.evictions;
  auto k = it->k;
  map_.erase(k);
  lru_.erase(it);
  stats_.objects = lru_.size();
  if (on_removed)
    on_removed(k.hash, k.rank);
}

bool disk_tier::make_room(uint64_t bytes) {
  if (bytes > opts_.size)
    return false;
  while (stats_.bytes + bytes > opts_.size && !lru_.empty())
    drop(lru_.begin(), true);
  return true;
}

disk_put disk_tier::put(const l2_object_id& id, const void* data, size_t bytes) {
  key k{id.hash, id.rank};
  if (map_.count(k)) {
    ++stats_.put_exists;
    return disk_put::exists;
  }
  uint64_t total = bytes + l2_header_bytes;
  if (!make_room(total)) {
    ++stats_.too_large;
    return disk_put::too_large;
  }
  auto final_name = file_name(k);
  uint8_t header[l2_header_bytes];
  encode_l2_header(id, bytes, header);
  iovec iov[2] = {{header, sizeof header}, {const_cast<void*>(data), bytes}};
  if (int err = write_then_rename(opts_.writev, final_name + k_tmp_suffix, final_name, iov, 2,
                                  opts_.fsync);
      err != 0) {
    if (err == ENOSPC || err == EDQUOT) {
      ++stats_.no_space;
      return disk_put::no_space;
    }
    ++stats_.io_errors;
    return disk_put::io_error;
  }
  lru_.push_back(entry{k, total});
  map_[k] = std::prev(lru_.end());
  stats_.bytes += total;
  stats_.objects = lru_.size();
  ++stats_.puts;
  return disk_put::stored;
}

bool disk_tier::contains(const l2_object_id& id) const {
  return map_.count(key{id.hash, id.rank}) != 0;
}

bool disk_tier::get(const l2_object_id& id, std::string* out) {
  key k{id.hash, id.rank};
  auto it = map_.find(k);
  if (it == map_.end()) {
    ++stats_.misses;
    return false;
  }
  auto name = file_name(k);
  int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    // Deleted behind our back: forget it.
    ++stats_.io_errors;
    ++stats_.misses;
    drop(it->second, false);
    return false;
  }
  struct stat sb;
  uint8_t header[l2_header_bytes];
  uint64_t payload = 0;
  bool ok = ::fstat(fd, &sb) == 0 && pread_all(fd, header, sizeof header, 0);
  auto check = ok ? check_l2_header(header, static_cast<size_t>(sb.st_size), id, &payload)
                  : l2_header_check::short_object;
  if (check == l2_header_check::ok) {
    out->resize(payload);
    ok = pread_all(fd, out->data(), payload, static_cast<off_t>(l2_header_bytes));
  }
  ::close(fd);
  if (check != l2_header_check::ok || !ok) {
    ++stats_.rejected;
    ++stats_.misses;
    drop(it->second, false);
    return false;
  }
  lru_.splice(lru_.end(), lru_, it->second);
  ++stats_.hits;
  return true;
}

bool disk_tier::erase(const l2_object_id& id) {
  auto it = map_.find(key{id.hash, id.rank});
  if (it == map_.end())
    return false;
  drop(it->second, false);
  return true;
}

size_t disk_tier::clear() {
  size_t n = 0;
  for (; !lru_.empty(); ++n)
    drop(lru_.begin(), false);
  return n;
}

std::vector<std::pair<uint64_t, int32_t>> disk_tier::lru_order() const {
  std::vector<std::pair<uint64_t, int32_t>> out;
  for (auto& e : lru_)
    out.emplace_back(e.k.hash, e.k.rank);
  return out;
}

} // namespace kvs
