#include "actors/cache/store_objects.hpp"

#include "core/cache_salt.hpp"
#include "log/log.hpp"

namespace kvs {

namespace {

std::string model_of(const store_state& st, uint64_t hash) {
  auto m = st.chunk_model.find(hash);
  return m == st.chunk_model.end() ? std::string{} : st.models[m->second];
}

std::string salt_of(const store_state& st, chunk_key k) {
  auto* s = st.quota.salt_of(k);
  return s ? *s : std::string{};
}

bool matches(const store_state& st, const store_objects_filter& q, chunk_key k) {
  if (q.by_salt && salt_of(st, k) != q.salt)
    return false;
  return !q.by_model || model_of(st, k.hash) == q.model;
}

} // namespace

store_objects_page list_objects(store_self self, const store_list_objects& q) {
  auto& st = self->state;
  store_objects_page out;
  size_t next = st.index->scan(
    static_cast<size_t>(q.cursor), objects_scan_budget, [&](chunk_key k, const entry_info& e) {
      if (!matches(st, q.filter, k))
        return true;
      stored_object o;
      o.key = k;
      o.bytes = e.bytes;
      o.model = model_of(st, k.hash);
      o.salt = salt_of(st, k);
      o.locked = e.readers > 0;
      out.objects.push_back(std::move(o));
      return out.objects.size() < q.limit;
    });
  out.done = next == SIZE_MAX;
  out.next_cursor = out.done ? 0 : next;
  return out;
}

store_deleted delete_objects(store_self self, const store_delete_objects& q) {
  auto& st = self->state;
  store_deleted out;
  std::vector<chunk_key> match;
  if (q.by_keys) {
    // LMCache's keys: the chunk must be the one named, model and salt
    // included (a model this store no longer knows for the hash is taken
    // as named).
    for (auto& n : q.named) {
      auto e = st.index->find(n.key);
      if (!e || e->state != entry_state::committed || salt_of(st, n.key) != n.salt)
        continue;
      auto model = model_of(st, n.key.hash);
      if (model.empty() || model == n.model)
        match.push_back(n.key);
    }
  } else {
    st.index->scan(0, SIZE_MAX, [&](chunk_key k, const entry_info&) {
      if (matches(st, q.filter, k))
        match.push_back(k);
      return true;
    });
  }
  std::vector<chunk_key> gone;
  for (auto& k : match) {
    if (st.index->erase(k))
      gone.push_back(k);
    else
      ++out.locked; // a reader holds it: it stays, as /cache/clear leaves it
  }
  announce_evicted(self, gone); // BlockRemoved, records, quota accounting
  out.removed = gone.size();
  if (q.by_keys)
    KVS_INFO(st.label, "delete (HTTP control plane, {} keys): {} chunks dropped, {} locked",
             q.named.size(), out.removed, out.locked);
  else
    KVS_INFO(st.label, "delete (HTTP control plane, model {} salt {}): {} chunks dropped, {} locked",
             q.filter.by_model ? "\"" + q.filter.model + "\"" : std::string{"any"},
             q.filter.by_salt ? "\"" + std::string{cache_salt_name(q.filter.salt)} + "\""
                              : std::string{"any"},
             out.removed, out.locked);
  return out;
}

store_locked_chunks lock_chunks(store_self self, const store_lock_chunks& q) {
  auto& st = self->state;
  store_locked_chunks out;
  auto now = cache_clock::now();
  for (auto& k : q.keys) {
    stored_object o;
    o.key = k;
    if (auto e = st.index->find(k); e && e->state == entry_state::committed) {
      if (auto t = st.index->lock(k, 1, now)) {
        o.found = true;
        o.bytes = e->bytes;
        o.data = e->data;
        o.model = model_of(st, k.hash);
        o.salt = salt_of(st, k);
        out.tokens.push_back(*t);
      }
    }
    out.objects.push_back(std::move(o));
  }
  return out;
}

void unlock_chunks(store_self self, const store_unlock_chunks& q) {
  for (auto& t : q.tokens)
    self->state.index->unlock(t, 1); // a lock that expired meanwhile is a counted no-op
}

} // namespace kvs
