// One L2 backend: where the L2 actor (actors/cache/l2_tier.hpp) keeps
// chunk shards behind L1. Every backend answers the same calls -- put, get,
// contains, erase, clear, list, usage by cache_salt, its figures, its
// medium and whether every node shares it -- so the actor loops over its
// backends and never asks which one it holds.
//
// Implementations: l2/lru_folder (a node-local folder, kvsidecar's or
// LMCache's file layout by its l2_naming) and l2/redis_backend (Redis,
// standalone or Cluster). A new backend is its own files, one config
// section and one line in app/l2_backends.cpp.
//
// Usage by salt (LMCache's AdapterUsage.bytes_by_cache_salt): each backend
// counts the bytes it holds per cache_salt as objects are written, erased,
// evicted and found at start-up, and keeps each salt's objects least
// recently used first -- what the L2 quotas (IsolatedLRU) evict from.
//
// Single-threaded (the L2 actor owns every backend).
#pragma once

#include "core/object_key.hpp"
#include "l2/salt_ledger.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvs {

/// One L2 object (a chunk's shard on one rank) before a backend names it.
/// The views point into the message being served.
struct l2_key {
  uint64_t hash = 0;        ///< kvsidecar's chunk hash
  int32_t rank = 0;         ///< TP rank of the shard
  uint64_t fingerprint = 0; ///< l2_model_fingerprint(model, salt)
  uint64_t layout = 0;      ///< the payload's length (the store's slot size)
  std::string_view model, salt;
  std::string_view lmcache_hash; ///< LMCache's chunk hash (raw bytes); empty: none
  uint32_t group = 0;
  int32_t world_size = 1;
};

/// What an object's name says (a folder's scan, a removal).
struct l2_name_fields {
  std::string salt;
  std::optional<uint64_t> hash; ///< kvsidecar's chunk hash, where the name carries it
  int32_t rank = 0;
};

/// An object a backend dropped on its own (LRU eviction, a rejected file,
/// clear): the L2 actor announces BlockRemoved for the chunks it announced.
struct l2_removed {
  std::string name;
  l2_name_fields fields;
};

/// One page of a backend's objects (GET /cache/objects).
struct l2_listing {
  std::vector<l2_listed> objects;
  uint64_t total = 0; ///< objects held, all pages
};

/// A figure for the actor's stats line and /metrics: key in the log line,
/// Prometheus family ("" = log only), gauge or counter, one optional label.
using l2_figure_sink = std::function<void(std::string_view key, std::string_view metric,
                                          bool gauge, double value, std::string_view label,
                                          std::string_view label_value)>;

class l2_backend {
public:
  virtual ~l2_backend() = default;

  /// The medium BlockStored/BlockRemoved name for chunks held here.
  virtual const char* medium() const = 0;
  /// Its name in figures' "tier" labels ("disk", "redis").
  virtual const char* tier() const = 0;
  /// Every node reads and writes it (Redis): read in one batched round per
  /// fetch, and not one node's to clear. A node-local backend is probed
  /// first and read lazily, shard by shard.
  virtual bool shared() const = 0;
  /// For the start-up log line.
  virtual std::string describe() const = 0;

  /// `k`'s name here; nullopt when this backend cannot name it (LMCache's
  /// layout: a chunk without an LMCache hash, a model or salt LMCache's
  /// names cannot carry).
  virtual std::optional<std::string> name(const l2_key& k) const = 0;
  virtual std::vector<bool> contains(const std::vector<std::string>& names) = 0;
  /// LMCache's key fields of a name here, and the name of such a key
  /// (GET|DELETE /cache/objects); nullopt where the format cannot say.
  virtual std::optional<object_key_fields> fields_of(const std::string& name) const = 0;
  virtual std::optional<std::string> name_of(const object_key_fields& f) const = 0;

  struct put_item {
    const std::string* name;
    const l2_key* key;
    std::string_view bytes; ///< the payload
  };
  /// True where the object is held now because of this put (not where it
  /// was there already).
  virtual std::vector<bool> put(const std::vector<put_item>& items) = 0;

  struct get_item {
    const std::string* name;
    const l2_key* key;
  };
  /// Reads each object into values[i] (a buffer to reuse, overwritten);
  /// true where it is there and is the object asked for, its payload from
  /// skip[i]. Both vectors are resized to items.size().
  virtual std::vector<bool> get(const std::vector<get_item>& items,
                                std::vector<std::string>& values,
                                std::vector<uint32_t>& skip) = 0;

  /// Removes the named objects; how many were there.
  virtual size_t erase(const std::vector<std::string>& names) = 0;
  /// Removes every object it holds (on_removed for each; not evictions).
  virtual size_t clear() = 0;
  /// Objects `offset`.. (at most `limit`), oldest first.
  virtual l2_listing list(uint64_t offset, uint64_t limit) const = 0;

  /// Bytes and objects per cache_salt, each salt's objects in LRU order.
  const salt_ledger& usage() const { return ledger_; }

  /// The backend's own figures (the actor adds its labels).
  virtual void figures(const l2_figure_sink& out) const = 0;
  /// Faults to log once each (a full disk, a Redis node down): lines not
  /// returned before. The counters in figures() keep the totals.
  virtual std::vector<std::string> new_faults() = 0;

  std::function<void(const l2_removed&)> on_removed;

protected:
  salt_ledger ledger_;
};

} // namespace kvs
