#include "l2/salt_ledger.hpp"

namespace kvs {

void salt_ledger::added(const std::string& name, std::string_view salt, uint64_t bytes) {
  removed(name);
  auto& order = order_[std::string(salt)];
  order.push_back(name);
  at_.emplace(name, record{l2_listed{name, std::string(salt), bytes}, std::prev(order.end())});
  bytes_[std::string(salt)] += bytes;
}

void salt_ledger::removed(const std::string& name) {
  auto it = at_.find(name);
  if (it == at_.end())
    return;
  const auto& salt = it->second.what.salt;
  auto o = order_.find(salt);
  o->second.erase(it->second.at);
  if (o->second.empty())
    order_.erase(o);
  auto b = bytes_.find(salt);
  if (b->second <= it->second.what.bytes)
    bytes_.erase(b); // a bucket at zero is dropped, as LMCache's
  else
    b->second -= it->second.what.bytes;
  at_.erase(it);
}

void salt_ledger::touched(const std::string& name) {
  auto it = at_.find(name);
  if (it == at_.end())
    return;
  auto& order = order_.find(it->second.what.salt)->second;
  order.splice(order.end(), order, it->second.at);
}

uint64_t salt_ledger::bytes(std::string_view salt) const {
  auto it = bytes_.find(salt);
  return it == bytes_.end() ? 0 : it->second;
}

std::vector<std::string> salt_ledger::oldest(std::string_view salt, size_t n) const {
  std::vector<std::string> out;
  auto o = order_.find(salt);
  if (o == order_.end())
    return out;
  for (auto it = o->second.begin(); it != o->second.end() && out.size() < n; ++it)
    out.push_back(*it);
  return out;
}

size_t salt_ledger::objects(std::string_view salt) const {
  auto o = order_.find(salt);
  return o == order_.end() ? 0 : o->second.size();
}

const l2_listed* salt_ledger::find(const std::string& name) const {
  auto it = at_.find(name);
  return it == at_.end() ? nullptr : &it->second.what;
}

std::vector<l2_listed> salt_ledger::page(uint64_t offset, uint64_t limit) const {
  std::vector<l2_listed> out;
  uint64_t i = 0;
  for (auto& [salt, names] : order_)
    for (auto& n : names) {
      if (out.size() >= limit)
        return out;
      if (i++ >= offset)
        out.push_back(at_.find(n)->second.what);
    }
  return out;
}

} // namespace kvs
