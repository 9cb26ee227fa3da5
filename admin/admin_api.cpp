#include "admin/admin_api.hpp"

#include "admin/chunk_digests.hpp"

#include "cache/chunk_hash.hpp"
#include "cache/lookup_keys.hpp"
#include "cache/md5.hpp"
#include "core/cache_salt.hpp"
#include "core/hex.hpp"
#include "core/version.hpp"
#include "metrics/health.hpp"
#include "http/json_text.hpp"
#include "messages/type_ids.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <optional>
#include <cstdio>
#include <cstdlib>

namespace kvs {

namespace {

constexpr double gib = 1073741824.0;

http_answer json(json_writer& w, int status = 200) {
  return {status, w.take()};
}

/// LMCache's /config/adapters and /status' l2_adapters, from [l2].
void adapters(json_writer& w, const config& cfg, bool status_shape) {
  int index = 0;
  auto one = [&](const char* type, const char* detail_key, const std::string& detail) {
    w.begin_object();
    if (status_shape) {
      w.str("type", type).str(detail_key, detail);
    } else {
      w.integer("index", static_cast<uint64_t>(index))
        .str("type_name", type)
        .str("tier", "l2")
        .boolean("primary", index == 0)
        .boolean("reconfigurable", false);
    }
    w.end_object();
    ++index;
  };
  if (cfg.l2.disk.enabled)
    one("disk", "base_path", cfg.l2.disk.path);
  if (cfg.l2.redis.enabled)
    one("redis", "backend", cfg.l2.redis.cluster ? "redis-cluster" : "redis");
}

} // namespace

admin_policy admin_api::policy_of(const config& cfg) {
  admin_policy p;
  auto host = cfg.http.listen.substr(0, cfg.http.listen.rfind(':'));
  p.loopback = host.rfind("127.", 0) == 0 || host == "[::1]";
  p.token = cfg.http.admin_token;
  if (p.token.empty())
    if (const char* env = std::getenv("KVSIDECAR_ADMIN_TOKEN"))
      p.token = env;
  return p;
}

void admin_api::watch(store_actor store, l2_actor l2, gpu_transfer_actor gpu) {
  std::lock_guard<std::mutex> lock{mu_};
  store_ = std::move(store);
  l2_ = std::move(l2);
  gpu_ = std::move(gpu);
}

store_actor admin_api::current_store() {
  std::lock_guard<std::mutex> lock{mu_};
  return store_;
}

http_answer admin_api::store_missing() const {
  return http_error(503, cfg_.cache.enabled ? "the cache server is starting"
                                             : "the cache server is off (cache.enabled = false)");
}

namespace {

/// `to`'s answer to `msg` within admin_store_timeout, or the HTTP answer
/// that says why there is none (504: busy; 503: gone); `who` names it.
template <class Reply, class Handle, class Msg>
std::variant<Reply, http_answer> ask_actor(caf::actor_system& sys, const Handle& to, Msg msg,
                                           const std::string& who) {
  std::variant<Reply, http_answer> out = http_error(504, who + " did not answer");
  caf::scoped_actor self{sys};
  self->request(to, admin_store_timeout, std::move(msg))
    .receive([&](Reply& r) { out = std::move(r); },
             [&](caf::error& e) {
               out = e == caf::sec::request_timeout
                       ? http_error(504, who + " did not answer within "
                                            + std::to_string(admin_store_timeout.count())
                                            + " ms (busy?): try again")
                       : http_error(503, who + " is gone: " + caf::to_string(e));
             });
  return out;
}

} // namespace

std::variant<store_admin_reply, http_answer> admin_api::ask(store_admin q) {
  auto store = current_store();
  if (!store)
    return store_missing();
  return ask_actor<store_admin_reply>(sys_, store, std::move(q), "the store");
}

http_answer admin_api::status() {
  auto& h = health();
  bool healthy = h.alive.load() && h.ready.load() && !h.draining.load();
  json_writer w;
  w.begin_object()
    .boolean("is_healthy", healthy)
    .str("engine_type", "kvsidecar")
    .integer("chunk_size", static_cast<uint64_t>(cfg_.cache.chunk_size));
  std::optional<store_admin_reply> r;
  if (cfg_.cache.enabled) {
    auto a = ask(store_admin{});
    if (auto* e = std::get_if<http_answer>(&a))
      return *e;
    r = std::get<store_admin_reply>(std::move(a));
  }
  if (r) {
    double ratio = r->capacity_bytes ? static_cast<double>(r->used_bytes)
                                         / static_cast<double>(r->capacity_bytes)
                                     : 0.0;
    w.integer("active_sessions", r->sessions)
      .begin_object("storage_manager")
      .begin_object("l1_manager")
      .integer("memory_total_bytes", r->capacity_bytes)
      .integer("memory_used_bytes", r->used_bytes)
      .num("memory_usage_ratio", ratio)
      .integer("total_object_count", r->chunks)
      .integer("write_locked_count", r->reserved) // being copied in
      .integer("read_locked_count", r->locked_chunks)
      .integer("outstanding_read_locks", r->locks)
      .end_object()
      // describe reads eviction_controller (0.5.6 serves l1_eviction_controller).
      .begin_object("eviction_controller")
      .str("eviction_policy", r->quota_isolated ? "IsolatedLRU" : "LRU")
      .end_object()
      .begin_object("l1_eviction_controller")
      .str("eviction_policy", r->quota_isolated ? "IsolatedLRU" : "LRU")
      .num("trigger_watermark", cfg_.cache.evict_high)
      .end_object()
      .begin_array("l2_adapters");
    adapters(w, cfg_, true);
    w.end_array().end_object();
  }
  w.begin_object("kvsidecar")
    .str("version", kvs::version)
    .boolean("alive", h.alive.load())
    .boolean("ready", h.ready.load())
    .boolean("draining", h.draining.load());
  if (r)
    w.integer("registered_instances", r->instances)
      .integer("stored_chunks_total", r->stored)
      .integer("evicted_chunks_total", r->evicted)
      .integer("lookups_total", r->lookups)
      .integer("lookup_hit_chunks_total", r->hit_chunks)
      .integer("events_dropped_total", r->events_dropped)
      .integer("reannounced_chunks_total", r->reannounced)
      .integer("quota_evicted_chunks_total", r->quota_evicted);
  if (r && r->l2)
    w.begin_object("l2")
      .integer("prefetches_total", r->l2_prefetches)
      .integer("prefetched_chunks_total", r->l2_prefetched_chunks)
      .integer("prefetch_failures_total", r->l2_prefetch_failures)
      .integer("write_skipped_total", r->l2_write_skipped)
      .integer("queued_bytes", r->l2_queued_bytes)
      .end_object();
  w.end_object().end_object();
  return json(w);
}

http_answer admin_api::quota(store_admin::op what, const std::string& salt,
                             uint64_t limit_bytes, double limit_gb) {
  store_admin q;
  q.salt = salt;
  q.limit_bytes = limit_bytes;
  q.what = what;
  auto a = ask(q);
  if (auto* e = std::get_if<http_answer>(&a))
    return *e;
  auto& r = std::get<store_admin_reply>(a);
  // l2.quota_mode = "isolated": the limits govern L2 as LMCache's do, and
  // the usage reported is L2's (LMCache's quota API reads its L2 adapters).
  l2_actor tier2;
  {
    std::lock_guard<std::mutex> lock{mu_};
    tier2 = l2_;
  }
  if (cfg_.l2.quota_isolated && tier2) {
    if (what == store_admin::op::quota_set && r.ok)
      caf::anon_send(tier2, l2_quota_limit{salt, limit_bytes});
    else if (what == store_admin::op::quota_delete)
      caf::anon_send(tier2, l2_quota_limit{salt, std::nullopt});
    if (what == store_admin::op::quota_list || what == store_admin::op::quota_get) {
      auto u = ask_actor<l2_usage>(sys_, tier2, l2_usage_atom_v, "the L2 actor");
      if (auto* e = std::get_if<http_answer>(&u))
        return *e;
      auto& by_salt = std::get<l2_usage>(u).bytes_by_salt;
      for (auto& s : r.salts) {
        auto it = by_salt.find(s.salt);
        s.bytes = it == by_salt.end() ? 0 : it->second;
      }
    }
  }
  json_writer w;
  auto name = std::string{cache_salt_name(salt)};
  switch (what) {
  case store_admin::op::quota_list:
    w.begin_object().begin_object("users");
    for (auto& u : r.salts)
      w.begin_object(cache_salt_name(u.salt))
        .num("limit_gb", static_cast<double>(u.limit.value_or(0)) / gib)
        .num("current_usage_gb", static_cast<double>(u.bytes) / gib)
        .end_object();
    w.end_object().end_object();
    break;
  case store_admin::op::quota_get: {
    auto& u = r.salts.at(0);
    w.begin_object()
      .str("cache_salt", name)
      .num("limit_gb", static_cast<double>(u.limit.value_or(0)) / gib)
      .num("current_usage_gb", static_cast<double>(u.bytes) / gib)
      .boolean("exists", r.ok)
      .end_object();
    break;
  }
  case store_admin::op::quota_set:
    if (!r.ok)
      return http_error(400, "too many quotas: at most "
                                + std::to_string(salt_quota_max_limits) + " salts have one");
    w.begin_object()
      .str("cache_salt", name)
      .num("limit_gb", limit_gb)
      .str("status", "ok")
      .integer("evicted_chunks", r.removed)
      .end_object();
    break;
  default:
    w.begin_object()
      .str("cache_salt", name)
      .str("status", r.ok ? "removed" : "not_found")
      .end_object();
    break;
  }
  return json(w);
}

std::vector<uint64_t> admin_api::hashes_of(const admin_req::token_chunks& c) const {
  auto cs = static_cast<size_t>(cfg_.cache.chunk_size);
  return prefix_chunk_hashes(c.tokens.data(), c.tokens.size(), cs, c.tokens.size() / cs,
                             identity_seed(c.model, c.world_size, c.salt));
}

http_answer admin_api::clear(const admin_req::cache_clear& c) {
  const bool l1 = c.tier == "l1" || c.tier == "all";
  const bool l2 = c.tier == "l2" || c.tier == "all";
  l2_actor tier2;
  {
    std::lock_guard<std::mutex> lock{mu_};
    tier2 = l2_;
  }
  if (l2 && !tier2)
    return http_error(400, "tier '" + c.tier + "': no L2 tier is configured (l2.disk, l2.redis)");
  uint64_t l1_chunks = 0, l2_objects = 0;
  if (l1) {
    store_admin q;
    q.what = store_admin::op::clear_l1;
    auto a = ask(q);
    if (auto* e = std::get_if<http_answer>(&a))
      return *e;
    l1_chunks = std::get<store_admin_reply>(a).removed;
  }
  if (l2) {
    // The disk tier's files are removed (and announced BlockRemoved "DISK")
    // on the L2 actor's thread; a Redis every node shares is not one node's
    // to empty.
    auto a = ask_actor<uint64_t>(sys_, tier2, clear_l2_atom_v, "the L2 actor");
    if (auto* e = std::get_if<http_answer>(&a))
      return *e;
    l2_objects = std::get<uint64_t>(a);
  }
  json_writer w;
  w.begin_object().str("status", "ok").begin_object("cleared").str("tier", c.tier).end_object();
  if (l1)
    w.integer("chunks", l1_chunks);
  if (l2) {
    w.integer("l2_objects", l2_objects);
    if (cfg_.l2.redis.enabled)
      w.str("l2_not_cleared", "redis: shared by every node, not one node's to empty (its keys "
                              "expire by l2.redis.ttl or LRU)");
  }
  w.end_object();
  return json(w);
}

http_answer admin_api::prefetch(const admin_req::prefetch_submit& c) {
  auto cs = static_cast<size_t>(cfg_.cache.chunk_size);
  auto hashes = hashes_of(c);
  json_writer w;
  if (hashes.empty()) {
    w.begin_object().integer("chunks", 0).str("status", "noop").end_object();
    return {202, w.take()};
  }
  auto store = current_store();
  if (!store)
    return store_missing();
  const uint64_t n_chunks = hashes.size();
  std::string id;
  {
    std::lock_guard<std::mutex> lock{jobs_->mu};
    if (jobs_->running >= admin_max_prefetches)
      return http_error(503, "too many prefetches in flight (at most "
                                + std::to_string(admin_max_prefetches) + "); try again");
    id = "pf-" + std::to_string(jobs_->next++);
    ++jobs_->running;
    jobs_->jobs[id].total = hashes.size() * static_cast<uint64_t>(c.world_size);
  }
  // The store's LOOKUP is the prefetch: what L1 misses comes from L2 into
  // L1, under a session of its own whose locks are given back at once.
  std::string session = "http-prefetch:" + id;
  auto ranks = static_cast<uint64_t>(c.world_size);
  store_lookup q{session, std::move(hashes), static_cast<int32_t>(c.world_size), 1, c.model,
                 c.salt, 0};
  if (cfg_.l2.format == l2_format::lmcache) {
    // LMCache's object names for what L1 misses, as a session's LOOKUP
    // carries them (a token outside uint32 ends the names, as LMCache's keys).
    q.l2_names = prefix_l2_names(c.tokens.data(), c.tokens.size(), cs, n_chunks);
    q.tokens = prefix_l2_tokens(c.tokens.data(), c.tokens.size(), q.l2_names.size() * cs);
  }
  // The lookup is the spawned function's argument (CAF 0.17 dereferences an
  // empty argument tuple it never allocated for a function spawned with
  // none: UBSan's 'reference binding to null pointer').
  sys_.spawn([jobs = jobs_, store, id, session,
              ranks](caf::event_based_actor* self, store_lookup q) mutable {
    auto finish = [jobs, id](uint64_t found, std::string error) {
      std::lock_guard<std::mutex> lock{jobs->mu};
      --jobs->running;
      auto& j = jobs->jobs[id];
      j.done = true;
      j.found = found;
      j.error = std::move(error);
      jobs->finished.push_back(id);
      while (jobs->finished.size() > admin_kept_prefetches) {
        jobs->jobs.erase(jobs->finished.front());
        jobs->finished.pop_front();
      }
    };
    self->request(store, caf::infinite, std::move(q))
      .then(
        [self, store, session, ranks, finish](uint64_t hit) {
          caf::anon_send(store, store_end_session{session});
          finish(hit * ranks, {});
          self->quit();
        },
        [self, store, session, finish](caf::error& e) {
          caf::anon_send(store, store_end_session{session});
          finish(0, caf::to_string(e));
          self->quit();
        });
  }, std::move(q));
  w.begin_object()
    .str("request_id", id)
    .integer("chunks", n_chunks)
    .str("status", "submitted")
    .end_object();
  return {202, w.take()};
}

http_answer admin_api::prefetch_status(const admin_req::prefetch_status& c) {
  std::lock_guard<std::mutex> lock{jobs_->mu};
  auto i = jobs_->jobs.find(c.request_id);
  if (i == jobs_->jobs.end())
    return http_error(404, "unknown prefetch request_id='" + c.request_id
                              + "' (already completed or never submitted)");
  json_writer w;
  w.begin_object().str("request_id", c.request_id);
  if (!i->second.done) {
    w.str("status", "pending").end_object();
    return {200, w.take()};
  }
  w.str("status", "completed")
    .integer("found_keys", i->second.found)
    .integer("total_keys", i->second.total);
  if (!i->second.error.empty())
    w.str("error", i->second.error);
  w.end_object();
  // As LMCache: a completed job is reported once, then forgotten.
  jobs_->finished.erase(std::find(jobs_->finished.begin(), jobs_->finished.end(), c.request_id));
  jobs_->jobs.erase(i);
  return {200, w.take()};
}

namespace {

/// LMCache's EncodedObjectKey of an L1 chunk: its 64-bit prefix hash as 16
/// hex digits (big-endian), the TP rank as kv_rank, no object groups.
void object_key(json_writer& w, const stored_object& o) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(o.key.hash));
  w.begin_object("key")
    .str("chunk_hash_hex", hex)
    .str("model_name", o.model)
    .integer("kv_rank", static_cast<uint64_t>(o.key.rank))
    .integer("object_group_id", 0)
    .str("cache_salt", o.salt)
    .end_object();
}

