#include "l2/l2_quota.hpp"

#include <algorithm>

namespace kvs {

std::vector<std::string> l2_quota_victims(const salt_ledger& usage, const l2_quota_limits& limits,
                                          const l2_quota_rule& rule) {
  std::vector<std::string> out;
  for (auto& [salt, bytes] : usage.bytes_by_salt()) {
    if (bytes == 0)
      continue;
    auto it = limits.find(salt);
    const uint64_t limit = it == limits.end() ? 0 : it->second; // QuotaManager.get_limit_bytes
    if (static_cast<double>(bytes) < rule.watermark * static_cast<double>(limit))
      continue;
    // IsolatedLRUEvictionPolicy.get_eviction_actions(ratio, cache_salt=salt)
    const double ratio = std::clamp(limit == 0 ? 1.0 : rule.ratio, 0.0, 1.0);
    const size_t pool = usage.objects(salt);
    auto target = static_cast<size_t>(static_cast<double>(pool) * ratio);
    if (ratio > 0 && target == 0)
      target = 1;
    for (auto& name : usage.oldest(salt, target))
      out.push_back(name);
  }
  return out;
}

} // namespace kvs
