#include "actors/cache/kv_event_streams.hpp"

#include <vector>

namespace kvs {

kv_event_streams::kv_event_streams(size_t log_size, int64_t incarnation,
                                   std::chrono::nanoseconds idle_timeout, send_fn send)
  : log_(log_size, incarnation), idle_timeout_(idle_timeout), send_(std::move(send)) {}

void kv_event_streams::subscribe(const std::string& identity, std::string uid_frame,
                                 std::string op_frame, const subscribe_kv_events_req& req,
                                 clock::time_point now) {
  if (auto old = subs_.find(req.instance_id); old != subs_.end())
    end(old);
  subscription s;
  s.identity = identity;
  s.uid_frame = std::move(uid_frame);
  s.op_frame = std::move(op_frame);
  s.model = req.model_name;
  s.cursor = static_cast<uint64_t>(req.cursor);
  s.max_events = static_cast<size_t>(req.max_events);
  s.last_seen = now;
  auto it = subs_.emplace(req.instance_id, std::move(s)).first;
  pump_or_end(it);
}

bool kv_event_streams::control(const std::string& identity, std::string_view uid_frame,
                               std::string_view action) {
  for (auto it = subs_.begin(); it != subs_.end(); ++it) {
    auto& s = it->second;
    if (s.identity != identity || s.uid_frame != uid_frame)
      continue;
    if (action == "cancel") {
      end(it);
    } else if (action == "ack") {
      s.credit = true;
      pump_or_end(it);
    }
    return true;
  }
  return false;
}

void kv_event_streams::append(std::vector<kv_event_record> records) {
  for (auto& r : records)
    log_.append(std::move(r));
  for (auto it = subs_.begin(); it != subs_.end();) {
    auto next = std::next(it);
    pump_or_end(it);
    it = next;
  }
}

void kv_event_streams::touch(int64_t instance, clock::time_point now) {
  if (auto it = subs_.find(instance); it != subs_.end())
    it->second.last_seen = now;
}

void kv_event_streams::drop_instance(int64_t instance) {
  if (auto it = subs_.find(instance); it != subs_.end())
    end(it);
}

size_t kv_event_streams::expire(clock::time_point now) {
  if (idle_timeout_.count() == 0)
    return 0;
  size_t n = 0;
  for (auto it = subs_.begin(); it != subs_.end();) {
    auto next = std::next(it);
    if (now - it->second.last_seen > idle_timeout_) {
      end(it);
      ++n;
    }
    it = next;
  }
  return n;
}

bool kv_event_streams::pump_or_end(map_t::iterator it) {
  auto& s = it->second;
  if (!s.credit)
    return true;
  // A disabled channel says so once, then the stream ends (LMCache's read()).
  if (!log_.enabled() && !s.first) {
    end(it);
    return false;
  }
  auto b = log_.read(s.model, s.cursor, s.max_events);
  s.cursor = b.next_cursor;
  if (!(s.first || !b.events.empty() || b.lost || !b.enabled))
    return true;
  s.first = false;
  s.credit = false;
  send_(mp_reply{s.identity, s.uid_frame, s.op_frame, encode_kv_event_batch(b)});
  return true;
}

void kv_event_streams::end(map_t::iterator it) {
  auto& s = it->second;
  send_(mp_reply{s.identity, s.uid_frame, s.op_frame, std::nullopt});
  subs_.erase(it);
}

} // namespace kvs