store_admin filter_of(const admin_req::objects_filter& c, store_admin::op what) {
  store_admin q;
  q.what = what;
  q.by_model = c.by_model;
  q.model = c.model;
  q.by_salt = c.by_salt;
  q.salt = c.salt;
  return q;
}

/// LMCache's EncodedObjectKey of an L2 object.
void l2_object_key(json_writer& w, const object_key_fields& k) {
  w.begin_object("key")
    .str("chunk_hash_hex", hex(k.chunk_hash, k.chunk_hash.size()))
    .str("model_name", k.model)
    .integer("kv_rank", k.kv_rank)
    .integer("object_group_id", k.group)
    .str("cache_salt", k.salt)
    .end_object();
}

/// The bytes a key's chunk_hash_hex says (the route checked the digits).
std::string unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

} // namespace

l2_actor admin_api::current_l2() {
  std::lock_guard<std::mutex> lock{mu_};
  return l2_;
}

http_answer admin_api::l2_objects_list(const admin_req::objects_list& c) {
  auto tier2 = current_l2();
  if (!tier2)
    return http_error(503, "no L2 adapters configured (l2.disk, l2.redis); tier=l1 lists L1");
  l2_list_objects q;
  q.adapter = c.adapter;
  if (c.by_model)
    q.model = c.model;
  if (c.by_salt)
    q.salt = c.salt;
  q.offset = c.cursor;
  q.limit = c.page_size;
  auto a = ask_actor<l2_objects_page>(sys_, tier2, std::move(q), "the L2 actor");
  if (auto* e = std::get_if<http_answer>(&a))
    return *e;
  auto& r = std::get<l2_objects_page>(a);
  if (r.status != 200)
    return http_error(r.status, r.error);
  json_writer w;
  w.begin_object().str("adapter", r.adapter).boolean("shared", r.shared).begin_array("entries");
  for (auto& e : r.entries) {
    w.begin_object();
    l2_object_key(w, e.key);
    w.integer("size_bytes", e.bytes).end_object();
  }
  w.end_array();
  if (r.next)
    w.str("next_page_token", std::to_string(*r.next));
  else
    w.null("next_page_token");
  w.end_object();
  return json(w);
}

