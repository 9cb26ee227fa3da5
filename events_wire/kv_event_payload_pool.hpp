// payload_pool: reuses the memory of large KV-event payloads instead of
// handing it back to the system.
//
// Why: a rank's replay buffer keeps up to events.buffer_bytes of payloads
// (512 MiB by default: ~8,000 batches of 256 events). When they are dropped
// (newer batches, or a switch to small batches), glibc returns the freed
// pages to the system (the indexer's malloc_trim after a backlog, or glibc's
// own heap trimming), and the next large batches fault every page of their
// copy in again: 8-9 page faults and ~30 us of system time per 63 KB batch,
// a quarter of the relay's CPU per batch (BENCHMARKS.md). A payload taken
// from here is a buffer of a size class; when its last reference goes (the
// replay ring dropped it, the PUB socket sent it), the buffer comes back
// here and the next payload of that class is copied into memory that is
// already mapped.
//
// Bounded: a returned buffer is kept only while the pool's buffers, kept
// and in use (held by the replay ring, a PUB queue, a replay stream),
// total at most `max_bytes` (the rank's events.buffer_bytes, the most its
// replay buffer holds anyway); otherwise it is freed. So the pool never
// adds to the replay buffer's peak: it keeps the memory a switch to small
// batches freed, for when large ones come back. Payloads below `min_size` are not pooled
// (glibc's per-thread caches serve them well). Thread-safe: the ingest
// bridge takes, whichever thread drops the last reference gives back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kvs {

class payload_pool : public std::enable_shared_from_this<payload_pool> {
public:
  /// Payloads from this size on are pooled.
  static constexpr size_t default_min_size = 16 << 10;
  /// Size classes per doubling: a buffer is at most 1/16 (6.25%) larger
  /// than the payload it holds.
  static constexpr unsigned classes_per_doubling = 16;

  static std::shared_ptr<payload_pool> make(size_t max_bytes,
                                            size_t min_size = default_min_size);

  /// An empty payload with room for n bytes, to be written once: a pooled
  /// buffer when n is at least min_size (reused if one of its class is
  /// free), else a buffer of its own.
  std::shared_ptr<std::string> take(size_t n);
  /// A payload holding a copy of data[0..n) (take(n), filled).
  std::shared_ptr<const std::string> copy(const void* data, size_t n);

  /// The buffer capacity of n's size class (n itself below min_size).
  size_t class_capacity(size_t n) const;

  /// Bytes of the buffers kept for reuse now.
  size_t kept_bytes() const;
  /// Payloads copied into a reused buffer / into a new one (pooled sizes).
  uint64_t reused() const;
  uint64_t allocated() const;

  payload_pool(size_t max_bytes, size_t min_size);
  payload_pool(const payload_pool&) = delete;
  payload_pool& operator=(const payload_pool&) = delete;
  ~payload_pool();

private:
  struct give_back {
    std::shared_ptr<payload_pool> pool;
    size_t counted; ///< what take() added to live_bytes_ for it
    void operator()(const std::string* s) const;
  };
  size_t class_index(size_t n) const;
  void keep(std::string* s, size_t counted);

  const size_t max_bytes_;
  const size_t min_size_;
  mutable std::mutex mtx_;
  std::vector<std::vector<std::string*>> free_; ///< by class index
  size_t kept_bytes_ = 0;
  size_t live_bytes_ = 0; ///< capacity of the pooled buffers taken and not back yet
  uint64_t reused_ = 0;
  uint64_t allocated_ = 0;
};

using payload_pool_ptr = std::shared_ptr<payload_pool>;

} // namespace kvs
