#include "actors/engine_bridge.hpp"

#include "actors/session.hpp"
#include "actors/zap_handler.hpp"
#include "actors/zmq_frames.hpp"
#include "log/log.hpp"
#include "config/config.hpp"
#include "messages/lmcache_failure.hpp"
#include "messages/lmcache_protocol.hpp"

#include <caf/exit_reason.hpp>
#include <caf/send.hpp>

#include <cstdlib>
#include <cerrno>

namespace kvs {

namespace {

std::string hex(const std::string& s, size_t max = 16) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

/// The request id a request belongs to, or nullptr for session-less ops.
const std::string* request_id_of(const mp_request& r) {
  return std::visit(
    [](const auto& b) -> const std::string* {
      using T = std::decay_t<decltype(b)>;
      if constexpr (std::is_same_v<T, lookup_req> || std::is_same_v<T, free_lookup_locks_req>
                    || std::is_same_v<T, store_req> || std::is_same_v<T, retrieve_req>)
        return &b.key.request_id;
      else if constexpr (std::is_same_v<T, query_prefetch_status_req>
                         || std::is_same_v<T, wait_prefetch_status_req>
                         || std::is_same_v<T, query_prefetch_lookup_hits_req>
                         || std::is_same_v<T, end_session_req>)
        return &b.request_id;
      else
        return nullptr;
    },
    r.body);
}

} // namespace

mp_reply make_reply(const mp_call& call, std::optional<std::string> body) {
  return mp_reply{call.identity, call.request->uid_frame, call.request->op_frame,
                  std::move(body), call.received, static_cast<uint8_t>(call.request->op)};
}

mp_reply make_failure_reply(const mp_call& call, std::string_view why) {
  return mp_reply{call.identity, call.request->uid_frame, encode_mp_failure_op(why),
                  std::nullopt};
}

engine_bridge::engine_bridge(caf::actor_config& cfg, zmq::context_t& ctx,
                             caf::actor supervisor, std::chrono::nanoseconds stats_interval,
                             engine_bridge_params params)
  : zmq_bridge(cfg, ctx, "engine_bridge", "", std::move(supervisor), stats_interval),
    p_(std::move(params)),
    streams_(p_.kv_event_log_size,
             std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch())
               .count(),
             p_.heartbeat_timeout, [this](const mp_reply& r) { send_reply(r); }) {}

std::optional<std::string> engine_bridge::open() {
  router_ = zmq::socket_t{ctx_, zmq::socket_type::router};
  own(router_);
  // Bounded both ways (cache.hwm): a client that floods waits on TCP; one
  // that never reads its replies loses them past the mark instead of
  // growing our memory. ROUTER_MANDATORY turns that drop into EAGAIN so it is
  // counted; replies are sent with dontwait, so the bridge never blocks.
  router_.set(zmq::sockopt::rcvhwm, static_cast<int>(p_.hwm));
  router_.set(zmq::sockopt::sndhwm, static_cast<int>(p_.hwm));
  router_.set(zmq::sockopt::router_mandatory, 1);
  // Decoders are bounded by the frame size; refuse absurd frames up front.
  router_.set(zmq::sockopt::maxmsgsize, int64_t{64} << 20);
  serve_curve(router_, p_.curve_secret_key);
  auto r = open_endpoint(router_, p_.endpoint, true);
  if (!r.ok)
    return "cache.endpoint = \"" + p_.endpoint + "\": " + r.endpoint;
  KVS_INFO(label(), "bound {} (cache.endpoint): serving the LMCache MP protocol, chunk_size {}",
           r.endpoint, p_.chunk_size);
  ipc_ = p_.endpoint.rfind("ipc://", 0) == 0;
  if (!endpoint_is_local(p_.endpoint))
    KVS_WARN(label(), "cache.endpoint = \"{}\" is reachable from the network: any client that "
                      "reaches it can register shared memory the sidecar's user may open and read "
                      "or write the cached KV (bind 127.0.0.1 or an ipc:// path unless that is "
                      "intended)",
             p_.endpoint);
  watch(router_, ZMQ_POLLIN);
  if (streams_.enabled())
    send(p_.store, record_atom_v, caf::actor_cast<caf::actor>(this));
  delayed_send(caf::actor_cast<caf::actor>(this), sweep_interval(), tick_atom_v);
  return std::nullopt;
}