std::variant<l2_deleted, http_answer> admin_api::l2_objects_delete(const admin_req::objects_delete& c) {
  auto tier2 = current_l2();
  if (!tier2)
    return http_error(503, "no L2 adapters configured (l2.disk, l2.redis); tier \"l1\" "
                            "deletes L1's chunks");
  l2_delete_objects q;
  q.adapter = c.adapter;
  for (auto& k : c.keys)
    q.keys.push_back(object_key_fields{k.model, static_cast<uint32_t>(k.rank), k.group,
                                       unhex(k.hash_hex), k.salt});
  auto a = ask_actor<l2_deleted>(sys_, tier2, std::move(q), "the L2 actor");
  if (auto* e = std::get_if<http_answer>(&a))
    return *e;
  auto& r = std::get<l2_deleted>(a);
  if (r.status != 200)
    return http_error(r.status, r.error);
  return r;
}


http_answer admin_api::objects_list(const admin_req::objects_list& c) {
  if (c.tier == "l2")
    return l2_objects_list(c);
  auto q = filter_of(c, store_admin::op::list_objects);
  q.cursor = c.cursor;
  q.limit = c.page_size;
  auto a = ask(std::move(q));
  if (auto* e = std::get_if<http_answer>(&a))
    return *e;
  auto& r = std::get<store_admin_reply>(a);
  json_writer w;
  w.begin_object().str("adapter", "l1").boolean("shared", false).begin_array("entries");
  for (auto& o : r.objects) {
    w.begin_object();
    object_key(w, o);
    w.integer("size_bytes", o.bytes).str("tier", "l1").boolean("locked", o.locked).end_object();
  }
  w.end_array();
  if (r.done)
    w.null("next_page_token");
  else
    w.str("next_page_token", std::to_string(r.next_cursor));
  w.end_object();
  return json(w);
}

