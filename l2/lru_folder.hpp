// L2 on a node-local folder: one file per chunk shard under `path`, LRU
// inside `size`, named, framed and checked by an l2_naming (l2.format):
// kvsidecar's own layout or LMCache's fs adapter layout.
//
// A put writes a temporary, then rename()s it over the final name, so a
// reader (or a restart) never sees a half-written object under a final
// name. fsync before the rename is an option (off by default): this is a
// cache, a crash may lose its last writes, and a file that lost its data to
// a power cut fails its check and is a miss (measured cost: BENCHMARKS.md).
//
// open() rebuilds the index from the folder, oldest mtime least recently
// used, and counts each file's bytes to the salt its name carries. With an
// exclusive naming (kvsidecar's) temporaries and files that fail their check
// are removed; with LMCache's, temporaries older than stale_tmp_age are
// removed, files of other writers are found by name later (adopted) and a
// file of another length is a miss, left alone. Objects beyond `size` are
// evicted, whoever wrote them: with a shared folder, give one node the
// eviction budget (README).
//
// Faults are misses or skips, never errors to the caller: ENOSPC, EIO, a
// corrupt or foreign file, a file deleted behind our back. Each is counted.
//
// Single-threaded (the L2 actor owns it).
#pragma once

#include "core/error.hpp"
#include "l2/l2_backend.hpp"
#include "l2/l2_naming.hpp"

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

struct lru_folder_options {
  std::string path;
  uint64_t size = 0;  ///< bytes of files to keep at most
  bool fsync = false; ///< fdatasync each file before the rename
  /// A shared (LMCache) folder: our temporaries older than this are removed
  /// at open() (an exclusive folder removes them all).
  std::chrono::seconds stale_tmp_age{600};
  /// The write call (tests inject ENOSPC/EIO here); ::writev by default.
  std::function<ssize_t(int, const iovec*, int)> writev;
};

struct lru_folder_stats {
  uint64_t objects = 0;
  uint64_t bytes = 0;
  uint64_t puts = 0;
  uint64_t put_exists = 0; ///< already there (ours, or another writer's)
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t evictions = 0;
  uint64_t no_space = 0;   ///< ENOSPC/EDQUOT on write: skipped
  uint64_t io_errors = 0;  ///< other write/read errors
  uint64_t rejected = 0;   ///< a file failed its check (header, or length): a miss
  uint64_t too_large = 0;  ///< one object bigger than `size`: skipped
  uint64_t recovered = 0;  ///< files indexed at open()
  uint64_t adopted = 0;    ///< files another writer put there since, found by name
  uint64_t dropped_at_open = 0;
};

class lru_folder final : public l2_backend {
public:
  /// Creates `path` if missing and indexes what is there. Error kind "io"
  /// (the detail names the path) when the folder cannot be made or read.
  static expected<std::unique_ptr<lru_folder>> open(lru_folder_options opts,
                                                    std::shared_ptr<const l2_naming> naming);

  // l2_backend
  const char* medium() const override { return "DISK"; }
  const char* tier() const override { return "disk"; }
  bool shared() const override { return false; }
  std::string describe() const override;
  std::optional<std::string> name(const l2_key& k) const override { return naming_->file_name(k); }
  std::vector<bool> contains(const std::vector<std::string>& names) override;
  std::optional<object_key_fields> fields_of(const std::string& name) const override {
    return naming_->file_fields(name);
  }
  std::optional<std::string> name_of(const object_key_fields& f) const override {
    return naming_->file_name_of(f);
  }
  std::vector<bool> put(const std::vector<put_item>& items) override;
  std::vector<bool> get(const std::vector<get_item>& items, std::vector<std::string>& values,
                        std::vector<uint32_t>& skip) override;
  size_t erase(const std::vector<std::string>& names) override;
  size_t clear() override;
  l2_listing list(uint64_t offset, uint64_t limit) const override;
  void figures(const l2_figure_sink& out) const override;
  std::vector<std::string> new_faults() override;

  /// One object: kvsidecar's layout encodes `k`'s header in front.
  enum class put_result { stored, exists, unnamed, too_large, no_space, io_error };
  put_result put_one(const l2_key& k, std::string_view bytes);
  bool contains_one(const std::string& name);
  /// Reads the payload of `k` into *out (resized). False on a miss.
  bool get_one(const l2_key& k, std::string* out);

  const lru_folder_stats& stats() const { return stats_; }
  const lru_folder_options& options() const { return opts_; }
  /// Least recently used first (tests).
  std::vector<std::string> lru_order() const;

private:
  struct entry {
    std::string name;
    uint64_t bytes;
  };

  lru_folder(lru_folder_options opts, std::shared_ptr<const l2_naming> naming);
  std::string full_path(const std::string& name) const { return opts_.path + "/" + name; }
  void scan();
  /// Indexes a file (newest), counting its bytes to its salt.
  void index(const std::string& name, uint64_t bytes, std::string_view salt);
  /// Unindexes without touching the file.
  void forget(const std::string& name);
  /// Removes the file; on_removed.
  void drop(std::list<entry>::iterator it, bool count_eviction);
  bool make_room(uint64_t bytes);
  std::string salt_of(const std::string& name) const;

  lru_folder_options opts_;
  std::shared_ptr<const l2_naming> naming_;
  std::list<entry> lru_; // front = least recently used
  std::unordered_map<std::string, std::list<entry>::iterator> map_;
  lru_folder_stats stats_;
  uint64_t seen_no_space_ = 0, seen_io_errors_ = 0, seen_rejected_ = 0; ///< faults logged once
};

} // namespace kvs
