// salt_ledger: one L2 backend's bytes per cache_salt, and each salt's
// objects least recently used first -- LMCache 0.5.6's per-adapter
// accounting (L2AdapterInterface._notify_keys_stored / _deleted:
// bytes_by_cache_salt) and its IsolatedLRU order (one LRU list per salt),
// in one place.
//
// Order within a batch follows IsolatedLRUEvictionPolicy: the objects of
// one put (or one read) are entered last first, so the batch's final object
// is the oldest of them -- a prefix's tail goes before its head.
//
// Pure, single-threaded (the backend's owner, the L2 actor).
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvs {

/// One object as a listing shows it.
struct l2_listed {
  std::string name;
  std::string salt;
  uint64_t bytes = 0;
};

class salt_ledger {
public:
  /// `name` now holds `bytes` under `salt` (again: its old record replaced),
  /// newest of its salt.
  void added(const std::string& name, std::string_view salt, uint64_t bytes);
  /// `name` is gone (no-op for a name never added).
  void removed(const std::string& name);
  /// `name` was read: newest of its salt.
  void touched(const std::string& name);

  /// Bytes per salt, only salts holding some (LMCache's bytes_by_cache_salt).
  const std::map<std::string, uint64_t, std::less<>>& bytes_by_salt() const { return bytes_; }
  uint64_t bytes(std::string_view salt) const;
  /// The salt's objects, least recently used first.
  std::vector<std::string> oldest(std::string_view salt, size_t n) const;
  size_t objects(std::string_view salt) const;
  /// The salt and bytes of one object (null: not held).
  const l2_listed* find(const std::string& name) const;
  size_t size() const { return at_.size(); }
  /// Objects `offset`.. (at most `limit`), salt by salt, oldest first.
  std::vector<l2_listed> page(uint64_t offset, uint64_t limit) const;

private:
  struct record {
    l2_listed what;
    std::list<std::string>::iterator at;
  };
  std::unordered_map<std::string, record> at_;
  std::map<std::string, std::list<std::string>, std::less<>> order_; ///< per salt, oldest first
  std::map<std::string, uint64_t, std::less<>> bytes_;
};

} // namespace kvs
