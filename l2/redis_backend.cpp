#include "l2/redis_backend.hpp"

namespace kvs {

redis_backend::redis_backend(redis_options opts, std::string key_prefix,
                             std::shared_ptr<const l2_naming> naming)
  : client_(std::make_unique<redis_client>(opts)), opts_(std::move(opts)),
    prefix_(std::move(key_prefix)), naming_(std::move(naming)) {}

std::string redis_backend::describe() const {
  std::string eps;
  for (auto& e : opts_.endpoints)
    eps += (eps.empty() ? "" : ",") + e;
  return "redis " + eps + (opts_.cluster ? " (cluster)" : "");
}

std::vector<bool> redis_backend::contains(const std::vector<std::string>& names) {
  if (names.empty())
    return {};
  return client_->exists(names);
}

std::vector<bool> redis_backend::put(const std::vector<put_item>& items) {
  if (items.empty())
    return {};
  // kvsidecar's objects are header + payload; the payload goes out from the
  // write's own bytes (no object is assembled in memory).
  const size_t head_n = naming_->header_bytes();
  std::string headers(items.size() * head_n, '\0');
  std::vector<std::string> keys;
  std::vector<std::string_view> heads, values;
  keys.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    keys.push_back(*items[i].name);
    if (head_n > 0) {
      auto* h = reinterpret_cast<uint8_t*>(headers.data() + i * head_n);
      naming_->encode_header(*items[i].key, items[i].bytes.size(), h);
      heads.emplace_back(headers.data() + i * head_n, head_n);
    }
    values.push_back(items[i].bytes);
  }
  auto ok = client_->set(keys, values, heads);
  for (size_t i = ok.size(); i-- > 0;) // IsolatedLRU's order: a batch's last is its oldest
    if (ok[i])
      ledger_.added(keys[i], items[i].key->salt, items[i].bytes.size());
  return ok;
}

std::vector<bool> redis_backend::get(const std::vector<get_item>& items,
                                     std::vector<std::string>& values,
                                     std::vector<uint32_t>& skip) {
  values.resize(items.size());
  skip.assign(items.size(), 0);
  if (items.empty())
    return {};
  std::vector<std::string> keys;
  keys.reserve(items.size());
  for (auto& it : items)
    keys.push_back(*it.name);
  auto hit = client_->get_into(keys, values);
  for (size_t i = items.size(); i-- > 0;) {
    if (!hit[i])
      continue;
    const auto& v = values[i];
    if (naming_->check(*items[i].key, reinterpret_cast<const uint8_t*>(v.data()), v.size(),
                       &skip[i])) {
      ledger_.touched(keys[i]);
    } else {
      ++rejected_;
      hit[i] = false;
    }
  }
  return hit;
}

size_t redis_backend::erase(const std::vector<std::string>& names) {
  size_t n = 0;
  for (auto& k : names) {
    auto r = client_->command({"DEL", k}, k);
    if (r && *r == "1")
      ++n;
    if (r) { // the key is gone (or was): this node's usage no more
      ledger_.removed(k);
      if (on_removed) {
        auto f = naming_->parse_redis_key(prefix_, k);
        on_removed(l2_removed{k, f ? std::move(*f) : l2_name_fields{}});
      }
    }
  }
  return n;
}

l2_listing redis_backend::list(uint64_t offset, uint64_t limit) const {
  return l2_listing{ledger_.page(offset, limit), ledger_.size()}; // what this node wrote
}

void redis_backend::figures(const l2_figure_sink& out) const {
  auto& r = client_->stats();
  auto f = [](uint64_t v) { return static_cast<double>(v); };
  out("redis_sets", "kvsidecar_l2_puts_total", false, f(r.set_ok), "tier", "redis");
  out("redis_gets", "", false, f(r.gets), "", "");
  out("redis_hits", "kvsidecar_l2_hits_total", false, f(r.get_hits), "tier", "redis");
  out("redis_errors", "kvsidecar_l2_errors_total", false, f(r.errors), "kind", "redis");
  out("redis_unreachable", "kvsidecar_l2_errors_total", false, f(r.unreachable), "kind",
      "redis_unreachable");
  out("redis_rejected", "kvsidecar_l2_errors_total", false, f(rejected_), "kind",
      "redis_rejected");
  out("redis_moved", "", false, f(r.moved), "", "");
  out("redis_asked", "", false, f(r.asked), "", "");
  out("redis_refreshes", "", false, f(r.slot_refreshes), "", "");
  out("redis_connects", "", false, f(r.connects), "", "");
  out("redis_connect_failures", "kvsidecar_l2_errors_total", false, f(r.connect_failures),
      "kind", "redis_connect");
}

std::vector<std::string> redis_backend::new_faults() {
  auto& e = client_->last_error();
  if (e.empty() || e == last_error_)
    return {};
  last_error_ = e;
  return {"redis: " + e + " (lookups degrade to the other tiers; retrying by itself)"};
}

} // namespace kvs
