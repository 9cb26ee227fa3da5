#include "cache/kv_event_log.hpp"

#include <algorithm>

namespace kvs {

kv_event_log::kv_event_log(size_t capacity, int64_t incarnation)
  : capacity_(capacity), incarnation_(incarnation) {}

void kv_event_log::append(kv_event_record r) {
  if (!enabled())
    return;
  r.seq = next_seq_++;
  log_.push_back(std::move(r));
  while (log_.size() > capacity_)
    log_.pop_front();
}

kv_event_batch_out kv_event_log::read(const std::string& model, uint64_t cursor,
                                      size_t max_events) const {
  kv_event_batch_out out;
  out.enabled = enabled();
  out.incarnation = incarnation_;
  if (!enabled() || max_events == 0)
    return out;
  const uint64_t last = last_seq();
  const uint64_t first = log_.empty() ? last + 1 : log_.front().seq;
  out.lost = cursor + 1 < first || cursor > last;
  out.next_cursor = std::min(cursor, last);
  size_t skip = cursor + 1 > first ? static_cast<size_t>(cursor + 1 - first) : 0;
  for (size_t i = skip; i < log_.size(); ++i) {
    const auto& r = log_[i];
    out.next_cursor = r.seq;
    if (r.model_name == model) {
      out.events.push_back(&r);
      if (out.events.size() == max_events)
        break;
    }
  }
  return out;
}

} // namespace kvs
