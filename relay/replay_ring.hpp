// replay_ring: the last N encoded batches of one rank, by sequence number.
//
// Pure data structure (no CAF), owned by the replay actor. Sequence numbers
// are consecutive (the publisher assigns them), so a lookup by seq is index
// arithmetic.
#pragma once

#include "messages/encoded_batch.hpp"

#include <cstddef>
#include <vector>

namespace kvs {

class replay_ring {
public:
  /// Keeps at most `capacity` batches and, when `max_bytes` > 0, at most
  /// that many payload bytes (always at least the newest batch).
  explicit replay_ring(size_t capacity, size_t max_bytes = 0)
    : slots_(capacity), max_bytes_(max_bytes) {}

  size_t capacity() const {
    return slots_.size();
  }
  size_t size() const {
    return size_;
  }
  bool empty() const {
    return size_ == 0;
  }
  /// Payload bytes kept.
  size_t bytes() const {
    return bytes_;
  }
  uint64_t oldest_seq() const {
    return at(0).seq;
  }
  uint64_t newest_seq() const {
    return at(size_ - 1).seq;
  }

  /// Keeps `b`, dropping the oldest batch when full. A seq that does not
  /// follow the newest (publisher restarted) resets the ring.
  void push(encoded_batch b) {
    if (slots_.empty())
      return;
    if (size_ > 0 && b.seq != newest_seq() + 1)
      clear();
    auto n = b.payload ? b.payload->size() : 0;
    if (size_ == slots_.size())
      drop_oldest();
    while (max_bytes_ > 0 && size_ > 0 && bytes_ + n > max_bytes_)
      drop_oldest();
    slots_[(head_ + size_) % slots_.size()] = std::move(b);
    ++size_;
    bytes_ += n;
  }

  void clear() {
    for (auto& s : slots_)
      s = encoded_batch{};
    head_ = size_ = 0;
    bytes_ = 0;
  }

  /// Kept batches with start <= seq <= last, oldest first, at most `max`
  /// (0: no bound). A start older than the oldest kept batch starts at the
  /// oldest; one beyond the newest (or past `last`) yields nothing.
  std::vector<encoded_batch> from(uint64_t start, uint64_t last = ~uint64_t{0},
                                  size_t max = 0) const {
    std::vector<encoded_batch> out;
    if (size_ == 0 || start > newest_seq() || start > last)
      return out;
    size_t first = start <= oldest_seq() ? 0 : static_cast<size_t>(start - oldest_seq());
    if (last < oldest_seq())
      return out;
    size_t end = last >= newest_seq() ? size_ : static_cast<size_t>(last - oldest_seq()) + 1;
    if (max > 0 && end - first > max)
      end = first + max;
    out.reserve(end - first);
    for (size_t i = first; i < end; ++i)
      out.push_back(at(i));
    return out;
  }

private:
  void drop_oldest() {
    auto& s = slots_[head_];
    bytes_ -= s.payload ? s.payload->size() : 0;
    s = encoded_batch{};
    head_ = (head_ + 1) % slots_.size();
    --size_;
  }

  const encoded_batch& at(size_t i) const {
    return slots_[(head_ + i) % slots_.size()];
  }

  std::vector<encoded_batch> slots_;
  size_t max_bytes_ = 0;
  size_t head_ = 0;
  size_t size_ = 0;
  size_t bytes_ = 0;
};

} // namespace kvs
