#include "l2/file_io.hpp"

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

int writev_all(const std::function<ssize_t(int, const iovec*, int)>& writev, int fd, iovec* cur,
               int iovcnt) {
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

} // namespace kvs
