// salt_quota: L1 bytes per cache_salt (tenant), the per-salt byte limits set
// by the HTTP API (PUT /quota/{salt}) and [cache.quotas], and which of a
// salt's own chunks go when it is over its limit.
//
// Exact accounting: the store reports every chunk it commits (with the salt
// of the request that stored it and its bytes) and every chunk that leaves
// L1 (evicted, cleared, deleted); usage is the sum of a salt's committed
// chunks. Chunks of one salt are kept in an order of their own, least
// recently used first (a commit or a touch moves one to the back).
//
// Limits follow LMCache's quota API (its IsolatedLRU eviction policy):
// soft -- a write is never refused; a salt over its limit loses its own
// oldest chunks right after the commit that put it over (never another
// salt's). With `isolated`, once any quota exists a salt without one has
// limit 0 (LMCache's allowlist rule: its chunks go at once); without
// `isolated` (the default) limits are recorded and reported, never enforced.
//
// Single-threaded (the store actor's); pure, no CAF.
#pragma once

#include "cache/chunk_index.hpp"

#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvs {

/// At most this many salts have a limit (a PUT past it is refused).
inline constexpr size_t salt_quota_max_limits = 4096;

struct salt_usage {
  std::string salt;
  uint64_t bytes = 0;
  uint64_t chunks = 0;
  std::optional<uint64_t> limit; ///< the salt's own limit, if set
};

class salt_quota {
public:
  explicit salt_quota(bool isolated = false) : isolated_(isolated) {}

  bool isolated() const {
    return isolated_;
  }

  // --- accounting ------------------------------------------------------------
  /// `k` entered L1 under `salt` with `bytes` (a re-commit replaces the old record).
  void committed(chunk_key k, std::string_view salt, uint64_t bytes);
  /// `k` left L1 (no-op for a key never committed here).
  void removed(chunk_key k);
  /// The salt `k` was committed under (null: not committed here).
  const std::string* salt_of(chunk_key k) const;
  /// `k` was used: it goes to the back of its salt's order.
  void touched(chunk_key k);

  // --- limits ----------------------------------------------------------------
  /// False when salt_quota_max_limits salts have one already (and `salt` not).
  bool set_limit(std::string_view salt, uint64_t bytes);
  /// True when the salt had a limit.
  bool remove_limit(std::string_view salt);
  std::optional<uint64_t> limit(std::string_view salt) const;
  /// What is enforced for `salt`: its limit; 0 when isolated and other
  /// salts have limits (allowlist); nullopt (none) otherwise.
  std::optional<uint64_t> enforced_limit(std::string_view salt) const;

  /// The salt's chunks to evict, oldest first, to bring it at or under its
  /// enforced limit (empty when under it or nothing is enforced). The
  /// caller evicts those it can (a read-locked chunk stays) and reports
  /// each with removed().
  std::vector<chunk_key> over_limit(std::string_view salt) const;

  // --- observation -----------------------------------------------------------
  salt_usage usage(std::string_view salt) const;
  /// Every salt with a limit, in the order their limits were first set
  /// (LMCache's quota list order).
  std::vector<salt_usage> limited() const;
  /// Up to `n` salts by bytes (largest first), then everything else summed
  /// under `others` (for metrics with a bounded label set).
  std::vector<salt_usage> top(size_t n, salt_usage& others) const;
  size_t salts() const {
    return ids_.size();
  }
  size_t chunks() const {
    return chunks_.size();
  }
  uint64_t bytes() const {
    return bytes_;
  }

private:
  struct key_hash {
    size_t operator()(const chunk_key& k) const {
      return std::hash<uint64_t>{}(k.hash * 0x9E3779B97F4A7C15ull + static_cast<uint32_t>(k.rank));
    }
  };
  struct bucket {
    std::string salt;
    uint64_t bytes = 0;
    std::list<chunk_key> order; ///< least recently used first
    bool live = false;
  };
  struct record {
    uint32_t salt = 0;
    uint64_t bytes = 0;
    std::list<chunk_key>::iterator at;
  };

  uint32_t bucket_of(std::string_view salt);
  void maybe_free(uint32_t id);

  bool isolated_;
  std::unordered_map<chunk_key, record, key_hash> chunks_;
  std::vector<bucket> buckets_;
  std::vector<uint32_t> free_;
  std::unordered_map<std::string, uint32_t> ids_;
  struct limit_entry {
    uint64_t bytes = 0;
    uint64_t order = 0; ///< when first set
  };
  std::map<std::string, limit_entry, std::less<>> limits_;
  uint64_t next_order_ = 0;
  uint64_t bytes_ = 0;
};

} // namespace kvs