std::chrono::nanoseconds engine_bridge::sweep_interval() const {
  return std::clamp<std::chrono::nanoseconds>(p_.session_ttl / 4, std::chrono::milliseconds{10},
                                              std::chrono::seconds{5});
}

caf::behavior engine_bridge::handlers() {
  return {
    [this](mp_reply& r) { send_reply(r); },
    [this](kv_event_records& r) { streams_.append(std::move(r.records)); },
    [this](tick_atom) {
      // Sessions idle past session_ttl end here, where every request passes
      // by: no request can reach one after it was told to end.
      auto now = clock::now();
      std::vector<std::string> idle;
      for (auto& [rid, e] : sessions_)
        if (now - e.last_active >= p_.session_ttl)
          idle.push_back(rid);
      for (size_t i = 0; i < idle.size(); ++i) {
        if (i < 10)
          KVS_INFO(label(), "session {} idle past session_ttl ({}): ended, its locks released",
                   idle[i], to_string(p_.session_ttl));
        end_session(idle[i]);
      }
      if (idle.size() > 10)
        KVS_INFO(label(), "... and {} more sessions idle past session_ttl", idle.size() - 10);
      if (auto n = streams_.expire(now))
        KVS_INFO(label(), "{} kv event subscriptions ended: no PING for {}", n,
                 to_string(p_.heartbeat_timeout));
      delayed_send(caf::actor_cast<caf::actor>(this), sweep_interval(), tick_atom_v);
    },
    [this](expire_atom, int64_t instance) {
      std::vector<std::string> doomed;
      for (auto& [rid, e] : sessions_)
        for (auto id : e.instances)
          if (id == instance)
            doomed.push_back(rid);
      for (auto& rid : doomed)
        end_session(rid);
      owners_.erase(instance);
      streams_.drop_instance(instance);
      if (!doomed.empty())
        KVS_INFO(label(), "instance {} reaped: ended its {} sessions", instance, doomed.size());
    },
  };
}

void engine_bridge::on_socket(size_t, short revents) {
  if (!(revents & ZMQ_POLLIN))
    return;
  for (int burst = 0; burst < 256; ++burst) {
    std::vector<zmq::message_t> frames;
    if (!recv_message(router_, frames))
      return;
    on_request(frames);
  }
}

void engine_bridge::reject(const std::string& peer, const std::string& uid, const std::string& op,
                           const error& err) {
  auto n = ++rejected_[err.kind];
  // Every bad request counts; the log names the first ones of each kind and
  // then one in a thousand, so a broken client cannot flood the log.
  if (n <= 10 || n % 1000 == 0)
    KVS_WARN(label(), "bad request from peer {} uid {} op {}: {}: {} (#{} of this kind)", peer,
             uid, op, err.kind, err.detail, n);
}