http_answer admin_api::objects_delete(const admin_req::objects_delete& c) {
  uint64_t l2_deleted_keys = 0;
  if (c.tier != "l1") { // LMCache's default: L2 ("all": L2, then L1)
    auto d = l2_objects_delete(c);
    if (auto* e = std::get_if<http_answer>(&d))
      return *e;
    l2_deleted_keys = std::get<l2_deleted>(d).deleted;
    if (c.tier == "l2") {
      json_writer w;
      w.begin_object()
        .integer("deleted", l2_deleted_keys)
        .integer("skipped", 0)
        .boolean("ok", true)
        .end_object();
      return json(w);
    }
  }
  auto q = filter_of(c, store_admin::op::delete_objects);
  q.by_keys = c.by_keys;
  for (auto& k : c.keys) {
    stored_object n;
    n.key = chunk_key{k.hash, k.rank};
    n.model = k.model;
    n.salt = k.salt;
    q.named.push_back(std::move(n));
  }
  auto a = ask(std::move(q));
  if (auto* e = std::get_if<http_answer>(&a))
    return *e;
  auto& r = std::get<store_admin_reply>(a);
  json_writer w;
  // LMCache's answer ("skipped": the locked ones).
  w.begin_object()
    .integer("deleted", r.removed + l2_deleted_keys)
    .integer("skipped", r.locked)
    .boolean("ok", true)
    .end_object();
  return json(w);
}

