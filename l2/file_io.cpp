#include "l2/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvs {

status make_dirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || (path[i] == '/' && i > 0)) {
      cur = path.substr(0, i);
      if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
        return make_error("io", "cannot create directory " + cur + ": " + std::strerror(errno));
    }
  }
  struct stat sb;
  if (::stat(path.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode))
    return make_error("io", path + " is not a directory");
  return {};
}

bool pread_all(int fd, void* buf, size_t n, off_t off) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, off);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return false;
    p += r;
    n -= static_cast<size_t>(r);
    off += r;
  }
  return true;
}

namespace {

int writev_all(const writev_fn& writev, int fd, iovec* cur, int iovcnt) {
  while (iovcnt > 0) {
    ssize_t w = writev(fd, cur, iovcnt);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return w < 0 ? errno : ENOSPC;
    auto left = static_cast<size_t>(w);
    while (iovcnt > 0 && left >= cur->iov_len) {
      left -= cur->iov_len;
      ++cur;
      --iovcnt;
    }
    if (iovcnt > 0) {
      cur->iov_base = static_cast<char*>(cur->iov_base) + left;
      cur->iov_len -= left;
    }
  }
  return 0;
}

} // namespace

writev_fn default_writev() {
  return [](int fd, const iovec* iov, int n) { return ::writev(fd, iov, n); };
}

status open_dir_rw(const std::string& path) {
  if (path.empty())
    return make_error("io", "no path");
  if (auto made = make_dirs(path); !made)
    return made.error_value();
  if (::access(path.c_str(), R_OK | W_OK | X_OK) != 0)
    return make_error("io", "cannot read and write " + path + ": " + std::strerror(errno));
  return {};
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

int write_then_rename(const writev_fn& writev, const std::string& tmp,
                      const std::string& final_path, iovec* iov, int n, bool fsync) {
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return errno;
  int err = writev_all(writev, fd, iov, n);
  if (err == 0 && fsync && ::fdatasync(fd) != 0)
    err = errno;
  if (::close(fd) != 0 && err == 0)
    err = errno;
  if (err == 0 && ::rename(tmp.c_str(), final_path.c_str()) != 0)
    err = errno;
  if (err != 0)
    ::unlink(tmp.c_str());
  return err;
}

} // namespace kvs
