#include "app/memory_trim.hpp"

#include "log/log.hpp"
#include "metrics/process_stats.hpp"

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace kvs {

memory_trimmer::memory_trimmer(uint64_t threshold_bytes, std::string label)
  : threshold_(threshold_bytes), label_(std::move(label)), rss_after_last_(resident_bytes()) {}

uint64_t memory_trimmer::tick() {
#ifdef __GLIBC__
  const uint64_t rss = resident_bytes();
  if (rss < rss_after_last_ + threshold_) {
    // Shrunk meanwhile (a component trimmed, L1 pages given back): the
    // baseline follows it down.
    if (rss < rss_after_last_)
      rss_after_last_ = rss;
    return 0;
  }
  auto mi = mallinfo2();
  // Free bytes the allocator keeps: free chunks in the arenas, including
  // pages already given back by an earlier trim (so RSS decides above).
  if (mi.fordblks < threshold_)
    return 0;
  malloc_trim(0);
  ++trims_;
  const uint64_t after = resident_bytes();
  rss_after_last_ = after;
  const uint64_t gone = rss > after ? rss - after : 0;
  KVS_INFO(label_, "gave {} MiB of freed memory back to the system (RSS {} -> {} MiB; trim #{})",
           gone >> 20, rss >> 20, after >> 20, trims_);
  return gone;
#else
  return 0;
#endif
}

} // namespace kvs
