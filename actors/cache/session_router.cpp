#include "actors/cache/session_router.hpp"

#include "actors/actor_logging.hpp"
#include "actors/cache/session.hpp"
#include "actors/cache/sweep.hpp"
#include "config/config.hpp"
#include "lmcache_wire/lmcache_ops.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"

#include <caf/exit_reason.hpp>
#include <caf/send.hpp>

#include <algorithm>

namespace kvs {

namespace {

using self_ptr = session_router_actor::stateful_pointer<session_router_state>;

/// Idle sessions named one by one in the log per sweep; the rest are counted.
constexpr size_t idle_sessions_logged = 10;

void reply(self_ptr self, mp_reply r) {
  self->send(self->state.bridge, std::move(r));
}

/// The session of `rid`, spawned if needed; nullptr when there is none and
/// cache.max_sessions are live.
session_router_state::session_entry* session_for(self_ptr self, const std::string& rid) {
  auto& st = self->state;
  auto i = st.sessions.find(rid);
  if (i != st.sessions.end())
    return &i->second;
  if (st.sessions.size() >= st.p.max_sessions)
    return nullptr;
  session_params sp;
  sp.request_id = rid;
  sp.chunk_size = st.p.chunk_size;
  sp.l2_lmcache_names = st.p.l2_lmcache_names;
  sp.bridge = st.bridge;
  sp.store = st.p.store;
  sp.gpu = st.p.gpu;
  ++st.started;
  auto s = self->home_system().spawn(session, std::move(sp));
  return &st.sessions.emplace(rid, session_router_state::session_entry{s, {}, {}, {}}).first->second;
}

/// `identity` sent requests to the session of `rid` (remembered once, both ways).
void note_peer(session_router_state& st, const std::string& rid,
               session_router_state::session_entry& e, const std::string& identity) {
  if (std::find(e.peers.begin(), e.peers.end(), identity) != e.peers.end())
    return;
  e.peers.push_back(identity);
  st.by_peer[identity].push_back(rid);
}

/// Forgets the session `i` (its peers' index entries with it).
void erase_session(session_router_state& st,
                   std::unordered_map<std::string, session_router_state::session_entry>::iterator i) {
  for (auto& peer : i->second.peers) {
    auto p = st.by_peer.find(peer);
    if (p == st.by_peer.end())
      continue;
    auto& rids = p->second;
    rids.erase(std::remove(rids.begin(), rids.end(), i->first), rids.end());
    if (rids.empty())
      st.by_peer.erase(p);
  }
  st.sessions.erase(i);
}

/// Ends the sessions that used `instance`; how many.
size_t end_sessions_of(self_ptr self, int64_t instance);

void end_session(self_ptr self, const std::string& rid) {
  auto& st = self->state;
  auto i = st.sessions.find(rid);
  if (i == st.sessions.end())
    return;
  self->send(i->second.actor, end_atom_v);
  erase_session(st, i);
  ++st.ended;
}

/// Ops whose row routes them to a new session (LOOKUP, the copies): to the
/// request's session, spawned on demand.
void route_to_session(self_ptr self, mp_call& call, const std::string& rid) {
  auto& st = self->state;
  const auto& req = *call.request;
  const auto& row = op_row(req.op);
  auto* s = session_for(self, rid);
  if (!s) {
    // cache.max_sessions are live: refused like an unknown job, so a client
    // inventing request ids cannot grow the process without bound. An op
    // the router acks (LOOKUP) is acked (its prefetch queries then report 0
    // hits); one with a failure value gets it (STORE/RETRIEVE: (b"", False)).
    st.rejected.note(st.label, hex(call.identity), hex(req.uid_frame), row.name,
                     "session_limit",
                     std::to_string(st.sessions.size())
                       + " sessions live (cache.max_sessions): request id " + rid + " refused");
    if (auto body = failure_body(req.op); body || row.ack == mp_ack::router)
      reply(self, make_reply(call, std::move(body)));
    else
      reply(self, make_failure_reply(call, "too many sessions (cache.max_sessions)"));
    return;
  }
  s->last_active = session_router_state::clock::now();
  note_peer(st, rid, *s, call.identity);
  int64_t instance = instance_of(req).value_or(-1);
  if (instance >= 0) {
    self->send(st.p.registry, seen_atom_v, instance, false);
    if (std::find(s->instances.begin(), s->instances.end(), instance) == s->instances.end())
      s->instances.push_back(instance);
  }
  // LMCache acks a LOOKUP at once (the result comes through the prefetch
  // queries): the row says the router answers, without a hop to the session.
  if (row.ack == mp_ack::router)
    reply(self, make_reply(call, std::nullopt));
  self->send(s->actor, std::move(call));
}

void route(self_ptr self, mp_call& call) {
  auto& st = self->state;
  const auto& req = *call.request;
  const auto& row = op_row(req.op);
  if (row.route == mp_route::registry || row.route == mp_route::store_clear) {
    // Delegated: the registry / the store's on_clear answers the bridge,
    // which stays the sender.
    if (row.route == mp_route::registry)
      self->delegate(st.p.registry, std::move(call));
    else
      self->delegate(st.p.store, std::move(call));
    return;
  }
  const auto* rid = request_id_of(req);
  if (row.route == mp_route::bridge || !rid) {
    // The bridge answers its ops itself; one that reaches here (or a
    // session op without a request id) gets a failure, never silence.
    KVS_ERROR(st.label, "op {} has no route: answered as failed", hex(req.op_frame));
    reply(self, make_failure_reply(call, "no route for this operation"));
    return;
  }
  switch (row.route) {
    case mp_route::new_session:
      route_to_session(self, call, *rid);
      return;
    case mp_route::end_session: {
      auto i = st.sessions.find(*rid);
      if (i == st.sessions.end()) {
        reply(self, make_reply(call, std::nullopt));
        return;
      }
      self->send(i->second.actor, std::move(call)); // it releases, answers, ends
      erase_session(st, i);
      ++st.ended;
      return;
    }
    default: {
      auto i = st.sessions.find(*rid);
      if (i != st.sessions.end()) {
        i->second.last_active = session_router_state::clock::now();
        note_peer(st, *rid, i->second, call.identity);
        self->send(i->second.actor, std::move(call));
        return;
      }
      // No such request: LMCache's answer for an unknown job, from the row.
      reply(self, make_reply(call, row.unknown_job ? std::optional<std::string>{row.unknown_job()}
                                                   : std::nullopt));
      return;
    }
  }
}

/// Ends the sessions no request reached for session_ttl.
void sweep(self_ptr self) {
  auto& st = self->state;
  auto now = session_router_state::clock::now();
  std::vector<std::string> idle;
  for (auto& [rid, e] : st.sessions)
    if (now - e.last_active >= st.p.session_ttl)
      idle.push_back(rid);
  for (size_t i = 0; i < idle.size(); ++i) {
    if (i < idle_sessions_logged)
      KVS_INFO(st.label, "session {} idle past session_ttl ({}): ended, its locks released",
               idle[i], to_string(st.p.session_ttl));
    end_session(self, idle[i]);
  }
  if (idle.size() > idle_sessions_logged)
    KVS_INFO(st.label, "... and {} more sessions idle past session_ttl",
             idle.size() - idle_sessions_logged);
}

size_t end_sessions_of(self_ptr self, int64_t instance) {
  auto& st = self->state;
  std::vector<std::string> doomed;
  for (auto& [rid, e] : st.sessions)
    if (std::find(e.instances.begin(), e.instances.end(), instance) != e.instances.end())
      doomed.push_back(rid);
  for (auto& rid : doomed)
    end_session(self, rid);
  return doomed.size();
}

/// The connection `identity` ended: it leaves every session's peers, and
/// the sessions no live connection used end (their lookup locks with them).
size_t forget_peer(self_ptr self, const std::string& identity) {
  auto& st = self->state;
  // Indexed by peer: thousands of short-lived connections each cost their
  // own sessions, not a walk over all of them.
  auto p = st.by_peer.find(identity);
  if (p == st.by_peer.end())
    return 0;
  std::vector<std::string> rids = std::move(p->second);
  st.by_peer.erase(p);
  std::vector<std::string> doomed;
  for (auto& rid : rids) {
    auto i = st.sessions.find(rid);
    if (i == st.sessions.end())
      continue;
    auto& peers = i->second.peers;
    peers.erase(std::remove(peers.begin(), peers.end(), identity), peers.end());
    if (peers.empty())
      doomed.push_back(rid);
  }
  for (auto& rid : doomed)
    end_session(self, rid);
  return doomed.size();
}

} // namespace

session_router_state::~session_router_state() {
  // However the router ends (shutdown), its sessions end with it: nothing
  // else addresses them. Their locks die with the store.
  for (auto& [rid, e] : sessions)
    caf::anon_send_exit(e.actor, caf::exit_reason::user_shutdown);
}

stats_snapshot snapshot(const session_router_state& st) {
  stats_snapshot s;
  s.actor = st.label;
  s.gauge("sessions", "kvsidecar_cache_sessions", st.sessions.size())
    .counter("started", "kvsidecar_cache_sessions_started_total", st.started)
    .counter("ended", "kvsidecar_cache_sessions_ended_total", st.ended)
    .log_only("refused", st.rejected.total());
  st.rejected.add_to(s);
  return s;
}

session_router_actor::behavior_type
session_router(session_router_actor::stateful_pointer<session_router_state> self,
               session_router_params params) {
  auto& st = self->state;
  st.p = std::move(params);
  st.label = log::label(session_router_state::name, "", self->id());
  log_lifecycle(self, st.label,
                fmt::format("started: sessions idle for {} end, {} live at most",
                            to_string(st.p.session_ttl), st.p.max_sessions));
  arm_stats(self, st.p.stats_interval);
  auto every = sweep_interval(st.p.session_ttl);
  self->delayed_send(self, every, sweep_atom_v);
  return {
    [self](mp_call& call) { route(self, call); },
    [self](bridge_atom, engine_bridge_actor& bridge) {
      auto& st = self->state;
      st.bridge = bridge;
      // Before any request this router delegates to them.
      self->send(st.p.registry, bridge_atom_v, bridge);
      self->send(st.p.store, bridge_atom_v, bridge);
    },
    [self](seen_atom, int64_t instance, bool pinged) {
      self->send(self->state.p.registry, seen_atom_v, instance, pinged);
    },
    [self](reaped_atom, int64_t instance) {
      if (auto n = end_sessions_of(self, instance))
        KVS_INFO(self->state.label, "instance {} reaped: ended its {} sessions", instance, n);
    },
    [self](gone_atom, int64_t instance) {
      // Its sessions first, then the registration: the registry's forget
      // closes the pools the sessions' copies used.
      if (auto n = end_sessions_of(self, instance))
        KVS_INFO(self->state.label, "instance {} released (its connection ended): ended its {} "
                                    "sessions", instance, n);
      self->send(self->state.p.registry, gone_atom_v, instance);
    },
    [self](gone_atom, const std::string& identity) {
      if (auto n = forget_peer(self, identity))
        KVS_INFO(self->state.label, "connection {} ended: ended the {} sessions only it used",
                 hex(identity), n);
    },
    [self, every](sweep_atom) {
      sweep(self);
      self->delayed_send(self, every, sweep_atom_v);
    },
    [self](stats_atom) {
      log_stats(self, snapshot(self->state), self->state.p.stats_interval);
    },
    [self](metrics_atom, const caf::actor& to) { send_snapshot(self, to, snapshot(self->state)); },
  };
}

} // namespace kvs