std::optional<uint32_t> engine_bridge::peer_uid(zmq::message_t& frame) const {
  // Over ipc:// libzmq reports the peer as "<host>:<uid>:<gid>:<pid>"
  // (SO_PEERCRED taken when the connection was accepted, so it names the
  // process that connected, not one that reused its fd later).
  try {
    std::string addr = frame.gets("Peer-Address");
    auto c3 = addr.rfind(':');
    auto c2 = c3 == std::string::npos || c3 == 0 ? std::string::npos : addr.rfind(':', c3 - 1);
    auto c1 = c2 == std::string::npos || c2 == 0 ? std::string::npos : addr.rfind(':', c2 - 1);
    if (c1 == std::string::npos)
      return std::nullopt;
    auto uid = addr.substr(c1 + 1, c2 - c1 - 1);
    if (uid.empty() || uid.size() > 10 || uid.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    auto v = std::strtoull(uid.c_str(), nullptr, 10);
    if (v > 0xffffffffULL)
      return std::nullopt;
    return static_cast<uint32_t>(v);
  } catch (const zmq::error_t&) {
    return std::nullopt;
  }
}

bool engine_bridge::foreign(const mp_call& call, int64_t instance) {
  auto i = owners_.find(instance);
  if (i == owners_.end() || i->second == call.identity)
    return false;
  reject(hex(call.identity), hex(call.request->uid_frame), to_string(call.request->op),
         error{"foreign_instance",
               "instance " + std::to_string(instance) + " was registered by connection "
                 + hex(i->second) + "; only that connection may use it"});
  return true;
}

void engine_bridge::on_request(std::vector<zmq::message_t>& frames) {
  ++requests_;
  auto received = clock::now();
  auto identity = frames[0].to_string();
  std::vector<std::string_view> args;
  args.reserve(frames.size() - 1);
  for (size_t i = 1; i < frames.size(); ++i)
    args.emplace_back(static_cast<const char*>(frames[i].data()), frames[i].size());
  // subscribe_kv_events and its stream control frames (messages/lmcache_kv_events.hpp).
  if (args.size() == 3 && args[1].empty() && streams_.control(identity, args[0], args[2]))
    return;
  if (args.size() >= 2 && is_subscribe_kv_events_op(args[1])) {
    on_subscribe(identity, args);
    return;
  }
  auto res = decode_mp_request(args);
  if (!res) {
    const error& err = res.error_value();
    auto uid = args.size() > 0 ? hex(std::string{args[0]}) : std::string{"-"};
    auto op = args.size() > 1 ? hex(std::string{args[1]}) : std::string{"-"};
    reject(hex(identity), uid, op, err);
    // LMCache's server sends nothing here and its client waits out its RPC
    // timeout (300 s); the call fails at once instead when there is a uid
    // to answer. An empty op frame is stream control (ack/cancel), which
    // is never answered.
    if (args.size() >= 2 && !args[1].empty())
      send_reply(mp_reply{identity, std::string{args[0]},
                          encode_mp_failure_op(to_string(err)), std::nullopt});
    return;
  }
  auto req = std::make_shared<mp_request>(std::move(*res));
  mp_call call{std::move(identity), std::move(req), std::nullopt, received};
  if (ipc_ && call.request->op == mp_op::register_kv_cache) {
    // The identity frame is made up by the ROUTER; the peer's metadata
    // travels on the frames it sent.
    call.peer_uid = peer_uid(frames[1]);
    if (!call.peer_uid) {
      reject(hex(call.identity), hex(call.request->uid_frame), "register_kv_cache",
             error{"no_peer_credentials", "the ipc:// peer's uid is unknown; registration "
                                          "refused"});
      send_reply(make_failure_reply(call, "register_kv_cache refused: the ipc:// peer's uid is "
                                          "unknown"));
      return;
    }
  }
  route(std::move(call));
}

void engine_bridge::on_subscribe(const std::string& identity,
                                 const std::vector<std::string_view>& args) {
  auto res = decode_subscribe_kv_events({args.begin() + 2, args.end()});
  if (!res) {
    reject(hex(identity), hex(std::string{args[0]}), hex(std::string{args[1]}), res.error_value());
    send_reply(mp_reply{identity, std::string{args[0]},
                        encode_mp_failure_op(to_string(res.error_value())), std::nullopt});
    return;
  }
  auto& req = *res;
  KVS_INFO(label(), "instance {} subscribes to kv events of model {} from cursor {}",
           req.instance_id, req.model_name, req.cursor);
  streams_.subscribe(identity, std::string{args[0]}, std::string{args[1]}, req, clock::now());
}

session_actor& engine_bridge::session_for(const std::string& rid, bool create) {
  auto i = sessions_.find(rid);
  if (i != sessions_.end())
    return i->second.actor;
  if (!create || sessions_.size() >= p_.max_sessions)
    return none_;
  session_params sp;
  sp.request_id = rid;
  sp.chunk_size = p_.chunk_size;
  sp.bridge = caf::actor_cast<engine_bridge_actor>(this);
  sp.store = p_.store;
  sp.gpu = p_.gpu;
  auto s = home_system().spawn(session, std::move(sp));
  ++sessions_started_;
  return sessions_.emplace(rid, session_entry{s, {}, clock::now()}).first->second.actor;
}

void engine_bridge::end_session(const std::string& rid) {
  auto i = sessions_.find(rid);
  if (i == sessions_.end())
    return;
  send(i->second.actor, expire_atom_v);
  sessions_.erase(i);
  ++sessions_ended_;
}

void engine_bridge::route(mp_call call) {
  const auto& req = *call.request;
  switch (req.op) {
    case mp_op::get_chunk_size:
      send_reply(make_reply(call, encode_mp_int(p_.chunk_size)));
      return;
    case mp_op::noop:
      send_reply(make_reply(call, encode_mp_str("OK")));
      return;
    case mp_op::get_experimental:
      // With the log on, LMCache's vLLM adapter opens subscribe_kv_events.
      send_reply(make_reply(call, encode_mp_str_list(streams_.enabled()
                                                       ? std::vector<std::string>{"kv_event_stream"}
                                                       : std::vector<std::string>{})));
      return;
    case mp_op::ping: {
      // Answered here (the heartbeat must not queue behind anything); the
      // registry learns the instance is alive.
      // Only the owning connection keeps an instance alive: an engine that
      // reconnected (new identity) re-registers once the old one is reaped.
      auto& b = std::get<ping_req>(req.body);
      if (b.instance_id) {
        auto o = owners_.find(*b.instance_id);
        if (o == owners_.end() || o->second == call.identity) {
          send(p_.registry, tick_atom_v, *b.instance_id, true);
          streams_.touch(*b.instance_id, clock::now());
        }
      }
      send_reply(make_reply(call, encode_mp_bool(true)));
      return;
    }
    case mp_op::register_kv_cache: {
      // Refused like a failed registration: the failure reply (the
      // connector's start-up fails at once with the reason; LMCache's vLLM
      // adapter retries on its next ping).
      auto id = std::get<register_kv_cache_req>(req.body).instance_id;
      if (foreign(call, id)) {
        send_reply(make_failure_reply(call, "register_kv_cache refused: instance "
                                              + std::to_string(id)
                                              + " belongs to another connection"));
        return;
      }
      owners_[id] = call.identity;
      send(p_.registry, std::move(call));
      return;
    }
    case mp_op::unregister_kv_cache: {
      // unregister has no failure reply in LMCache (None): a foreign one is
      // answered None and changes nothing.
      auto id = std::get<unregister_kv_cache_req>(req.body).instance_id;
      if (foreign(call, id)) {
        send_reply(make_reply(call, std::nullopt));
        return;
      }
      owners_.erase(id);
      send(p_.registry, std::move(call));
      return;
    }
    case mp_op::clear:
      send(p_.store, std::move(call));
      return;
    default:
      break;
  }
  const auto* rid = request_id_of(req);
  if (!rid) {
    // Every decoded op is routed above; a new one that is not gets a
    // failure, never silence.
    KVS_ERROR(label(), "op {} has no route: answered as failed", hex(req.op_frame));
    send_reply(make_failure_reply(call, "no route for this operation"));
    return;
  }
  switch (req.op) {
    case mp_op::lookup:
    case mp_op::store:
    case mp_op::retrieve: {
      int64_t instance = -1;
      if (auto* st = std::get_if<store_req>(&req.body))
        instance = st->instance_id;
      else if (auto* rt = std::get_if<retrieve_req>(&req.body))
        instance = rt->instance_id;
      if (instance >= 0 && foreign(call, instance)) {
        // LMCache's failure answer to STORE/RETRIEVE: (b"", False).
        send_reply(make_reply(call, encode_mp_event_ok("", false)));
        return;
      }
      auto& s = session_for(*rid, true);
      if (!s) {
        // cache.max_sessions are live: refused like an unknown job, so a
        // client inventing request ids cannot grow the process without
        // bound. A LOOKUP is acked (its prefetch queries then report 0
        // hits), a STORE/RETRIEVE fails.
        reject(hex(call.identity), hex(req.uid_frame), to_string(req.op),
               error{"session_limit", std::to_string(sessions_.size())
                                        + " sessions live (cache.max_sessions): request id "
                                        + *rid + " refused"});
        send_reply(make_reply(call, req.op == mp_op::lookup
                                      ? std::nullopt
                                      : std::optional<std::string>{encode_mp_event_ok("", false)}));
        return;
      }
      sessions_[*rid].last_active = clock::now();
      if (instance >= 0) {
        send(p_.registry, tick_atom_v, instance, false);
        auto& ids = sessions_[*rid].instances;
        if (std::find(ids.begin(), ids.end(), instance) == ids.end())
          ids.push_back(instance);
      }
      // LMCache acks a LOOKUP at once (the result comes through the
      // prefetch queries): answered here, without a hop to the session.
      if (req.op == mp_op::lookup)
        send_reply(make_reply(call, std::nullopt));
      send(s, std::move(call));
      return;
    }
    case mp_op::end_session: {
      auto i = sessions_.find(*rid);
      if (i != sessions_.end()) {
        send(i->second.actor, std::move(call)); // it releases, answers, ends
        sessions_.erase(i);
        ++sessions_ended_;
      } else {
        send_reply(make_reply(call, std::nullopt));
      }
      return;
    }
    default: {
      auto& s = session_for(*rid, false);
      if (s) {
        sessions_[*rid].last_active = clock::now();
        send(s, std::move(call));
        return;
      }
      // No such request: LMCache's answers for an unknown job.
      if (req.op == mp_op::query_prefetch_status || req.op == mp_op::wait_prefetch_status)
        send_reply(make_reply(call, encode_mp_int(0)));
      else
        send_reply(make_reply(call, std::nullopt));
      return;
    }
  }
}

void engine_bridge::send_reply(const mp_reply& r) {
  try {
    // The identity frame decides for the whole message (the HWM counts
    // whole messages): not sent means nothing of it went out.
    if (!router_.send(zmq::buffer(r.identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
      if (reply_drops_++ == 0)
        KVS_WARN(label(), "a client stopped reading its replies: dropping replies past "
                          "cache.hwm ({}) (counted in stats as reply_drops)", p_.hwm);
      return;
    }
    router_.send(zmq::buffer(r.uid_frame), zmq::send_flags::sndmore);
    router_.send(zmq::buffer(r.op_frame),
                 r.body ? zmq::send_flags::sndmore : zmq::send_flags::none);
    if (r.body)
      router_.send(zmq::buffer(*r.body), zmq::send_flags::none);
    ++replies_;
    if (r.received != clock::time_point{})
      latency_[r.op].observe(std::chrono::duration<double>(clock::now() - r.received).count());
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH) {
      ++reply_unroutable_; // the client left before its answer: normal
      return;
    }
    KVS_WARN(label(), "reply to peer {} failed: {}", hex(r.identity), e.what());
  }
}

void engine_bridge::drain() {
  // Shutdown: no request can reach a session any more; end them all so the
  // actor system can finish (their locks die with the store).
  for (auto& [rid, e] : sessions_)
    send_exit(e.actor, caf::exit_reason::user_shutdown);
  sessions_ended_ += sessions_.size();
  sessions_.clear();
}

stats_snapshot engine_bridge::snapshot() {
  uint64_t rejected = 0;
  for (auto& [k, n] : rejected_)
    rejected += n;
  stats_snapshot s;
  s.counter("requests", "kvsidecar_cache_requests_total", requests_)
    .counter("replies", "kvsidecar_cache_replies_total", replies_)
    .log_only("rejected", rejected);
  for (auto& [kind, n] : rejected_)
    s.counter("", "kvsidecar_cache_rejected_requests_total", n, "kind", kind);
  s.gauge("sessions", "kvsidecar_cache_sessions", sessions_.size())
    .counter("started", "kvsidecar_cache_sessions_started_total", sessions_started_)
    .counter("ended", "kvsidecar_cache_sessions_ended_total", sessions_ended_)
    .counter("reply_drops", "kvsidecar_cache_reply_drops_total", reply_drops_)
    .counter("reply_unroutable", "kvsidecar_cache_reply_unroutable_total", reply_unroutable_)
    .gauge("kv_event_subscribers", "kvsidecar_cache_kv_event_subscribers", streams_.subscribers())
    .gauge("kv_event_log", "kvsidecar_cache_kv_event_log_records", streams_.log().size());
  for (size_t op = 0; op < latency_.size(); ++op)
    if (latency_[op].count > 0)
      s.histogram("kvsidecar_cache_request_duration_seconds", latency_[op], "op",
                  to_string(static_cast<mp_op>(op)));
  return s;
}

} // namespace kvs