http_answer admin_api::block_checksums(const admin_req::block_checksums& c) {
  gpu_transfer_actor gpu;
  {
    std::lock_guard<std::mutex> lock{mu_};
    gpu = gpu_;
  }
  if (!gpu)
    return store_missing();
  gpu_checksum_read q;
  q.instance_id = c.instance_id;
  q.query.block_ids = c.block_ids;
  q.query.chunk_blocks = c.chunk_blocks;
  q.query.max_bytes = admin_checksum_max_bytes;
  // One chunk's bytes in memory at a time; the pools stay the actor's.
  std::vector<std::vector<std::string>> digests; // [chunk][one, or per layer]
  uint64_t chunks = 1;
  for (uint64_t i = 0; i < chunks; ++i) {
    q.query.chunk = i;
    auto a = ask_actor<block_checksum_chunk>(sys_, gpu, q, "the gpu-transfer actor");
    if (auto* e = std::get_if<http_answer>(&a))
      return *e;
    auto& r = std::get<block_checksum_chunk>(a);
    if (r.status != 200)
      return http_error(r.status, r.error);
    chunks = r.num_chunks;
    digests.push_back(chunk_digests(r, c.layerwise));
  }
  json_writer w;
  w.begin_object()
    .str("status", "success")
    .integer("chunk_size", static_cast<uint64_t>(c.chunk_blocks))
    .integer("num_chunks", digests.size());
  if (c.layerwise) {
    w.begin_object("chunk_checksums");
    size_t layers = digests.empty() ? 0 : digests.front().size();
    for (size_t l = 0; l < layers; ++l) {
      w.begin_array("layer_" + std::to_string(l));
      for (auto& d : digests)
        w.str("", d[l]);
      w.end_array();
    }
    w.end_object();
  } else {
    w.begin_array("chunk_checksums");
    for (auto& d : digests)
      w.str("", d.front());
    w.end_array();
  }
  w.boolean("layerwise", c.layerwise).begin_array("block_id_ranges");
  // LMCache's compress_slot_mapping: runs of 3+ consecutive ids as
  // [first, last], shorter runs as the ids themselves, order kept.
  auto& ids = c.block_ids;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1)
      ++j;
    if (j - i + 1 >= 3)
      w.begin_array().integer("", static_cast<uint64_t>(ids[i]))
        .integer("", static_cast<uint64_t>(ids[j])).end_array();
    else
      for (size_t k = i; k <= j; ++k)
        w.integer("", static_cast<uint64_t>(ids[k]));
    i = j + 1;
  }
  w.end_array().end_object();
  return json(w);
}

