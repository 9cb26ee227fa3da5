#include "actors/store.hpp"

#include "actors/actor_logging.hpp"
#include "actors/event_announce.hpp"
#include "config/config.hpp"
#include "messages/lmcache_protocol.hpp"

namespace kvs {

namespace {

using self_ptr = store_actor::stateful_pointer<store_state>;

/// Hands a batch of our own events to the configured publisher (if any),
/// through the same bounded queue as the engine's batches.
void announce(self_ptr self, std::vector<kv_event> events) {
  auto& st = self->state;
  announce_events(self, st.p.events, st.p.events_queue, std::move(events), &st.events_dropped);
}

/// BlockRemoved for evicted rank-0 chunks (one announcement per prefix hash).
void announce_removed(self_ptr self, const std::vector<chunk_key>& keys) {
  std::vector<kv_event> events;
  for (auto& k : keys) {
    ++self->state.evicted;
    if (k.rank != 0)
      continue;
    block_removed e;
    e.block_hashes.push_back(k.hash);
    e.medium = "CPU";
    events.emplace_back(std::move(e));
  }
  announce(self, std::move(events));
}

} // namespace

void announce_evicted(self_ptr self, const std::vector<chunk_key>& keys) {
  announce_removed(self, keys);
}

store_actor::behavior_type store(store_actor::stateful_pointer<store_state> self,
                                 store_params params) {
  auto& st = self->state;
  st.p = std::move(params);
  st.label = log::label(store_state::name, "", self->id());
  index_options io;
  io.evict_high = st.p.evict_high;
  io.evict_low = st.p.evict_low;
  io.lock_ttl = st.p.lock_ttl;
  st.index = std::make_unique<chunk_index>(*st.p.pool, io);
  ledger_options lo;
  lo.session_ttl = st.p.session_ttl;
  st.ledger = std::make_unique<lock_ledger>(*st.index, lo);
  log_lifecycle(self, st.label,
                fmt::format("started: L1 pool of {} MiB, evict between {:.0f}% and {:.0f}%, "
                            "lock_ttl {}",
                            st.p.pool->mapped_bytes() >> 20, st.p.evict_high * 100,
                            st.p.evict_low * 100, to_string(st.p.lock_ttl)));
  arm_stats(self, st.p.stats_interval);
  // Lock and session TTLs are enforced here too, whatever sessions do.
  auto expiry = std::clamp<std::chrono::nanoseconds>(st.p.lock_ttl / 4,
                                                     std::chrono::milliseconds{10},
                                                     std::chrono::seconds{1});
  self->delayed_send(self, expiry, tick_atom_v);
  return {
    [self](store_lookup& q) -> caf::result<uint64_t> {
      auto& st = self->state;
      auto hits = st.ledger->lookup(q.session, q.hashes.data(), q.hashes.size(), q.world_size,
                                    q.readers_per_key, cache_clock::now());
      if (l2_wants_prefetch(self, q, hits)) // L2 hook: the rest of the prefix from L2
        return l2_prefetch(self, std::move(q), hits);
      return static_cast<uint64_t>(hits);
    },
    [self](store_release_range& q) {
      auto& ledger = *self->state.ledger;
      if (q.rank)
        ledger.release_rank(q.session, *q.rank, q.begin, q.end, cache_clock::now(), UINT32_MAX);
      else
        ledger.release_range(q.session, q.begin, q.end, cache_clock::now());
    },
    [self](store_end_session& q) -> uint64_t {
      self->state.p.l2.fetches.erase(q.session); // L2 hook: a late prefetch takes no locks
      return self->state.ledger->end_session(q.session);
    },
    [self](store_reserve& q) -> store_reserve_reply {
      auto& st = self->state;
      store_reserve_reply out;
      out.slot_bytes = st.p.pool->slot_bytes();
      auto now = cache_clock::now();
      std::vector<chunk_key> reserved;
      for (size_t i = 0; i < q.hashes.size(); ++i) {
        chunk_key k{q.hashes[i], q.rank};
        auto r = st.index->reserve(k, st.p.pool->slot_bytes(), now);
        announce_removed(self, r.evicted);
        if (r.status == reserve_status::already_present) {
          ++out.already_present;
          continue;
        }
        if (r.status == reserve_status::no_space) {
          for (auto& rk : reserved)
            st.index->abort(rk);
          ++st.refused;
          out.ok = false;
          out.chunks.clear();
          out.why = std::string{"no space in L1: "} + to_string(r.reason)
                    + (r.detail.empty() ? "" : " (" + r.detail + ")");
          KVS_WARN(st.label, "store of {} chunks on rank {} refused: {}", q.hashes.size(), q.rank,
                   out.why);
          return out;
        }
        reserved.push_back(k);
        out.chunks.push_back(reserved_chunk{i, reinterpret_cast<uint8_t*>(r.data)});
      }
      out.ok = true;
      return out;
    },
    [self](store_finish& f) {
      auto& st = self->state;
      std::vector<kv_event> events;
      for (size_t i = 0; i < f.hashes.size(); ++i) {
        chunk_key k{f.hashes[i], f.rank};
        if (!f.commit) {
          st.index->abort(k);
          continue;
        }
        if (!st.index->commit(k))
          continue;
        ++st.stored;
        l2_stage(self, f, i); // L2 hook: write-through
        if (f.rank != 0)
          continue;
        block_stored e;
        e.block_hashes.push_back(k.hash);
        e.parent_block_hash = f.parents[i];
        e.token_ids = std::move(f.tokens[i]);
        e.block_size = st.p.chunk_size;
        e.medium = "CPU";
        events.emplace_back(std::move(e));
      }
      l2_flush(self); // L2 hook
      announce(self, std::move(events));
    },
    [self](store_acquire& q) -> store_acquire_reply {
      auto& st = self->state;
      store_acquire_reply out;
      out.slot_bytes = st.p.pool->slot_bytes();
      store_state::read_ticket t;
      t.session = q.session;
      t.rank = q.rank;
      t.begin = q.begin;
      t.end = q.begin + q.hashes.size();
      auto now = cache_clock::now();
      for (size_t i = 0; i < q.hashes.size(); ++i) {
        chunk_key k{q.hashes[i], q.rank};
        auto e = st.index->find(k);
        std::optional<lock_token> tok;
        if (e && e->state == entry_state::committed)
          tok = st.index->lock(k, 1, now);
        if (!tok) {
          for (auto& l : t.locks)
            st.index->unlock(l);
          // The lookup's locks on this range are consumed all the same.
          st.ledger->release_rank(q.session, q.rank, t.begin, t.end, now);
          out.ok = false;
          out.why = "chunk " + std::to_string(q.begin + i) + " of rank " + std::to_string(q.rank)
                    + " is not in L1";
          return out;
        }
        t.locks.push_back(*tok);
        out.slots.push_back(reinterpret_cast<uint8_t*>(e->data));
      }
      out.ok = true;
      out.ticket = st.next_ticket++;
      st.tickets.emplace(out.ticket, std::move(t));
      return out;
    },
    [self](store_release& r) {
      auto& st = self->state;
      auto i = st.tickets.find(r.ticket);
      if (i == st.tickets.end())
        return;
      auto now = cache_clock::now();
      for (auto& l : i->second.locks)
        st.index->unlock(l);
      st.ledger->release_rank(i->second.session, i->second.rank, i->second.begin, i->second.end,
                              now);
      st.tickets.erase(i);
    },
    [self](store_configure& c) -> store_configure_reply {
      auto& st = self->state;
      store_configure_reply out;
      auto& pool = *st.p.pool;
      if (!pool.configured()) {
        std::string err;
        out.ok = pool.configure(c.slot_bytes, &err);
        out.why = err;
        if (out.ok)
          KVS_INFO(st.label, "chunk slots of {} KiB: {} slots in L1", c.slot_bytes >> 10,
                   pool.slot_count());
      } else if (c.slot_bytes <= pool.slot_bytes()) {
        out.ok = true;
      } else {
        out.why = "chunks of " + std::to_string(c.slot_bytes) + " bytes do not fit the slots of "
                  + std::to_string(pool.slot_bytes()) + " bytes sized by the first registration";
      }
      out.slot_bytes = pool.slot_bytes();
      return out;
    },
    [self](mp_call& call) {
      // CLEAR: drop every unlocked chunk.
      auto& st = self->state;
      auto removed = st.index->clear();
      KVS_INFO(st.label, "clear: {} chunks dropped", removed.size());
      announce_removed(self, removed);
      auto bridge = caf::actor_cast<engine_bridge_actor>(self->current_sender());
      self->send(bridge, make_reply(call, std::nullopt));
    },
    [self, expiry](tick_atom) {
      auto& st = self->state;
      auto now = cache_clock::now();
      auto sessions = st.ledger->expire_sessions(now);
      auto locks = st.index->expire_locks(now);
      auto stale = st.index->expire_reservations(now);
      if (sessions + locks + stale.size() > 0)
        KVS_WARN(st.label, "expired: {} idle sessions, {} read locks past lock_ttl, {} "
                           "reservations never committed", sessions, locks, stale.size());
      self->delayed_send(self, expiry, tick_atom_v);
    },
    [self](stats_atom) {
      auto& st = self->state;
      auto s = st.index->stats();
      KVS_INFO(st.label,
               "stats: chunks={} reserved={} used={}MiB/{}MiB locks={} locked_chunks={} "
               "sessions={} hits={} misses={} stored={} evicted={} refused={} events_dropped={}",
               s.chunks, s.reserved, s.slot_bytes_used >> 20, s.capacity_bytes >> 20,
               s.outstanding_readers, s.locked_entries, st.ledger->session_count(), s.hit_chunks,
               s.miss_chunks, st.stored, st.evicted, st.refused, st.events_dropped);
      l2_log_stats(self); // L2 hook
      self->delayed_send(self, st.p.stats_interval, stats_atom_v);
    },
  };
}

} // namespace kvs
