#include "events_wire/kv_event_payload_pool.hpp"

#include <algorithm>

namespace kvs {

namespace {

unsigned log2_floor(size_t n) {
  return static_cast<unsigned>(63 - __builtin_clzll(static_cast<unsigned long long>(n)));
}

} // namespace

std::shared_ptr<payload_pool> payload_pool::make(size_t max_bytes, size_t min_size) {
  return std::make_shared<payload_pool>(max_bytes, min_size);
}

payload_pool::payload_pool(size_t max_bytes, size_t min_size)
  : max_bytes_(max_bytes), min_size_(std::max<size_t>(min_size, 2 * classes_per_doubling)) {}

payload_pool::~payload_pool() {
  for (auto& list : free_)
    for (auto* s : list)
      delete s;
}

size_t payload_pool::class_index(size_t n) const {
  // Classes of min_size's doubling and up, classes_per_doubling each.
  const unsigned e = log2_floor(n);
  const size_t step = size_t{1} << (e - 4);
  const size_t mantissa = (n + step - 1) / step; // 16..32; 32 is the next doubling's first
  return (e - log2_floor(min_size_)) * classes_per_doubling + (mantissa - classes_per_doubling);
}

size_t payload_pool::class_capacity(size_t n) const {
  if (n < min_size_)
    return n;
  const size_t step = size_t{1} << (log2_floor(n) - 4);
  return (n + step - 1) / step * step;
}

std::shared_ptr<std::string> payload_pool::take(size_t n) {
  if (n < min_size_) {
    auto s = std::make_shared<std::string>();
    s->reserve(n);
    return s;
  }
  std::string* s = nullptr;
  size_t counted = 0;
  {
    const size_t c = class_index(n);
    std::lock_guard<std::mutex> lock{mtx_};
    // Its own class, else the next (at most two steps, 12.5%, larger).
    for (size_t i = c; i < c + 2 && i < free_.size() && !s; ++i)
      if (!free_[i].empty()) {
        s = free_[i].back();
        free_[i].pop_back();
        kept_bytes_ -= s->capacity();
        ++reused_;
      }
    if (!s)
      ++allocated_;
    // Its own capacity (a buffer of the next class is larger than n's);
    // keep() takes back exactly this, whatever the writer did to it since.
    counted = s ? s->capacity() : class_capacity(n);
    live_bytes_ += counted;
  }
  if (s) {
    s->clear();
  } else {
    s = new std::string;
    s->reserve(class_capacity(n));
  }
  return std::shared_ptr<std::string>(s, give_back{shared_from_this(), counted});
}

std::shared_ptr<const std::string> payload_pool::copy(const void* data, size_t n) {
  auto s = take(n);
  s->assign(static_cast<const char*>(data), n);
  return s;
}

void payload_pool::give_back::operator()(const std::string* s) const {
  pool->keep(const_cast<std::string*>(s), counted);
}

void payload_pool::keep(std::string* s, size_t counted) {
  const size_t cap = s->capacity();
  // Only whole classes: a buffer's capacity is its class's (take()).
  const bool whole = cap >= min_size_ && class_capacity(cap) == cap;
  {
    std::lock_guard<std::mutex> lock{mtx_};
    live_bytes_ -= counted;
    // Kept only while kept + in use stays within the bound: the pool never
    // adds to what the replay buffer may hold, it only stops the memory
    // from going back and forth.
    if (whole && kept_bytes_ + live_bytes_ + cap <= max_bytes_) {
      const size_t c = class_index(cap);
      if (free_.size() <= c)
        free_.resize(c + 1);
      free_[c].push_back(s);
      kept_bytes_ += cap;
      return;
    }
  }
  delete s;
}

size_t payload_pool::kept_bytes() const {
  std::lock_guard<std::mutex> lock{mtx_};
  return kept_bytes_;
}

uint64_t payload_pool::reused() const {
  std::lock_guard<std::mutex> lock{mtx_};
  return reused_;
}

uint64_t payload_pool::allocated() const {
  std::lock_guard<std::mutex> lock{mtx_};
  return allocated_;
}

} // namespace kvs
