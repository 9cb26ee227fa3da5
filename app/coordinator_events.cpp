#include "app/coordinator_events.hpp"

#include "app/http_client.hpp"
#include "log/log.hpp"
#include "http/json_text.hpp"

#include <ctime>

namespace kvs {

namespace {
constexpr std::chrono::milliseconds post_timeout{2000}; // LMCache's HttpCacheEventSink
/// Events one POST carries at most: a backlog is sent in several.
constexpr size_t max_events_per_post = 4096;

std::string hex(const std::string& raw) {
  static const char* d = "0123456789abcdef";
  std::string s;
  s.reserve(raw.size() * 2);
  for (unsigned char c : raw) {
    s.push_back(d[c >> 4]);
    s.push_back(d[c & 15]);
  }
  return s;
}
} // namespace

coordinator_events::coordinator_events(std::string url, std::string instance_id,
                                       std::chrono::milliseconds flush_interval,
                                       size_t queue_max, std::vector<declared_capacity> capacity,
                                       std::string me)
  : url_(std::move(url)), me_(std::move(me)), interval_(flush_interval), queue_max_(queue_max),
    incarnation_(static_cast<int64_t>(std::time(nullptr))), capacity_(std::move(capacity)),
    id_(std::move(instance_id)) {
  while (!url_.empty() && url_.back() == '/')
    url_.pop_back();
  thread_ = std::thread([this] { run(); });
}

coordinator_events::~coordinator_events() {
  {
    std::lock_guard<std::mutex> lock{mu_};
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void coordinator_events::offer(cache_event e) {
  {
    std::lock_guard<std::mutex> lock{mu_};
    if (queue_.size() >= queue_max_) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    queue_.push_back(std::move(e));
  }
  queued_.fetch_add(1, std::memory_order_relaxed);
}

cache_event_sink::figures coordinator_events::read() const {
  figures f;
  f.queued = queued_.load(std::memory_order_relaxed);
  f.dropped = dropped_.load(std::memory_order_relaxed);
  f.posted = posted_.load(std::memory_order_relaxed);
  f.batches = batches_.load(std::memory_order_relaxed);
  f.failed_posts = failed_.load(std::memory_order_relaxed);
  f.lost = lost_.load(std::memory_order_relaxed);
  return f;
}

void coordinator_events::set_instance_id(const std::string& id) {
  std::lock_guard<std::mutex> lock{mu_};
  if (left_)
    return;
  id_ = id;
  declare_ = true;
}

void coordinator_events::leave() {
  flush();
  std::lock_guard<std::mutex> lock{mu_};
  left_ = true;
  id_.clear();
}

std::string coordinator_events::encode_capacity(const std::vector<declared_capacity>& capacity,
                                                const std::string& id, int64_t incarnation,
                                                uint64_t seq_after, uint64_t revision, double ts) {
  std::string out;
  uint64_t n = 0;
  for (auto& m : capacity) {
    json_writer w;
    w.begin_object()
      .str("instance_id", id)
      .integer("incarnation", static_cast<uint64_t>(incarnation))
      .integer("seq", seq_after + ++n)
      .str("event_type", "config")
      .str("tier", m.l1 ? "l1" : "l2")
      .str("backend", m.backend)
      .boolean("shared", m.shared)
      .num("ts", ts)
      .integer("capacity_bytes", m.bytes)
      .integer("capacity_revision", revision)
      .end_object();
    out += (out.empty() ? "" : ",") + w.take();
  }
  return out;
}

std::string coordinator_events::encode(const std::vector<cache_event>& events,
                                       const std::string& id, int64_t incarnation,
                                       uint64_t seq_after, double ts, uint64_t* batches_out) {
  json_writer w;
  w.begin_object().begin_array("batches");
  uint64_t n = 0;
  for (size_t i = 0; i < events.size();) {
    const auto& first = events[i];
    w.begin_object()
      .str("instance_id", id)
      .integer("incarnation", static_cast<uint64_t>(incarnation))
      .integer("seq", seq_after + ++n)
      .str("event_type", first.kind == cache_event_kind::store    ? "store"
                         : first.kind == cache_event_kind::remove ? "delete"
                                                                  : "access")
      .str("tier", first.l1 ? "l1" : "l2")
      .str("backend", first.backend)
      .boolean("shared", first.shared)
      .num("ts", ts)
      .begin_array("entries");
    // A batch: the run of events of one type on one backend (LMCache's
    // CacheEventSubscriber._record joins consecutive ones the same way).
    for (; i < events.size() && events[i].kind == first.kind && events[i].l1 == first.l1
           && events[i].backend == first.backend && events[i].shared == first.shared;
         ++i) {
      const auto& e = events[i];
      w.begin_object()
        .begin_object("key")
        .str("chunk_hash_hex", hex(e.key.chunk_hash))
        .str("model_name", e.key.model)
        .integer("kv_rank", e.key.kv_rank)
        .integer("object_group_id", e.key.group)
        .str("cache_salt", e.key.salt)
        .end_object()
        .integer("size_bytes", e.kind == cache_event_kind::store ? e.size_bytes : 0)
        .end_object();
    }
    w.end_array().end_object();
  }
  w.end_array().end_object();
  *batches_out = n;
  return w.take();
}

void coordinator_events::run() {
  std::unique_lock<std::mutex> lock{mu_};
  while (!stop_) {
    cv_.wait_for(lock, interval_, [this] { return stop_; });
    lock.unlock();
    flush();
    lock.lock();
  }
}

void coordinator_events::flush() {
  std::lock_guard<std::mutex> posting{post_mu_};
  for (;;) {
    std::vector<cache_event> events;
    std::string id;
    bool declare = false;
    {
      std::lock_guard<std::mutex> lock{mu_};
      if (id_.empty() || (queue_.empty() && !declare_))
        return; // not registered yet: the events wait (bounded by queue_max)
      id = id_;
      declare = declare_ && !capacity_.empty();
      declare_ = false;
      size_t n = std::min(queue_.size(), max_events_per_post);
      events.assign(std::make_move_iterator(queue_.begin()),
                    std::make_move_iterator(queue_.begin() + static_cast<ptrdiff_t>(n)));
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<ptrdiff_t>(n));
    }
    uint64_t batches = 0;
    auto ts = std::chrono::duration<double>(
                std::chrono::system_clock::now().time_since_epoch()).count();
    // The declaration first, so the coordinator has the denominator before
    // the bytes it divides (LMCache's flush orders them the same way).
    std::string config;
    if (declare) {
      config = encode_capacity(capacity_, id, incarnation_, seq_, ++revision_, ts);
      seq_ += capacity_.size();
    }
    auto body = encode(events, id, incarnation_, seq_, ts, &batches);
    if (!config.empty()) {
      const std::string open = "{\"batches\":[";
      body.insert(open.size(), config + (events.empty() ? "" : ","));
    }
    // The seq numbers are spent whether or not the POST lands (LMCache's
    // subscriber too): a lost POST shows as a gap at the coordinator.
    seq_ += batches;
    auto r = http_call(url_, "POST", "/events", body, post_timeout);
    std::string why;
    if (!r)
      why = "POST /events failed: " + r.error_value().detail;
    else if (r.value().status / 100 != 2)
      why = "POST " + url_ + "/events: HTTP " + std::to_string(r.value().status) + " -- "
            + printable_excerpt(r.value().body);
    if (!why.empty()) {
      failed_.fetch_add(1, std::memory_order_relaxed);
      if (declare) { // a declaration is the whole topology: sent again next time
        std::lock_guard<std::mutex> lock{mu_};
        declare_ = true;
      }
      lost_.fetch_add(events.size(), std::memory_order_relaxed);
      if (failures_.failed(why))
        KVS_WARN(me_, "coordinator: {} ({} cache events dropped; logged again when it changes)",
                 why, events.size());
      return;
    }
    if (failures_.succeeded())
      KVS_INFO(me_, "coordinator: cache events delivered again");
    posted_.fetch_add(events.size(), std::memory_order_relaxed);
    batches_.fetch_add(batches, std::memory_order_relaxed);
  }
}

} // namespace kvs
