// L2 on local disk: one file per chunk shard under `path`, LRU inside `size`.
//
// Files are named <rank:08x>@<chunk hash:016x>.kvl2 and hold an L2 object
// (l2/object_header.hpp: header + the chunk's bytes). A put writes
// <name>.tmp, then rename()s it over the final name, so a reader (or a
// restart) never sees a half-written object under a final name. fsync before
// the rename is an option (off by default): this is a cache, a crash may lose
// its last writes, and a file that lost its data to a power cut fails the
// header/size check and is dropped as a miss (measured cost: BENCHMARKS.md).
//
// open() rebuilds the index from the directory: every *.kvl2 file whose
// header is valid is kept (oldest mtime = least recently used), stray *.tmp
// files and invalid objects are removed. Objects beyond `size` are evicted.
//
// Faults are misses or skips, never errors to the caller: ENOSPC, EIO, a
// corrupt or foreign file, a file deleted behind our back. Each is counted.
//
// Single-threaded (the L2 actor owns it).
#pragma once

#include "core/error.hpp"
#include "l2/object_header.hpp"

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvs {

struct disk_tier_options {
  std::string path;
  uint64_t size = 0;    ///< bytes of objects (headers included) to keep at most
  bool fsync = false;   ///< fdatasync each object before the rename
  /// The write call (tests inject ENOSPC/EIO here); ::writev by default.
  std::function<ssize_t(int, const iovec*, int)> writev;
};

struct disk_tier_stats {
  uint64_t objects = 0;
  uint64_t bytes = 0;
  uint64_t puts = 0;
  uint64_t put_exists = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  uint64_t no_space = 0;     ///< ENOSPC/EDQUOT on write: skipped
  uint64_t io_errors = 0;    ///< other write/read errors
  uint64_t rejected = 0;     ///< a file failed its header check: removed, a miss
  uint64_t too_large = 0;    ///< one object bigger than `size`: skipped
  uint64_t recovered = 0;    ///< objects found at open()
  uint64_t dropped_at_open = 0;
};

enum class disk_put { stored, exists, too_large, no_space, io_error };

class disk_tier {
public:
  /// Creates `path` if missing and indexes what is there. Error kind "io"
  /// (the detail names the path) when the directory cannot be created or read.
  static expected<std::unique_ptr<disk_tier>> open(disk_tier_options opts);

  /// Stores one object (skipped when present). May evict LRU objects.
  disk_put put(const l2_object_id& id, const void* data, size_t bytes);
  bool contains(const l2_object_id& id) const;
  /// Reads the payload of `id` into *out (resized). False on a miss; a
  /// file that fails its header check is removed and counted.
  bool get(const l2_object_id& id, std::string* out);
  /// Removes one object; false when absent.
  bool erase(const l2_object_id& id);
  /// Removes every object (on_removed for each; not counted as evictions).
  /// Returns how many.
  size_t clear();

  /// Called with every object this tier drops (eviction, rejection), so the
  /// owner can announce BlockRemoved.
  std::function<void(uint64_t hash, int32_t rank)> on_removed;

  const disk_tier_stats& stats() const { return stats_; }
  const disk_tier_options& options() const { return opts_; }
  /// Least recently used first (tests).
  std::vector<std::pair<uint64_t, int32_t>> lru_order() const;

private:
  struct key {
    uint64_t hash;
    int32_t rank;
    bool operator==(const key& o) const { return hash == o.hash && rank == o.rank; }
  };
  struct key_hash {
    size_t operator()(const key& k) const {
      return static_cast<size_t>(k.hash ^ (static_cast<uint64_t>(k.rank) * 0x9e3779b97f4a7c15ULL));
    }
  };
  struct entry {
    key k;
    uint64_t bytes; // file size
  };

  explicit disk_tier(disk_tier_options opts);
  std::string file_name(key k) const;
  void scan();
  void drop(std::list<entry>::iterator it, bool count_eviction);
  bool make_room(uint64_t bytes);

  disk_tier_options opts_;
  std::list<entry> lru_; // front = least recently used
  std::unordered_map<key, std::list<entry>::iterator, key_hash> map_;
  disk_tier_stats stats_;
};

} // namespace kvs
