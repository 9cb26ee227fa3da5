// L2 on a folder laid out as LMCache's `fs` L2 adapter lays it out
// (l2.format = "lmcache"): one file per object, named
// l2/lmcache_object_name.hpp's lmcache_file_name(), holding the chunk's
// bytes alone. kvsidecar and LMCache servers may share the folder: each
// finds the other's files.
//
// What differs from l2/disk_tier (kvsidecar's own format):
// - No header: a file is accepted when its length is the length the reader
//   expects (the registration's chunk bytes); any other length is a miss,
//   never a short or foreign chunk. Such a file is left alone (another
//   writer may own it) and counted.
// - Other writers: a file this tier did not index (written by another node
//   after open()) is found by name on lookup and adopted into the index.
// - Temporary files are <name>.<pid>.kvstmp (LMCache's are <stem>.tmp, in
//   flight on a live node: never touched). open() removes *.kvstmp files
//   older than stale_tmp_age (a put of ours that never finished).
// - open() indexes every file whose name the fs adapter could have written,
//   oldest mtime first; nothing else in the folder is touched.
// - LRU inside `size` evicts any indexed file, whoever wrote it: with a
//   shared folder, give one node the eviction budget (README).
//
// Faults are misses or skips, never errors to the caller. Single-threaded
// (the L2 actor owns it).
#pragma once

#include "core/error.hpp"

#include <sys/types.h>
#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvs {

struct lmcache_dir_options {
  std::string path;
  uint64_t size = 0;  ///< bytes of files to keep at most
  bool fsync = false; ///< fdatasync each file before the rename
  /// *.kvstmp files older than this are removed at open().
  std::chrono::seconds stale_tmp_age{600};
  /// The write call (tests inject ENOSPC/EIO here); ::writev by default.
  std::function<ssize_t(int, const iovec*, int)> writev;
};

struct lmcache_dir_stats {
  uint64_t objects = 0;
  uint64_t bytes = 0;
  uint64_t puts = 0;
  uint64_t put_exists = 0;  ///< already there (ours, or another writer's)
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  uint64_t no_space = 0;
  uint64_t io_errors = 0;
  uint64_t wrong_size = 0;  ///< a file of another length than expected: a miss
  uint64_t too_large = 0;
  uint64_t recovered = 0;   ///< files indexed at open()
  uint64_t adopted = 0;     ///< files another writer put there since, found by name
  uint64_t dropped_at_open = 0; ///< stale *.kvstmp removed
};

enum class lmcache_dir_put { stored, exists, too_large, no_space, io_error };

class lmcache_dir_tier {
public:
  /// Creates `path` if missing and indexes what is there. Error kind "io"
  /// (the detail names the path) when the folder cannot be made or read.
  static expected<std::unique_ptr<lmcache_dir_tier>> open(lmcache_dir_options opts);

  /// Stores `bytes` under file `name` (skipped when the file exists).
  lmcache_dir_put put(const std::string& name, const void* data, size_t bytes);
  /// Indexed, or on disk now (then adopted).
  bool contains(const std::string& name);
  /// Reads file `name` into *out when it is exactly `expect_bytes` long
  /// (0: nothing is accepted). False on a miss.
  bool get(const std::string& name, size_t expect_bytes, std::string* out);

  /// Removes every indexed file (on_removed for each; not counted as
  /// evictions). Files other writers add later are indexed as before.
  /// Returns how many.
  size_t clear();

  /// Called with the name of every file this tier removes (eviction, clear).
  std::function<void(const std::string& name)> on_removed;

  const lmcache_dir_stats& stats() const { return stats_; }
  const lmcache_dir_options& options() const { return opts_; }
  /// Least recently used first (tests).
  std::vector<std::string> lru_order() const;

private:
  struct entry {
    std::string name;
    uint64_t bytes;
  };

  explicit lmcache_dir_tier(lmcache_dir_options opts);
  std::string full_path(const std::string& name) const { return opts_.path + "/" + name; }
  void scan();
  /// Indexes a file found on disk (newest), trimming to `size`.
  void index(const std::string& name, uint64_t bytes);
  void forget(const std::string& name);
  void drop(std::list<entry>::iterator it, bool count_eviction = true);
  bool make_room(uint64_t bytes);

  lmcache_dir_options opts_;
  std::list<entry> lru_; // front = least recently used
  std::unordered_map<std::string, std::list<entry>::iterator> map_;
  lmcache_dir_stats stats_;
};

} // namespace kvs
