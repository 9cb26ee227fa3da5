#include "cache/salt_quota.hpp"

#include <algorithm>

namespace kvs {

uint32_t salt_quota::bucket_of(std::string_view salt) {
  if (auto i = ids_.find(std::string{salt}); i != ids_.end())
    return i->second;
  uint32_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = static_cast<uint32_t>(buckets_.size());
    buckets_.emplace_back();
  }
  auto& b = buckets_[id];
  b.salt = std::string{salt};
  b.bytes = 0;
  b.live = true;
  ids_.emplace(b.salt, id);
  return id;
}

/// A salt's bucket lives while it has chunks: client-chosen salts come and
/// go, and only those with chunks in L1 may cost memory here.
void salt_quota::maybe_free(uint32_t id) {
  auto& b = buckets_[id];
  if (!b.order.empty())
    return;
  ids_.erase(b.salt);
  b.salt.clear();
  b.salt.shrink_to_fit();
  b.live = false;
  free_.push_back(id);
}

void salt_quota::committed(chunk_key k, std::string_view salt, uint64_t bytes) {
  removed(k);
  auto id = bucket_of(salt);
  auto& b = buckets_[id];
  b.order.push_back(k);
  b.bytes += bytes;
  bytes_ += bytes;
  chunks_.emplace(k, record{id, bytes, std::prev(b.order.end())});
}

const std::string* salt_quota::salt_of(chunk_key k) const {
  auto i = chunks_.find(k);
  return i == chunks_.end() ? nullptr : &buckets_[i->second.salt].salt;
}

void salt_quota::removed(chunk_key k) {
  auto i = chunks_.find(k);
  if (i == chunks_.end())
    return;
  auto& b = buckets_[i->second.salt];
  b.bytes -= i->second.bytes;
  bytes_ -= i->second.bytes;
  b.order.erase(i->second.at);
  auto id = i->second.salt;
  chunks_.erase(i);
  maybe_free(id);
}

void salt_quota::touched(chunk_key k) {
  auto i = chunks_.find(k);
  if (i == chunks_.end())
    return;
  auto& b = buckets_[i->second.salt];
  b.order.splice(b.order.end(), b.order, i->second.at);
}

bool salt_quota::set_limit(std::string_view salt, uint64_t bytes) {
  auto i = limits_.find(salt);
  if (i != limits_.end()) {
    i->second.bytes = bytes;
    return true;
  }
  if (limits_.size() >= salt_quota_max_limits)
    return false;
  limits_.emplace(std::string{salt}, limit_entry{bytes, next_order_++});
  return true;
}

bool salt_quota::remove_limit(std::string_view salt) {
  auto i = limits_.find(salt);
  if (i == limits_.end())
    return false;
  limits_.erase(i);
  return true;
}

std::optional<uint64_t> salt_quota::limit(std::string_view salt) const {
  auto i = limits_.find(salt);
  if (i == limits_.end())
    return std::nullopt;
  return i->second.bytes;
}

std::optional<uint64_t> salt_quota::enforced_limit(std::string_view salt) const {
  if (!isolated_)
    return std::nullopt;
  if (auto l = limit(salt))
    return l;
  if (limits_.empty())
    return std::nullopt; // quotas not in use: nothing enforced
  return 0;
}

std::vector<chunk_key> salt_quota::over_limit(std::string_view salt) const {
  std::vector<chunk_key> out;
  auto lim = enforced_limit(salt);
  auto i = ids_.find(std::string{salt});
  if (!lim || i == ids_.end())
    return out;
  const auto& b = buckets_[i->second];
  uint64_t used = b.bytes;
  for (auto it = b.order.begin(); it != b.order.end() && used > *lim; ++it) {
    out.push_back(*it);
    used -= chunks_.at(*it).bytes;
  }
  return out;
}

salt_usage salt_quota::usage(std::string_view salt) const {
  salt_usage u;
  u.salt = std::string{salt};
  u.limit = limit(salt);
  if (auto i = ids_.find(u.salt); i != ids_.end()) {
    u.bytes = buckets_[i->second].bytes;
    u.chunks = buckets_[i->second].order.size();
  }
  return u;
}

std::vector<salt_usage> salt_quota::limited() const {
  std::vector<std::pair<uint64_t, const std::string*>> order;
  for (auto& [salt, lim] : limits_)
    order.emplace_back(lim.order, &salt);
  std::sort(order.begin(), order.end());
  std::vector<salt_usage> out;
  for (auto& [when, salt] : order)
    out.push_back(usage(*salt));
  return out;
}

std::vector<salt_usage> salt_quota::top(size_t n, salt_usage& others) const {
  std::vector<salt_usage> all;
  for (auto& [salt, id] : ids_)
    all.push_back(usage(salt));
  std::sort(all.begin(), all.end(), [](auto& a, auto& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.salt < b.salt;
  });
  others = salt_usage{};
  for (size_t i = n; i < all.size(); ++i) {
    others.bytes += all[i].bytes;
    others.chunks += all[i].chunks;
  }
  if (all.size() > n)
    all.resize(n);
  return all;
}

} // namespace kvs
