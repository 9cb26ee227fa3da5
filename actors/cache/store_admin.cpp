#include "actors/cache/store_admin.hpp"

#include "actors/cache/store_objects.hpp"

#include "core/cache_salt.hpp"
#include "log/log.hpp"

#include <set>

namespace kvs {

void quota_init(store_state& st) {
  st.quota = salt_quota{st.p.quota_isolated};
  for (auto& [salt, bytes] : st.p.quotas)
    st.quota.set_limit(salt, bytes); // the config holds far fewer than the bound
}

void quota_committed(store_state& st, chunk_key k, const std::string& salt) {
  if (auto e = st.index->find(k))
    st.quota.committed(k, salt, e->bytes);
}

uint64_t quota_enforce(store_self self, const std::vector<std::string>& salts) {
  auto& st = self->state;
  if (!st.quota.isolated())
    return 0;
  std::vector<chunk_key> gone;
  for (auto& salt : salts)
    for (auto& k : st.quota.over_limit(salt))
      if (st.index->erase(k)) // a read-locked chunk stays until its reader leaves
        gone.push_back(k);
  if (gone.empty())
    return 0;
  st.quota_evicted += gone.size();
  announce_evicted(self, gone); // also takes them off the quota accounting
  return gone.size();
}

uint64_t clear_l1(store_self self, const char* who) {
  auto& st = self->state;
  auto removed = st.index->clear();
  KVS_INFO(st.label, "clear ({}): {} chunks dropped", who, removed.size());
  announce_evicted(self, removed);
  return removed.size();
}

namespace {

/// Every salt that holds chunks now or has a limit (after a limit changed,
/// any of them may be over: with the allowlist rule, a first quota puts
/// every other salt at 0).
std::vector<std::string> every_salt(const store_state& st) {
  std::set<std::string> out;
  salt_usage others;
  for (auto& u : st.quota.top(SIZE_MAX, others))
    out.insert(u.salt);
  return {out.begin(), out.end()};
}

} // namespace

store_status status_of(const store_state& st) {
  store_status out;
  out.quota_isolated = st.quota.isolated();
  auto x = st.index->stats();
  out.chunks = x.chunks;
  out.reserved = x.reserved;
  out.locked_chunks = x.locked_entries;
  out.locks = x.outstanding_readers;
  out.used_bytes = x.slot_bytes_used;
  out.capacity_bytes = x.capacity_bytes;
  out.sessions = st.ledger->session_count();
  out.instances = st.chunk_bytes.size();
  out.stored = st.stored;
  out.evicted = st.evicted;
  out.lookups = x.lookups;
  out.hit_chunks = x.hit_chunks;
  out.events_dropped = st.events_dropped;
  out.reannounced = st.reannounced;
  out.quota_evicted = st.quota_evicted;
  if (st.p.l2.actor) {
    auto& l2 = st.p.l2;
    out.l2 = true;
    out.l2_prefetches = l2.prefetches;
    out.l2_prefetched_chunks = l2.prefetched_chunks;
    out.l2_prefetch_failures = l2.prefetch_failures;
    out.l2_write_skipped = l2.queued_skipped;
    out.l2_queued_bytes = l2.queue->in_flight();
  }
  return out;
}

store_quota_reply on_quota(store_self self, const store_quota_list&) {
  store_quota_reply out;
  out.salts = self->state.quota.limited();
  out.ok = true;
  return out;
}

store_quota_reply on_quota(store_self self, const store_quota_get& q) {
  auto& st = self->state;
  store_quota_reply out;
  out.salts.push_back(st.quota.usage(q.salt));
  out.ok = st.quota.limit(q.salt).has_value();
  return out;
}

store_quota_reply on_quota(store_self self, const store_quota_set& q) {
  auto& st = self->state;
  store_quota_reply out;
  out.ok = st.quota.set_limit(q.salt, q.limit_bytes);
  if (out.ok) {
    KVS_INFO(st.label, "quota of cache_salt \"{}\": {} bytes", cache_salt_name(q.salt),
             q.limit_bytes);
    out.evicted = quota_enforce(self, every_salt(st));
  }
  out.salts.push_back(st.quota.usage(q.salt));
  return out;
}

store_quota_reply on_quota(store_self self, const store_quota_delete& q) {
  auto& st = self->state;
  store_quota_reply out;
  out.ok = st.quota.remove_limit(q.salt);
  if (out.ok) {
    KVS_INFO(st.label, "quota of cache_salt \"{}\" removed", cache_salt_name(q.salt));
    out.evicted = quota_enforce(self, every_salt(st));
  }
  return out;
}

void quota_snapshot(const store_state& st, stats_snapshot& s) {
  salt_usage others;
  for (auto& u : st.quota.top(quota_metric_salts, others)) {
    auto name = std::string{cache_salt_name(u.salt)};
    s.gauge("", "kvsidecar_cache_salt_bytes", static_cast<double>(u.bytes), "salt", name)
      .gauge("", "kvsidecar_cache_salt_chunks", static_cast<double>(u.chunks), "salt", name);
    if (auto lim = st.quota.limit(u.salt))
      s.gauge("", "kvsidecar_cache_salt_limit_bytes", static_cast<double>(*lim), "salt", name);
  }
  if (others.chunks > 0)
    s.gauge("", "kvsidecar_cache_salt_bytes", static_cast<double>(others.bytes), "salt", "_other")
      .gauge("", "kvsidecar_cache_salt_chunks", static_cast<double>(others.chunks), "salt",
             "_other");
  s.gauge("", "kvsidecar_cache_quota_salts", static_cast<double>(st.quota.limited().size()))
    .counter("", "kvsidecar_cache_quota_evictions_total", static_cast<double>(st.quota_evicted));
}

} // namespace kvs
