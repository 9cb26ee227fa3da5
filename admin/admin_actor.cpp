#include "admin/admin_actor.hpp"

#include "admin/chunk_digests.hpp"

#include "actors/actor_logging.hpp"
#include "cache/chunk_hash.hpp"
#include "cache/lookup_keys.hpp"
#include "cache/md5.hpp"
#include "cache/md5_lanes.hpp"
#include "core/cache_salt.hpp"
#include "core/hex.hpp"
#include "core/version.hpp"
#include "http/http_answer.hpp"
#include "http/json_text.hpp"
#include "metrics/health.hpp"

#include <caf/send.hpp>
#include <caf/typed_response_promise.hpp>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>

namespace kvs {

namespace {

using promise = caf::typed_response_promise<http_answer>;
using answer = caf::result<http_answer>;

constexpr double gib = 1073741824.0;

http_answer json(json_writer& w, int status = 200) {
  return {status, w.take()};
}

/// 503: why there is no store to ask.
http_answer store_missing(const config& cfg) {
  return http_error(503, cfg.cache.enabled ? "the cache server is starting"
                                           : "the cache server is off (cache.enabled = false)");
}

/// The answer for an ask that got no reply (504: busy; 503: gone); `who` names it.
http_answer no_reply(const caf::error& e, const std::string& who) {
  return e == caf::sec::request_timeout
           ? http_error(504, who + " did not answer within "
                               + std::to_string(admin_store_timeout.count())
                               + " ms (busy?): try again")
           : http_error(503, who + " is gone: " + caf::to_string(e));
}

/// Asks `to` within admin_store_timeout: `then` gets the reply; without
/// one, `rp` gets the answer that says why.
template <class Reply, class Handle, class Msg, class Then>
void ask(admin_self self, const Handle& to, Msg msg, std::string who, promise rp, Then then) {
  self->request(to, admin_store_timeout, std::move(msg))
    .then([then = std::move(then)](Reply& r) mutable { then(r); },
          [rp, who = std::move(who)](caf::error& e) mutable { rp.deliver(no_reply(e, who)); });
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

// -- answers needing no other actor -----------------------------------------

http_answer root_answer() {
  json_writer w;
  w.begin_object().str("status", "ok").str("service", "LMCache HTTP API")
    .str("server", std::string{"kvsidecar "} + kvs::version).end_object();
  return json(w);
}

http_answer healthcheck_answer() {
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

http_answer config_adapters_answer(const config& cfg) {
  json_writer w;
  w.begin_object().begin_array("adapters");
  adapters(w, cfg, false);
  w.end_array().end_object();
  return json(w);
}

// -- GET /status ----------------------------------------------------------------

/// `r`: the store's figures (null: the cache server is off).
http_answer status_answer(const config& cfg, const store_status* r) {
  auto& h = health();
  bool healthy = h.alive.load() && h.ready.load() && !h.draining.load();
  json_writer w;
  w.begin_object()
    .boolean("is_healthy", healthy)
    .str("engine_type", "kvsidecar")
    .integer("chunk_size", static_cast<uint64_t>(cfg.cache.chunk_size));
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
      .num("trigger_watermark", cfg.cache.evict_high)
      .end_object()
      .begin_array("l2_adapters");
    adapters(w, cfg, true);
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

answer status_call(admin_self self) {
  auto& st = self->state;
  if (!st.p.cfg->cache.enabled)
    return status_answer(*st.p.cfg, nullptr);
  if (!st.store)
    return store_missing(*st.p.cfg);
  auto rp = self->make_response_promise<http_answer>();
  ask<store_status>(self, st.store, store_status_query{}, "the store", rp,
                    [rp, cfg = st.p.cfg](store_status& r) mutable {
                      rp.deliver(status_answer(*cfg, &r));
                    });
  return rp;
}

// -- /quota ------------------------------------------------------------------

enum class quota_op { list, get, set, remove };

http_answer quota_answer(quota_op what, const std::string& salt, double limit_gb,
                         const store_quota_reply& r) {
  json_writer w;
  auto name = std::string{cache_salt_name(salt)};
  switch (what) {
  case quota_op::list:
    w.begin_object().begin_object("users");
    for (auto& u : r.salts)
      w.begin_object(cache_salt_name(u.salt))
        .num("limit_gb", static_cast<double>(u.limit.value_or(0)) / gib)
        .num("current_usage_gb", static_cast<double>(u.bytes) / gib)
        .end_object();
    w.end_object().end_object();
    break;
  case quota_op::get: {
    auto& u = r.salts.at(0);
    w.begin_object()
      .str("cache_salt", name)
      .num("limit_gb", static_cast<double>(u.limit.value_or(0)) / gib)
      .num("current_usage_gb", static_cast<double>(u.bytes) / gib)
      .boolean("exists", r.ok)
      .end_object();
    break;
  }
  case quota_op::set:
    if (!r.ok)
      return http_error(400, "too many quotas: at most "
                                + std::to_string(salt_quota_max_limits) + " salts have one");
    w.begin_object()
      .str("cache_salt", name)
      .num("limit_gb", limit_gb)
      .str("status", "ok")
      .integer("evicted_chunks", r.evicted)
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

/// GET|PUT|DELETE /quota[/{salt}]: `msg` is the store's message for `what`.
template <class Msg>
answer quota(admin_self self, quota_op what, Msg msg, const std::string& salt,
             uint64_t limit_bytes, double limit_gb) {
  auto& st = self->state;
  if (!st.store)
    return store_missing(*st.p.cfg);
  auto rp = self->make_response_promise<http_answer>();
  // l2.quota_mode = "isolated": the limits govern L2 as LMCache's do, and
  // the usage reported is L2's (LMCache's quota API reads its L2 adapters).
  l2_actor tier2 = st.p.cfg->l2.quota_isolated ? st.l2 : l2_actor{};
  ask<store_quota_reply>(
    self, st.store, std::move(msg), "the store", rp,
    [self, rp, what, salt, limit_bytes, limit_gb, tier2](store_quota_reply& r) mutable {
      if (tier2) {
        if (what == quota_op::set && r.ok)
          caf::anon_send(tier2, l2_quota_limit{salt, limit_bytes});
        else if (what == quota_op::remove)
          caf::anon_send(tier2, l2_quota_limit{salt, std::nullopt});
        if (what == quota_op::list || what == quota_op::get) {
          ask<l2_usage>(self, tier2, l2_usage_atom_v, "the L2 actor", rp,
                        [rp, what, salt, limit_gb, r = std::move(r)](l2_usage& u) mutable {
                          auto& by_salt = u.bytes_by_salt;
                          for (auto& s : r.salts) {
                            auto it = by_salt.find(s.salt);
                            s.bytes = it == by_salt.end() ? 0 : it->second;
                          }
                          rp.deliver(quota_answer(what, salt, limit_gb, r));
                        });
          return;
        }
      }
      rp.deliver(quota_answer(what, salt, limit_gb, r));
    });
  return rp;
}

// -- POST /cache/clear -----------------------------------------------------------

http_answer clear_answer(const config& cfg, const std::string& tier, bool l1, uint64_t l1_chunks,
                         bool l2, uint64_t l2_objects) {
  json_writer w;
  w.begin_object().str("status", "ok").begin_object("cleared").str("tier", tier).end_object();
  if (l1)
    w.integer("chunks", l1_chunks);
  if (l2) {
    w.integer("l2_objects", l2_objects);
    if (cfg.l2.redis.enabled)
      w.str("l2_not_cleared", "redis: shared by every node, not one node's to empty (its keys "
                              "expire by l2.redis.ttl or LRU)");
  }
  w.end_object();
  return json(w);
}

/// L1 through the store, then L2's node-local tier through the L2 actor,
/// by the call's tier ("l1", "l2", "all").
answer clear(admin_self self, const admin_req::cache_clear& c) {
  auto& st = self->state;
  const bool l1 = c.tier == "l1" || c.tier == "all";
  const bool l2 = c.tier == "l2" || c.tier == "all";
  l2_actor tier2 = st.l2;
  if (l2 && !tier2)
    return http_error(400, "tier '" + c.tier + "': no L2 tier is configured (l2.disk, l2.redis)");
  if (l1 && !st.store)
    return store_missing(*st.p.cfg);
  auto rp = self->make_response_promise<http_answer>();
  auto then_l2 = [self, rp, tier2, l1, l2, tier = c.tier,
                  cfg = st.p.cfg](uint64_t l1_chunks) mutable {
    if (!l2) {
      rp.deliver(clear_answer(*cfg, tier, l1, l1_chunks, false, 0));
      return;
    }
    // The disk tier's files are removed (and announced BlockRemoved "DISK")
    // on the L2 actor's thread; a Redis every node shares is not one node's
    // to empty.
    ask<uint64_t>(self, tier2, clear_l2_atom_v, "the L2 actor", rp,
                  [rp, cfg, tier, l1, l1_chunks](uint64_t n) mutable {
                    rp.deliver(clear_answer(*cfg, tier, l1, l1_chunks, true, n));
                  });
  };
  if (l1) {
    ask<uint64_t>(self, st.store, store_clear_l1{}, "the store", rp,
                  [then_l2](uint64_t removed) mutable { then_l2(removed); });
  } else {
    then_l2(0);
  }
  return rp;
}

// -- /cache/prefetches ---------------------------------------------------------

/// The chunk hashes of a call's tokens under its model, world size and salt.
std::vector<uint64_t> hashes_of(const config& cfg, const admin_req::token_chunks& c) {
  auto cs = static_cast<size_t>(cfg.cache.chunk_size);
  return prefix_chunk_hashes(c.tokens.data(), c.tokens.size(), cs, c.tokens.size() / cs,
                             identity_seed(c.model, c.world_size, c.salt));
}

void prefetch_done(admin_state& st, const std::string& id, uint64_t found, std::string error) {
  --st.running;
  auto& j = st.jobs[id];
  j.done = true;
  j.found = found;
  j.error = std::move(error);
  st.finished.push_back(id);
  while (st.finished.size() > admin_kept_prefetches) {
    st.jobs.erase(st.finished.front());
    st.finished.pop_front();
  }
}

answer prefetch(admin_self self, const admin_req::prefetch_submit& c) {
  auto& st = self->state;
  auto& cfg = *st.p.cfg;
  auto cs = static_cast<size_t>(cfg.cache.chunk_size);
  auto hashes = hashes_of(cfg, c);
  json_writer w;
  if (hashes.empty()) {
    w.begin_object().integer("chunks", 0).str("status", "noop").end_object();
    return http_answer{202, w.take()};
  }
  if (!st.store)
    return store_missing(cfg);
  const uint64_t n_chunks = hashes.size();
  if (st.running >= admin_max_prefetches)
    return http_error(503, "too many prefetches in flight (at most "
                              + std::to_string(admin_max_prefetches) + "); try again");
  std::string id = "pf-" + std::to_string(st.next_job++);
  ++st.running;
  st.jobs[id].total = hashes.size() * static_cast<uint64_t>(c.world_size);
  // The store's LOOKUP is the prefetch: what L1 misses comes from L2 into
  // L1, under a session of its own whose locks are given back at once.
  std::string session = "http-prefetch:" + id;
  auto ranks = static_cast<uint64_t>(c.world_size);
  store_lookup q{session, std::move(hashes), static_cast<int32_t>(c.world_size), 1, c.model,
                 c.salt, 0};
  if (cfg.l2.format == l2_format::lmcache) {
    // LMCache's object names for what L1 misses, as a session's LOOKUP
    // carries them (a token outside uint32 ends the names, as LMCache's keys).
    q.l2_names = prefix_l2_names(c.tokens.data(), c.tokens.size(), cs, n_chunks);
    q.tokens = prefix_l2_tokens(c.tokens.data(), c.tokens.size(), q.l2_names.size() * cs);
  }
  // No deadline: an L2 fetch may take a while; the job stays pending until
  // the store answers (or is gone).
  auto store = st.store;
  self->request(store, caf::infinite, std::move(q))
    .then(
      [self, store, session, id, ranks](uint64_t hit) {
        caf::anon_send(store, store_end_session{session});
        prefetch_done(self->state, id, hit * ranks, {});
      },
      [self, store, session, id](caf::error& e) {
        caf::anon_send(store, store_end_session{session});
        prefetch_done(self->state, id, 0, caf::to_string(e));
      });
  w.begin_object()
    .str("request_id", id)
    .integer("chunks", n_chunks)
    .str("status", "submitted")
    .end_object();
  return http_answer{202, w.take()};
}

http_answer prefetch_status(admin_state& st, const admin_req::prefetch_status& c) {
  auto i = st.jobs.find(c.request_id);
  if (i == st.jobs.end())
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
  st.finished.erase(std::find(st.finished.begin(), st.finished.end(), c.request_id));
  st.jobs.erase(i);
  return {200, w.take()};
}

// -- /cache/objects --------------------------------------------------------------

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

store_objects_filter filter_of(const admin_req::objects_filter& c) {
  return store_objects_filter{c.by_model, c.by_salt, c.model, c.salt};
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

http_answer l2_objects_answer(const l2_objects_page& r) {
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

http_answer l1_objects_answer(const store_objects_page& r) {
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

/// GET /cache/objects: L2 (tier l2, LMCache's default) through the L2
/// actor, L1 (tier l1) through the store.
answer objects_list(admin_self self, const admin_req::objects_list& c) {
  auto& st = self->state;
  // Every early answer comes before the promise: once made, it is the
  // only way back to the caller.
  if (c.tier == "l2" && !st.l2)
    return http_error(503, "no L2 adapters configured (l2.disk, l2.redis); tier=l1 lists L1");
  if (c.tier != "l2" && !st.store)
    return store_missing(*st.p.cfg);
  auto rp = self->make_response_promise<http_answer>();
  if (c.tier == "l2") {
    l2_list_objects q;
    q.adapter = c.adapter;
    if (c.by_model)
      q.model = c.model;
    if (c.by_salt)
      q.salt = c.salt;
    q.offset = c.cursor;
    q.limit = c.page_size;
    ask<l2_objects_page>(self, st.l2, std::move(q), "the L2 actor", rp,
                         [rp](l2_objects_page& r) mutable { rp.deliver(l2_objects_answer(r)); });
    return rp;
  }
  store_list_objects q{filter_of(c), c.cursor, c.page_size};
  ask<store_objects_page>(self, st.store, std::move(q), "the store", rp,
                          [rp](store_objects_page& r) mutable { rp.deliver(l1_objects_answer(r)); });
  return rp;
}

http_answer deleted_answer(uint64_t deleted, uint64_t skipped) {
  json_writer w;
  // LMCache's answer ("skipped": the locked ones).
  w.begin_object()
    .integer("deleted", deleted)
    .integer("skipped", skipped)
    .boolean("ok", true)
    .end_object();
  return json(w);
}

/// DELETE /cache/objects' L1 part, after L2's `l2_deleted_keys`.
void l1_objects_delete(admin_self self, const admin_req::objects_delete& c,
                       uint64_t l2_deleted_keys, promise rp) {
  auto& st = self->state;
  if (!st.store) {
    rp.deliver(store_missing(*st.p.cfg));
    return;
  }
  store_delete_objects q;
  q.filter = filter_of(c);
  q.by_keys = c.by_keys;
  for (auto& k : c.keys) {
    stored_object n;
    n.key = chunk_key{k.hash, k.rank};
    n.model = k.model;
    n.salt = k.salt;
    q.named.push_back(std::move(n));
  }
  ask<store_deleted>(self, st.store, std::move(q), "the store", rp,
                     [rp, l2_deleted_keys](store_deleted& r) mutable {
                       rp.deliver(deleted_answer(r.removed + l2_deleted_keys, r.locked));
                     });
}

/// DELETE /cache/objects: "l2" (LMCache's default) by LMCache's keys through
/// the L2 actor; "l1" through the store; "all": L2, then L1.
answer objects_delete(admin_self self, const admin_req::objects_delete& c) {
  auto& st = self->state;
  if (c.tier != "l1" && !st.l2)
    return http_error(503, "no L2 adapters configured (l2.disk, l2.redis); tier \"l1\" "
                           "deletes L1's chunks");
  auto rp = self->make_response_promise<http_answer>();
  if (c.tier == "l1") {
    l1_objects_delete(self, c, 0, rp);
    return rp;
  }
  l2_delete_objects q;
  q.adapter = c.adapter;
  for (auto& k : c.keys)
    q.keys.push_back(object_key_fields{k.model, static_cast<uint32_t>(k.rank), k.group,
                                       unhex(k.hash_hex), k.salt});
  ask<l2_deleted>(self, st.l2, std::move(q), "the L2 actor", rp,
                  [self, rp, c](l2_deleted& r) mutable {
                    if (r.status != 200)
                      rp.deliver(http_error(r.status, r.error));
                    else if (c.tier == "l2")
                      rp.deliver(deleted_answer(r.deleted, 0));
                    else
                      l1_objects_delete(self, c, r.deleted, rp);
                  });
  return rp;
}

// -- POST /cache/checksums ---------------------------------------------------------

/// By token ids: MD5 of each L1 chunk, hashed here while the store holds
/// them read-locked (in place, unevictable), off the store's thread; the
/// locks go back whatever happens.
answer checksums(admin_self self, const admin_req::chunk_checksums& c) {
  auto& st = self->state;
  auto cs = static_cast<size_t>(st.p.cfg->cache.chunk_size);
  auto hashes = hashes_of(*st.p.cfg, c);
  auto digest = [cs, kv_rank = c.kv_rank](const std::vector<stored_object>& objects) {
    uint64_t bytes = 0;
    for (auto& o : objects)
      bytes += o.found ? o.bytes : 0;
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
    for (auto& o : objects)
      if (o.found)
        w.str("", md5_hex(o.data, o.bytes));
      else
        w.null("");
    w.end_array().boolean("layerwise", false).begin_array("token_ranges");
    for (size_t i = 0; i < objects.size(); ++i)
      w.begin_array().integer("", i * cs).integer("", (i + 1) * cs).end_array();
    w.end_array().integer("kv_rank", static_cast<uint64_t>(kv_rank)).end_object();
    return json(w);
  };
  if (hashes.empty())
    return digest({});
  if (!st.store)
    return store_missing(*st.p.cfg);
  store_lock_chunks q;
  for (auto h : hashes)
    q.keys.push_back(chunk_key{h, static_cast<int32_t>(c.kv_rank)});
  auto rp = self->make_response_promise<http_answer>();
  ask<store_locked_chunks>(self, st.store, std::move(q), "the store", rp,
                           [self, rp, digest](store_locked_chunks& r) mutable {
                             auto a = digest(r.objects);
                             // Before any later call of ours reaches the store (one
                             // sender's messages keep their order).
                             if (!r.tokens.empty())
                               self->send(self->state.store,
                                          store_unlock_chunks{std::move(r.tokens)});
                             rp.deliver(std::move(a));
                           });
  return rp;
}

/// LMCache's block-id form: the engine's KV blocks, a chunk at a time from
/// the gpu-transfer actor (the pools stay the actor's), hashed here in
/// batches whose MD5 streams (a chunk's, or each of its layers') fill the
/// SIMD lanes of cache/md5_lanes.hpp. A batch holds up to a lane's worth of
/// chunks (8 on AVX2, 16 on AVX-512; 1 where the CPU has no SIMD path)
/// rather than one: the peak is the batch's bytes, at most the call's own
/// bound (admin_checksum_max_bytes, 256 MiB, or the call is refused with
/// 413 before any read), e.g. all 256 MiB of a `lmcache bench server`
/// request's 8 chunks of 32 MiB, against 32 MiB one chunk at a time. Filling
/// the lanes is what makes hashing ~8x faster; holding fewer chunks would
/// leave lanes idle.
struct block_job {
  admin_req::block_checksums call;
  gpu_checksum_read q;
  gpu_transfer_actor gpu;
  std::vector<block_checksum_chunk> batch;       // read, not hashed yet
  std::vector<std::vector<std::string>> digests; // [chunk][one, or per layer]
  promise rp;
};

/// Chunks to hash together: enough streams for every lane (each chunk is one
/// stream, or one per layer when layerwise).
size_t batch_chunks(const block_checksum_chunk& first, bool layerwise) {
  const size_t lanes = md5_lanes_of(md5_path::best);
  const size_t streams = layerwise ? std::max<size_t>(1, first.layer_end.size()) : 1;
  return (lanes + streams - 1) / streams;
}

http_answer block_answer(const block_job& j) {
  auto& c = j.call;
  auto& digests = j.digests;
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

/// Keeps a hashed chunk's bytes for the next read, within the bound.
void keep_spare(admin_state& st, std::vector<uint8_t>&& bytes) {
  if (bytes.capacity() == 0 || st.spare_bytes + bytes.capacity() > admin_checksum_max_bytes)
    return;
  st.spare_bytes += bytes.capacity();
  st.spare_buffers.push_back(std::move(bytes));
  st.spare_used = std::chrono::steady_clock::now();
}

/// Asks for the job's next chunk (read into a spare buffer when there is
/// one); answers after the last.
void next_block_chunk(admin_self self, std::shared_ptr<block_job> j) {
  auto& st = self->state;
  gpu_checksum_read q;
  q.instance_id = j->q.instance_id;
  q.query = j->q.query;
  if (!st.spare_buffers.empty()) {
    q.buffer = std::move(st.spare_buffers.back());
    st.spare_buffers.pop_back();
    st.spare_bytes -= q.buffer.capacity();
    st.spare_used = std::chrono::steady_clock::now();
  }
  ask<block_checksum_chunk>(self, j->gpu, std::move(q), "the gpu-transfer actor", j->rp,
                            [self, j](block_checksum_chunk& r) {
                              if (r.status != 200) {
                                j->rp.deliver(http_error(r.status, r.error));
                                return;
                              }
                              const bool last = ++j->q.query.chunk >= r.num_chunks;
                              const size_t target = batch_chunks(r, j->call.layerwise);
                              j->batch.push_back(std::move(r));
                              if (last || j->batch.size() >= target) {
                                auto d = chunk_digests(j->batch.data(), j->batch.size(),
                                                       j->call.layerwise);
                                for (auto& c : j->batch)
                                  keep_spare(self->state, std::move(c.bytes));
                                j->batch.clear();
                                for (auto& one : d)
                                  j->digests.push_back(std::move(one));
                              }
                              if (!last)
                                next_block_chunk(self, j);
                              else
                                j->rp.deliver(block_answer(*j));
                            });
}

answer block_checksums(admin_self self, const admin_req::block_checksums& c) {
  auto& st = self->state;
  if (!st.gpu)
    return store_missing(*st.p.cfg);
  auto j = std::make_shared<block_job>();
  j->call = c;
  j->gpu = st.gpu;
  j->q.instance_id = c.instance_id;
  j->q.query.block_ids = c.block_ids;
  j->q.query.chunk_blocks = c.chunk_blocks;
  j->q.query.max_bytes = admin_checksum_max_bytes;
  j->q.query.chunk = 0;
  j->rp = self->make_response_promise<http_answer>();
  next_block_chunk(self, j);
  return j->rp;
}

/// `f` answers calls of type `Req`, each counted.
template <class Req, class F>
auto counted(admin_self self, F f) {
  return [self, f](const Req& c) -> answer {
    ++self->state.calls;
    return f(c);
  };
}

stats_snapshot snapshot(const admin_state& st) {
  stats_snapshot s;
  s.actor = st.label;
  s.log_only("calls", static_cast<double>(st.calls))
    .log_only("prefetches_running", static_cast<double>(st.running))
    .log_only("prefetch_jobs", static_cast<double>(st.jobs.size()))
    .log_only("checksum_spare_bytes", static_cast<double>(st.spare_bytes));
  return s;
}

} // namespace

admin_actor::behavior_type admin(admin_self self, admin_params p) {
  auto& st = self->state;
  st.p = std::move(p);
  st.label = log::label(admin_state::name, "", self->id());
  log_lifecycle(self, st.label, "started: serving LMCache's HTTP control plane's calls");
  arm_stats(self, st.p.stats_interval);
  namespace req = admin_req;
  return {
    [self](watch_atom, store_actor& store, l2_actor& l2, gpu_transfer_actor& gpu) {
      auto& st = self->state;
      st.store = std::move(store);
      st.l2 = std::move(l2);
      st.gpu = std::move(gpu);
    },
    counted<req::root>(self, [](const req::root&) -> answer { return root_answer(); }),
    counted<req::healthcheck>(self, [](const req::healthcheck&) -> answer {
      return healthcheck_answer();
    }),
    counted<req::status>(self, [self](const req::status&) { return status_call(self); }),
    counted<req::config>(self, [self](const req::config&) -> answer {
      return http_answer{200, self->state.p.cfg->effective_json};
    }),
    counted<req::config_adapters>(self, [self](const req::config_adapters&) -> answer {
      return config_adapters_answer(*self->state.p.cfg);
    }),
    counted<req::version>(self, [](const req::version& c) -> answer {
      return http_answer{200, json_quote(c.path == "/version"
                                           ? std::string{"kvsidecar "} + kvs::version
                                           : std::string{kvs::version})};
    }),
    counted<req::cache_clear>(self, [self](const req::cache_clear& c) { return clear(self, c); }),
    counted<req::quota_list>(self, [self](const req::quota_list&) {
      return quota(self, quota_op::list, store_quota_list{}, {}, 0, 0);
    }),
    counted<req::quota_get>(self, [self](const req::quota_get& c) {
      return quota(self, quota_op::get, store_quota_get{c.salt}, c.salt, 0, 0);
    }),
    counted<req::quota_set>(self, [self](const req::quota_set& c) {
      return quota(self, quota_op::set, store_quota_set{c.salt, c.limit_bytes}, c.salt,
                   c.limit_bytes, c.limit_gb);
    }),
    counted<req::quota_delete>(self, [self](const req::quota_delete& c) {
      return quota(self, quota_op::remove, store_quota_delete{c.salt}, c.salt, 0, 0);
    }),
    counted<req::prefetch_submit>(self, [self](const req::prefetch_submit& c) {
      return prefetch(self, c);
    }),
    counted<req::prefetch_status>(self, [self](const req::prefetch_status& c) -> answer {
      return prefetch_status(self->state, c);
    }),
    counted<req::objects_list>(self, [self](const req::objects_list& c) {
      return objects_list(self, c);
    }),
    counted<req::objects_delete>(self, [self](const req::objects_delete& c) {
      return objects_delete(self, c);
    }),
    counted<req::chunk_checksums>(self, [self](const req::chunk_checksums& c) {
      return checksums(self, c);
    }),
    counted<req::block_checksums>(self, [self](const req::block_checksums& c) {
      return block_checksums(self, c);
    }),
    [self](stats_atom) {
      auto& st = self->state;
      if (!st.spare_buffers.empty() &&
          std::chrono::steady_clock::now() - st.spare_used > admin_spare_idle) {
        st.spare_buffers.clear();
        st.spare_bytes = 0;
      }
      log_stats(self, snapshot(self->state), self->state.p.stats_interval);
    },
    [self](metrics_atom, const caf::actor& to) { send_snapshot(self, to, snapshot(self->state)); },
  };
}

} // namespace kvs
