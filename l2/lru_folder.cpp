#include "l2/lru_folder.hpp"

#include "l2/file_io.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <tuple>

namespace kvs {

lru_folder::lru_folder(lru_folder_options opts, std::shared_ptr<const l2_naming> naming)
  : opts_(std::move(opts)), naming_(std::move(naming)) {
  if (!opts_.writev)
    opts_.writev = default_writev();
}

expected<std::unique_ptr<lru_folder>> lru_folder::open(lru_folder_options opts,
                                                       std::shared_ptr<const l2_naming> naming) {
  if (auto ok = open_dir_rw(opts.path); !ok)
    return ok.error_value();
  std::unique_ptr<lru_folder> t{new lru_folder(std::move(opts), std::move(naming))};
  t->scan();
  return t;
}

std::string lru_folder::describe() const {
  const bool ours = naming_->exclusive();
  return "disk " + opts_.path + (ours ? "" : " in LMCache's fs layout") + " ("
         + std::to_string(opts_.size >> 20) + " MiB, " + std::to_string(stats_.recovered)
         + (ours ? " chunks found)" : " objects found)");
}

void lru_folder::scan() {
  DIR* d = ::opendir(opts_.path.c_str());
  if (!d)
    return;
  struct found {
    timespec mtime;
    std::string name;
    uint64_t bytes;
    std::string salt;
  };
  std::vector<found> kept;
  const time_t stale_before = ::time(nullptr) - static_cast<time_t>(opts_.stale_tmp_age.count());
  const size_t head_n = naming_->header_bytes();
  std::vector<uint8_t> head(head_n);
  while (auto* de = ::readdir(d)) {
    std::string name = de->d_name;
    const auto full = full_path(name);
    struct stat sb;
    if (::stat(full.c_str(), &sb) != 0 || !S_ISREG(sb.st_mode))
      continue;
    if (naming_->is_tmp(name)) {
      if (naming_->exclusive() || sb.st_mtim.tv_sec < stale_before) { // a put that never finished
        ::unlink(full.c_str());
        ++stats_.dropped_at_open;
      }
      continue;
    }
    auto fields = naming_->parse_file_name(name);
    if (!fields)
      continue; // not an object name: not ours to touch
    bool ok = true;
    if (head_n > 0) {
      int fd = ::open(full.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0)
        continue;
      ok = pread_all(fd, head.data(), head_n, 0)
           && naming_->check_found(*fields, head.data(), static_cast<uint64_t>(sb.st_size));
      ::close(fd);
    }
    if (!ok) {
      if (naming_->exclusive()) {
        ::unlink(full.c_str());
        ++stats_.dropped_at_open;
      }
      continue;
    }
    kept.push_back({sb.st_mtim, std::move(name), static_cast<uint64_t>(sb.st_size),
                    std::move(fields->salt)});
  }
  ::closedir(d);
  std::sort(kept.begin(), kept.end(), [](const found& a, const found& b) {
    return std::tie(a.mtime.tv_sec, a.mtime.tv_nsec) < std::tie(b.mtime.tv_sec, b.mtime.tv_nsec);
  });
  for (auto& f : kept) {
    index(f.name, f.bytes, f.salt);
    ++stats_.recovered;
  }
  while (stats_.bytes > opts_.size && !lru_.empty()) // a smaller `size` than last time
    drop(lru_.begin(), true);
}

std::string lru_folder::salt_of(const std::string& name) const {
  auto f = naming_->parse_file_name(name);
  return f ? f->salt : std::string();
}

void lru_folder::index(const std::string& name, uint64_t bytes, std::string_view salt) {
  lru_.push_back(entry{name, bytes});
  map_[name] = std::prev(lru_.end());
  stats_.bytes += bytes;
  stats_.objects = lru_.size();
  // Usage counts payload bytes, as LMCache's adapters count an object's size.
  const uint64_t head = naming_->header_bytes();
  ledger_.added(name, salt, bytes > head ? bytes - head : 0);
}

void lru_folder::forget(const std::string& name) {
  auto it = map_.find(name);
  if (it == map_.end())
    return;
  stats_.bytes -= it->second->bytes;
  lru_.erase(it->second);
  map_.erase(it);
  stats_.objects = lru_.size();
  ledger_.removed(name);
}

void lru_folder::drop(std::list<entry>::iterator it, bool count_eviction) {
  auto name = it->name;
  ::unlink(full_path(name).c_str());
  if (count_eviction)
    ++stats_.evictions;
  forget(name);
  if (on_removed) {
    auto fields = naming_->parse_file_name(name);
    on_removed(l2_removed{name, fields ? std::move(*fields) : l2_name_fields{}});
  }
}

bool lru_folder::make_room(uint64_t bytes) {
  if (bytes > opts_.size)
    return false;
  while (stats_.bytes + bytes > opts_.size && !lru_.empty())
    drop(lru_.begin(), true);
  return true;
}

bool lru_folder::contains_one(const std::string& name) {
  if (map_.count(name))
    return true;
  if (naming_->exclusive())
    return false;
  struct stat sb;
  if (::stat(full_path(name).c_str(), &sb) != 0 || !S_ISREG(sb.st_mode))
    return false;
  make_room(static_cast<uint64_t>(sb.st_size)); // another writer's, since open()
  index(name, static_cast<uint64_t>(sb.st_size), salt_of(name));
  ++stats_.adopted;
  return true;
}

lru_folder::put_result lru_folder::put_one(const l2_key& k, std::string_view bytes) {
  auto name = naming_->file_name(k);
  if (!name)
    return put_result::unnamed;
  if (contains_one(*name)) {
    ++stats_.put_exists;
    return put_result::exists;
  }
  const size_t head_n = naming_->header_bytes();
  const uint64_t total = bytes.size() + head_n;
  if (!make_room(total)) {
    ++stats_.too_large;
    return put_result::too_large;
  }
  const auto final_name = full_path(*name);
  uint8_t head[64];
  naming_->encode_header(k, bytes.size(), head);
  iovec iov[2] = {{head, head_n}, {const_cast<char*>(bytes.data()), bytes.size()}};
  iovec* first = head_n > 0 ? iov : iov + 1;
  if (int err = write_then_rename(opts_.writev, naming_->tmp_name(final_name), final_name, first,
                                  head_n > 0 ? 2 : 1, opts_.fsync);
      err != 0) {
    if (err == ENOSPC || err == EDQUOT) {
      ++stats_.no_space;
      return put_result::no_space;
    }
    ++stats_.io_errors;
    return put_result::io_error;
  }
  index(*name, total, k.salt);
  ++stats_.puts;
  return put_result::stored;
}

bool lru_folder::get_one(const l2_key& k, std::string* out) {
  auto name = naming_->file_name(k);
  if (!name)
    return false;
  auto it = map_.find(*name);
  if (it == map_.end() && naming_->exclusive()) {
    ++stats_.misses;
    return false;
  }
  int fd = ::open(full_path(*name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    // Deleted behind our back (or, in a shared folder, never there).
    if (naming_->exclusive() || errno != ENOENT)
      ++stats_.io_errors;
    ++stats_.misses;
    if (naming_->exclusive())
      drop(it->second, false);
    else
      forget(*name);
    return false;
  }
  const size_t head_n = naming_->header_bytes();
  uint8_t head[64];
  struct stat sb;
  uint32_t at = 0;
  bool read = ::fstat(fd, &sb) == 0 && (head_n == 0 || pread_all(fd, head, head_n, 0));
  const uint64_t size = read ? static_cast<uint64_t>(sb.st_size) : 0;
  const bool checked = read && naming_->check(k, head, size, &at);
  if (checked) {
    out->resize(size - at);
    read = pread_all(fd, out->data(), size - at, static_cast<off_t>(at));
  }
  ::close(fd);
  if (!checked || !read) {
    ++stats_.misses;
    if (naming_->exclusive()) { // ours, and not what it should be: gone
      ++stats_.rejected;
      drop(it->second, false);
    } else if (!checked) {
      ++stats_.rejected; // another writer's file of another length: left alone
    } else {
      ++stats_.io_errors;
    }
    return false;
  }
  if (it == map_.end()) {
    make_room(size);
    index(*name, size, k.salt);
    ++stats_.adopted;
  } else {
    lru_.splice(lru_.end(), lru_, it->second);
    ledger_.touched(*name);
  }
  ++stats_.hits;
  return true;
}

std::vector<bool> lru_folder::contains(const std::vector<std::string>& names) {
  std::vector<bool> out(names.size());
  for (size_t i = 0; i < names.size(); ++i)
    out[i] = contains_one(names[i]);
  return out;
}

std::vector<bool> lru_folder::put(const std::vector<put_item>& items) {
  std::vector<bool> out(items.size());
  for (size_t i = 0; i < items.size(); ++i)
    out[i] = put_one(*items[i].key, items[i].bytes) == put_result::stored;
  // IsolatedLRU's order: a batch's last object is the oldest of it.
  for (size_t i = items.size(); i-- > 0;)
    if (out[i])
      ledger_.touched(*items[i].name);
  return out;
}

std::vector<bool> lru_folder::get(const std::vector<get_item>& items,
                                  std::vector<std::string>& values, std::vector<uint32_t>& skip) {
  values.resize(items.size());
  skip.assign(items.size(), 0);
  std::vector<bool> out(items.size());
  for (size_t i = 0; i < items.size(); ++i)
    out[i] = get_one(*items[i].key, &values[i]);
  return out;
}

size_t lru_folder::erase(const std::vector<std::string>& names) {
  size_t n = 0;
  for (auto& name : names)
    if (auto it = map_.find(name); it != map_.end()) {
      drop(it->second, false);
      ++n;
    }
  return n;
}

size_t lru_folder::clear() {
  size_t n = 0;
  for (; !lru_.empty(); ++n)
    drop(lru_.begin(), false);
  return n;
}

l2_listing lru_folder::list(uint64_t offset, uint64_t limit) const {
  l2_listing out;
  out.total = lru_.size();
  auto it = lru_.begin();
  for (uint64_t i = 0; i < offset && it != lru_.end(); ++i)
    ++it;
  for (; it != lru_.end() && out.objects.size() < limit; ++it)
    if (auto* o = ledger_.find(it->name))
      out.objects.push_back(*o);
  return out;
}

void lru_folder::figures(const l2_figure_sink& out) const {
  auto& d = stats_;
  auto f = [](uint64_t v) { return static_cast<double>(v); };
  out("disk_objects", "kvsidecar_l2_objects", true, f(d.objects), "tier", "disk");
  out("disk_bytes", "kvsidecar_l2_bytes", true, f(d.bytes), "tier", "disk");
  out("disk_puts", "kvsidecar_l2_puts_total", false, f(d.puts), "tier", "disk");
  out("disk_put_exists", "", false, f(d.put_exists), "", "");
  out("disk_hits", "kvsidecar_l2_hits_total", false, f(d.hits), "tier", "disk");
  out("disk_misses", "kvsidecar_l2_misses_total", false, f(d.misses), "tier", "disk");
  out("disk_evictions", "kvsidecar_l2_evictions_total", false, f(d.evictions), "tier", "disk");
  out("disk_no_space", "kvsidecar_l2_errors_total", false, f(d.no_space), "kind",
      "disk_no_space");
  out("disk_io_errors", "kvsidecar_l2_errors_total", false, f(d.io_errors), "kind", "disk_io");
  out(naming_->rejected_kind(), "kvsidecar_l2_errors_total", false, f(d.rejected), "kind",
      naming_->rejected_kind());
  if (!naming_->exclusive())
    out("disk_adopted", "kvsidecar_l2_adopted_objects_total", false, f(d.adopted), "", "");
}

std::vector<std::string> lru_folder::new_faults() {
  std::vector<std::string> out;
  auto once = [&](uint64_t now, uint64_t& seen, const char* what) {
    if (now > 0 && seen == 0)
      out.push_back("disk " + std::string(what) + ": " + std::to_string(now)
                    + " so far (skipped as misses; counted in the stats line)");
    seen = now;
  };
  once(stats_.no_space, seen_no_space_, "full (ENOSPC) on write");
  once(stats_.io_errors, seen_io_errors_, "I/O error");
  once(stats_.rejected, seen_rejected_,
       naming_->exclusive() ? "object rejected (corrupt, truncated or foreign)"
                            : "file of another length than the layout's (a miss, left alone)");
  return out;
}

std::vector<std::string> lru_folder::lru_order() const {
  std::vector<std::string> out;
  for (auto& e : lru_)
    out.push_back(e.name);
  return out;
}

} // namespace kvs
