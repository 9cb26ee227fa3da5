// L2 quotas as LMCache 0.5.6 has them (l2.quota_mode = "isolated"):
// QuotaManager's per-cache_salt byte limits, read by the
// L2EvictionController's per-salt pass with the IsolatedLRU policy, once a
// second, for each L2 adapter on its own:
//
//   for every salt holding bytes in the adapter:
//     limit = the salt's limit, 0 when it has none (the allowlist rule:
//             only registered salts keep data)
//     if bytes >= watermark * limit:
//       evict int(objects * ratio) of the salt's own least recently used
//       objects (at least one), ratio = 1 when limit is 0, else the
//       eviction ratio
//
// Quotas are soft: a write is never refused; an over-budget salt loses its
// oldest objects on the next pass, never another salt's.
//
// Pure: the L2 actor runs the pass and erases the victims.
#pragma once

#include "l2/salt_ledger.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kvs {

struct l2_quota_rule {
  double watermark = 0.8; ///< LMCache's eviction trigger_watermark
  double ratio = 0.2;     ///< LMCache's eviction_ratio
};

using l2_quota_limits = std::map<std::string, uint64_t, std::less<>>;

/// One pass over one backend's usage: the objects to erase, each salt's
/// oldest first.
std::vector<std::string> l2_quota_victims(const salt_ledger& usage, const l2_quota_limits& limits,
                                          const l2_quota_rule& rule);

} // namespace kvs