http_answer admin_api::checksums(const admin_req::chunk_checksums& c) {
  auto cs = static_cast<size_t>(cfg_.cache.chunk_size);
  auto hashes = hashes_of(c);
  store_admin q;
  q.what = store_admin::op::lock_chunks;
  for (auto h : hashes)
    q.keys.push_back(chunk_key{h, static_cast<int32_t>(c.kv_rank)});
  std::vector<stored_object> objects;
  std::vector<lock_token> tokens;
  if (!hashes.empty()) {
    auto a = ask(std::move(q));
    if (auto* e = std::get_if<http_answer>(&a))
      return *e;
    auto& r = std::get<store_admin_reply>(a);
    objects = std::move(r.objects);
    tokens = std::move(r.tokens);
  }
  // The chunks stay read-locked (in place, unevictable) while hashed here,
  // off the store's thread; the locks go back whatever happens.
  uint64_t bytes = 0;
  for (auto& o : objects)
    bytes += o.found ? o.bytes : 0;
  std::vector<std::string> digests;
  if (bytes <= admin_checksum_max_bytes)
    for (auto& o : objects)
      digests.push_back(o.found ? md5_hex(o.data, o.bytes) : std::string{});
  if (!tokens.empty()) {
    store_admin u;
    u.what = store_admin::op::unlock_chunks;
    u.tokens = std::move(tokens);
    ask(std::move(u)); // unanswered: the locks expire with cache.lock_ttl
  }
  if (bytes > admin_checksum_max_bytes)
    return http_error(413, "those chunks hold " + std::to_string(bytes >> 20)
                              + " MiB; one call hashes at most "
                              + std::to_string(admin_checksum_max_bytes >> 20)
                              + " MiB: ask for fewer tokens");
  json_writer w;
  w.begin_object()
    .str("status", "success")
    .integer("chunk_size", cs)
    .integer("num_chunks", objects.size())
    .begin_array("chunk_checksums");
  for (auto& d : digests)
    if (d.empty())
      w.null("");
    else
      w.str("", d);
  w.end_array().boolean("layerwise", false).begin_array("token_ranges");
  for (size_t i = 0; i < objects.size(); ++i)
    w.begin_array().integer("", i * cs).integer("", (i + 1) * cs).end_array();
  w.end_array().integer("kv_rank", static_cast<uint64_t>(c.kv_rank)).end_object();
  return json(w);
}

