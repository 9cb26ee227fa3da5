#include "actors/cache/store_coordinator.hpp"

#include "l2/lmcache_object_name.hpp"

namespace kvs {

void store_l1_keys::offer(cache_event_kind kind, const object_key_fields& key, uint64_t bytes) {
  cache_event e;
  e.kind = kind;
  e.l1 = true;
  // LMCache: placements name the L1 medium; an access names none.
  e.backend = kind == cache_event_kind::access ? "" : "dram";
  e.key = key;
  e.size_bytes = bytes;
  sink_->offer(std::move(e));
}

void store_l1_keys::stored(const chunk_key& k, const std::string& model, const std::string& salt,
                           int32_t world_size, uint32_t group, const std::string& lmcache_hash,
                           uint64_t bytes) {
  if (!sink_ || lmcache_hash.empty() || !lmcache_nameable(model, salt))
    return;
  object_key_fields f{model, lmcache_kv_rank(world_size, k.rank), group, lmcache_hash, salt};
  offer(cache_event_kind::store, f, bytes);
  keys_[k] = std::move(f);
}

void store_l1_keys::removed(const chunk_key& k) {
  if (!sink_)
    return;
  auto i = keys_.find(k);
  if (i == keys_.end())
    return;
  offer(cache_event_kind::remove, i->second, 0);
  keys_.erase(i);
}

void store_l1_keys::read(const chunk_key& k) {
  if (!sink_)
    return;
  if (auto i = keys_.find(k); i != keys_.end())
    offer(cache_event_kind::access, i->second, 0);
}

} // namespace kvs
