// L1 placements for the LMCache fleet coordinator ([coordinator]
// event_reporting): what LMCache's CacheEventSubscriber reports of its L1
// (lmcache.v1.mp_coordinator.cache_events: L1_WRITE_FINISHED -> "store" on
// tier l1, backend "dram", with the size; L1_KEYS_EVICTED -> "delete";
// L1_KEYS_ACCESSED -> "access" on tier l1, backend "") under LMCache's
// ObjectKey.
//
// kvsidecar's L1 is keyed by its own 64-bit hash; LMCache's key of a chunk
// (the BLAKE3 chain hash the session computes for l2.format = "lmcache")
// exists only while its STORE finishes. So the store keeps that key per
// chunk it reported (store_l1_keys, only while reporting) and reports the
// removal -- eviction, clear, delete, quota -- and reads under it. A chunk
// stored without an LMCache key (a token outside uint32, a model or salt
// LMCache cannot name) is not reported, as it never reaches L2 either.
// Offering never blocks: the sink drops past its bound (counted).
#pragma once

#include "cache/chunk_index.hpp"
#include "core/cache_event_sink.hpp"

#include <memory>
#include <string>
#include <unordered_map>

namespace kvs {

class store_l1_keys {
public:
  explicit store_l1_keys(std::shared_ptr<cache_event_sink> sink) : sink_(std::move(sink)) {}

  bool reporting() const { return sink_ != nullptr; }
  /// A chunk committed to L1 under LMCache's key `lmcache_hash` ("": none).
  void stored(const chunk_key& k, const std::string& model, const std::string& salt,
              int32_t world_size, uint32_t group, const std::string& lmcache_hash, uint64_t bytes);
  /// A chunk left L1 (any way).
  void removed(const chunk_key& k);
  /// A chunk read from L1.
  void read(const chunk_key& k);
  size_t size() const { return keys_.size(); }

private:
  struct key_hash {
    size_t operator()(const chunk_key& k) const {
      return std::hash<uint64_t>{}(k.hash ^ (static_cast<uint64_t>(k.rank) << 56));
    }
  };
  void offer(cache_event_kind kind, const object_key_fields& key, uint64_t bytes);

  std::shared_ptr<cache_event_sink> sink_;
  std::unordered_map<chunk_key, object_key_fields, key_hash> keys_;
};

} // namespace kvs
