// File helpers of the L2 folder (l2/lru_folder).
#pragma once

#include "core/error.hpp"

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace kvs {

/// mkdir -p; error kind "io" naming the directory that could not be made.
status make_dirs(const std::string& path);

/// Reads exactly n bytes at offset; false on error or a short file.
bool pread_all(int fd, void* buf, size_t n, off_t off);

using writev_fn = std::function<ssize_t(int, const iovec*, int)>;

/// ::writev (a tier's default write call).
writev_fn default_writev();

/// Creates `path` if missing and checks it can be read and written; error
/// kind "io" naming it otherwise.
status open_dir_rw(const std::string& path);

bool ends_with(std::string_view s, std::string_view suffix);

/// Writes iov[0..n) to `tmp` through `writev` (retrying short writes and
/// EINTR), fdatasyncs it when `fsync`, then renames it over `final_path`, so
/// nobody sees a half-written file under the final name. 0, or the errno
/// that stopped it (ENOSPC for a zero write); `tmp` is removed on failure.
int write_then_rename(const writev_fn& writev, const std::string& tmp,
                      const std::string& final_path, iovec* iov, int n, bool fsync);

} // namespace kvs