http_answer admin_api::answer(const admin_req::healthcheck&) {
  auto& h = health();
  const char* why = !h.alive.load()    ? "an actor died: see the log"
                    : h.draining.load() ? "draining"
                    : !h.ready.load()   ? "starting"
                                        : nullptr;
  json_writer w;
  if (why) {
    w.begin_object().str("status", "unhealthy").str("reason", why).end_object();
    return json(w, 503);
  }
  w.begin_object().str("status", "healthy").end_object();
  return json(w);
}

http_answer admin_api::answer(const admin_req::root&) {
  json_writer w;
  w.begin_object().str("status", "ok").str("service", "LMCache HTTP API")
    .str("server", std::string{"kvsidecar "} + kvs::version).end_object();
  return json(w);
}

http_answer admin_api::answer(const admin_req::config_adapters&) {
  json_writer w;
  w.begin_object().begin_array("adapters");
  adapters(w, cfg_, false);
  w.end_array().end_object();
  return json(w);
}

http_answer admin_api::serve(const admin_call& call) {
  namespace req = admin_req;
  using op = store_admin::op;
  // One handler per call type; std::visit fails to compile if one is missing.
  struct visitor {
    admin_api& a;
    http_answer operator()(const req::root& c) { return a.answer(c); }
    http_answer operator()(const req::healthcheck& c) { return a.answer(c); }
    http_answer operator()(const req::status&) { return a.status(); }
    http_answer operator()(const req::config&) { return {200, a.cfg_.effective_json}; }
    http_answer operator()(const req::config_adapters& c) { return a.answer(c); }
    http_answer operator()(const req::version& c) {
      return {200, json_quote(c.path == "/version" ? std::string{"kvsidecar "} + kvs::version
                                                   : std::string{kvs::version})};
    }
    http_answer operator()(const req::cache_clear& c) { return a.clear(c); }
    http_answer operator()(const req::quota_list&) { return a.quota(op::quota_list, {}, 0, 0); }
    http_answer operator()(const req::quota_get& c) { return a.quota(op::quota_get, c.salt, 0, 0); }
    http_answer operator()(const req::quota_set& c) {
      return a.quota(op::quota_set, c.salt, c.limit_bytes, c.limit_gb);
    }
    http_answer operator()(const req::quota_delete& c) {
      return a.quota(op::quota_delete, c.salt, 0, 0);
    }
    http_answer operator()(const req::prefetch_submit& c) { return a.prefetch(c); }
    http_answer operator()(const req::prefetch_status& c) { return a.prefetch_status(c); }
    http_answer operator()(const req::objects_list& c) { return a.objects_list(c); }
    http_answer operator()(const req::objects_delete& c) { return a.objects_delete(c); }
    http_answer operator()(const req::chunk_checksums& c) { return a.checksums(c); }
    http_answer operator()(const req::block_checksums& c) { return a.block_checksums(c); }
  };
  return std::visit(visitor{*this}, call);
}

} // namespace kvs
