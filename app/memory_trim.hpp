// memory_trim: gives the allocator's retained free memory back to the system.
//
// Measured (issue #35): after thousands of short-lived clients, glibc keeps
// the freed memory of the ZeroMQ I/O thread's and the bridges' arenas (16-40
// MiB free in one arena for < 1 MiB in use; up to ~180 MiB in a noisy run),
// so RSS stays at the flood's peak although nothing holds it. glibc trims a
// thread arena only from its top, which a few long-lived allocations pin.
// The sidecar's main thread checks once a second: when RSS grew by
// `threshold` since the last trim and the allocator holds at least that much
// free, malloc_trim(0) releases the free pages of every arena.
#pragma once

#include <cstdint>
#include <string>

namespace kvs {

class memory_trimmer {
public:
  explicit memory_trimmer(uint64_t threshold_bytes, std::string label);
  /// One check (call about once a second); trims when due. Returns the
  /// bytes RSS shrank by when it trimmed, else 0.
  uint64_t tick();
  uint64_t trims() const { return trims_; }

private:
  uint64_t threshold_;
  std::string label_;
  uint64_t rss_after_last_ = 0;
  uint64_t trims_ = 0;
};

} // namespace kvs
