// File helpers shared by the disk tiers (l2/disk_tier, l2/lmcache_dir_tier).
#pragma once

#include "core/error.hpp"

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <functional>
#include <string>

namespace kvs {

/// mkdir -p; error kind "io" naming the directory that could not be made.
status make_dirs(const std::string& path);

/// Reads exactly n bytes at offset; false on error or a short file.
bool pread_all(int fd, void* buf, size_t n, off_t off);

/// Writes every byte of iov[0..n) through `writev` (retrying short writes
/// and EINTR). 0, or the errno that stopped it (ENOSPC for a zero write).
int writev_all(const std::function<ssize_t(int, const iovec*, int)>& writev, int fd, iovec* iov,
               int n);

} // namespace kvs
