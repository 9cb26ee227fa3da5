#include "actors/cache/engine_bridge.hpp"
#include "actors/cache/op_handlers.hpp"

#include "actors/cache/sweep.hpp"
#include "actors/zap_handler.hpp"
#include "actors/zmq_frames.hpp"
#include "gpu/peer_process.hpp"
#include "log/log.hpp"
#include "config/config.hpp"
#include "lmcache_wire/lmcache_failure.hpp"
#include "lmcache_wire/lmcache_ops.hpp"
#include "lmcache_wire/lmcache_protocol.hpp"

#include <caf/exit_reason.hpp>
#include <caf/send.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <cerrno>

namespace kvs {

namespace {

/// Decoders are bounded by the frame size; frames past this are refused by
/// libzmq before they are read.
constexpr int64_t max_request_bytes = int64_t{64} << 20;
/// Requests read per wake-up before the mailbox gets a turn (replies from
/// the actors wait behind no more than this).
constexpr int max_requests_per_wakeup = 256;
/// How often the owners that came over gRPC are checked for a live
/// connection (at most: also whenever another client asks for their id).
constexpr std::chrono::seconds grpc_check_interval{1};

} // namespace

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
  router_.set(zmq::sockopt::maxmsgsize, max_request_bytes);
  serve_curve(router_, p_.curve_secret_key);
  // The gate counts connections from the socket's one monitor, which this
  // bridge reads itself: its DISCONNECTED events also end the instances
  // the connection registered (peer_connections.hpp). Connected before the
  // ROUTER binds, so no event is missed; unbounded, so none is dropped.
  gate_ = gate_connections(router_, "cache.endpoint", "cache.max_connections", p_.max_connections);
  auto monitor_ep = "inproc://kvs-cache-monitor-" + std::to_string(id());
  if (zmq_socket_monitor(router_.handle(), monitor_ep.c_str(),
                         ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED)
      != 0)
    return std::string{"socket monitor of cache.endpoint: "} + zmq_strerror(zmq_errno());
  monitor_ = zmq::socket_t{ctx_, zmq::socket_type::pair};
  own(monitor_);
  monitor_.set(zmq::sockopt::rcvhwm, 0);
  monitor_.connect(monitor_ep);
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
  monitor_index_ = watch(monitor_, ZMQ_POLLIN);
  // Before any request reaches the router (one sender's messages keep
  // their order), so no actor has to take the bridge from a sender.
  auto me = caf::actor_cast<engine_bridge_actor>(this);
  send(p_.router, bridge_atom_v, me);
  if (streams_.enabled())
    send(p_.store, record_atom_v, me);
  arm_sweep();
  return std::nullopt;
}

void engine_bridge::arm_sweep() {
  // Subscriptions expire here (sessions are the router's), and gRPC owners
  // are checked for a live connection: one timer for both.
  const bool streams = streams_.enabled() && p_.heartbeat_timeout.count() > 0;
  if (sweep_armed_ || (!streams && !grpc_))
    return;
  std::chrono::nanoseconds every = streams ? sweep_interval(p_.heartbeat_timeout)
                                           : std::chrono::nanoseconds{grpc_check_interval};
  if (grpc_)
    every = std::min<std::chrono::nanoseconds>(every, grpc_check_interval);
  sweep_armed_ = true;
  delayed_send(caf::actor_cast<caf::actor>(this), every, sweep_atom_v);
}

caf::behavior engine_bridge::handlers() {
  return typed_handlers<engine_bridge_actor>(
    [this](mp_reply& r) { send_reply(r); },
    [this](kv_event_records& r) { streams_.append(std::move(r.records)); },
    [this](sweep_atom) {
      sweep_armed_ = false;
      if (streams_.enabled() && p_.heartbeat_timeout.count() > 0)
        if (auto n = streams_.expire(clock::now()))
          KVS_INFO(label(), "{} kv event subscriptions ended: no PING for {}", n,
                   to_string(p_.heartbeat_timeout));
      check_grpc_owners();
      arm_sweep();
    },
    [this](grpc_atom, lmcache_reply_sink_ptr& sink) {
      grpc_ = std::move(sink);
      arm_sweep();
    },
    [this](lmcache_frames& f) {
      ++requests_;
      ++grpc_requests_;
      if (!f.peer.empty()) {
        if (grpc_peers_.size() >= max_known_peers)
          grpc_peers_.clear(); // learnt again from the next call
        grpc_peers_[f.identity] = std::move(f.peer);
      }
      args_.assign(f.frames.begin(), f.frames.end());
      auto peer = grpc_peers_.find(f.identity);
      serve(std::move(f.identity), args_, f.received, nullptr,
            peer != grpc_peers_.end() ? std::string_view{peer->second} : std::string_view{});
    },
    [this](reaped_atom, int64_t instance) {
      // Logged once the id is free here, not when the registry decides: a
      // test (or an operator) that sees this line may register the id again.
      if (owners_.erase(instance) > 0)
        KVS_INFO(label(), "instance {} reaped: its id is free for another connection", instance);
      streams_.drop_instance(instance);
      send(p_.router, reaped_atom_v, instance); // it ends the instance's sessions
    });
}

void engine_bridge::on_socket(size_t index, short revents) {
  if (!(revents & ZMQ_POLLIN))
    return;
  if (index == monitor_index_) {
    drain_monitor();
    return;
  }
  // One vector for every request: no allocations for the frame list.
  auto& frames = frames_;
  for (int burst = 0; burst < max_requests_per_wakeup; ++burst) {
    if (mailbox_waiting(burst) || !recv_message(router_, frames))
      return;
    on_request(frames);
  }
}

void engine_bridge::drain_monitor() {
  drain_monitor_events(monitor_, [this](uint16_t event, uint32_t value, const std::string&) {
    if (gate_)
      gate_->on_monitor_event(event, value);
    if (event == ZMQ_EVENT_DISCONNECTED)
      if (auto gone = conns_.disconnected(static_cast<int>(value)))
        release_connection(*gone, "disconnected");
  });
}

void engine_bridge::release_connection(const std::string& identity, const char* how) {
  ++connections_ended_;
  releases_.erase(identity);
  grpc_peers_.erase(identity);
  std::vector<int64_t> ids;
  for (auto it = owners_.begin(); it != owners_.end();) {
    if (it->second == identity) {
      ids.push_back(it->first);
      it = owners_.erase(it);
    } else {
      ++it;
    }
  }
  std::sort(ids.begin(), ids.end()); // the log names them in order
  // Its sessions first (those only it used), then each instance: the
  // router ends the instance's sessions and has the registry drop it. Both
  // go the way later registrations go, so a re-registration of the same id
  // (now free) is served after the drop.
  send(p_.router, gone_atom_v, identity);
  for (auto id : ids) {
    streams_.drop_instance(id);
    send(p_.router, gone_atom_v, id);
  }
  if (!ids.empty()) {
    instances_released_ += ids.size();
    std::string list;
    for (auto id : ids)
      list += (list.empty() ? "" : ", ") + std::to_string(id);
    KVS_WARN(label(), "connection {} ended ({}): released instance(s) {}; the same id(s) may "
                      "register again at once",
             hex(identity), how, list);
  }
}

void engine_bridge::check_grpc_owners() {
  std::vector<std::string> dead;
  for (auto& [instance, owner] : owners_) {
    if (!is_grpc_identity(owner))
      continue;
    auto peer = grpc_peers_.find(owner);
    if (peer != grpc_peers_.end() && tcp_peer_connected(peer->second) == false
        && std::find(dead.begin(), dead.end(), owner) == dead.end())
      dead.push_back(owner);
  }
  for (auto& owner : dead)
    release_connection(owner, "its gRPC connection is gone");
}

void engine_bridge::reject(const std::string& peer, const std::string& uid, const std::string& op,
                           const error& err) {
  rejected_.note(label(), peer, uid, op, err.kind, err.detail);
}

namespace {

/// A decimal field of at most 10 digits that fits 32 bits.
std::optional<uint32_t> u32_field(const std::string& s) {
  if (s.empty() || s.size() > 10 || s.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  auto v = std::strtoull(s.c_str(), nullptr, 10);
  if (v > 0xffffffffULL)
    return std::nullopt;
  return static_cast<uint32_t>(v);
}

/// The process at the local end of a loopback TCP connection whose remote
/// end (seen from here) is `peer`: the client's own socket is in this
/// network namespace's table, and its process in /proc when the PID
/// namespace is shared. 0 when either is not visible.
int32_t local_tcp_peer_pid(const tcp_endpoint& peer) {
  auto owner = tcp_local_socket(peer);
  return owner ? pid_of_socket(owner->inode) : 0;
}

} // namespace

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
    return u32_field(addr.substr(c1 + 1, c2 - c1 - 1));
  } catch (const zmq::error_t&) {
    return std::nullopt;
  }
}

int32_t engine_bridge::peer_pid(zmq::message_t* frame, std::string_view grpc_peer) const {
  if (!frame) {
    // gRPC over TCP: its peer name has the client's port; over a unix
    // socket gRPC does not say who connected.
    auto e = parse_grpc_peer(grpc_peer);
    return e ? local_tcp_peer_pid(*e) : 0;
  }
  if (ipc_) {
    // SO_PEERCRED's pid, last field of "<host>:<uid>:<gid>:<pid>" (0 when
    // the peer is in another PID namespace: the kernel says so).
    try {
      std::string addr = frame->gets("Peer-Address");
      auto c = addr.rfind(':');
      auto v = c == std::string::npos ? std::nullopt : u32_field(addr.substr(c + 1));
      return v && *v <= 0x7fffffffU ? static_cast<int32_t>(*v) : 0;
    } catch (const zmq::error_t&) {
      return 0;
    }
  }
  // tcp://: the connection's remote end, from the descriptor libzmq read
  // the request on.
  const int fd = zmq_msg_get(frame->handle(), ZMQ_SRCFD);
  if (fd < 0)
    return 0;
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    return 0;
  char ip[INET6_ADDRSTRLEN] = {};
  tcp_endpoint e;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
    e.port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
    e.port = ntohs(a->sin6_port);
  } else {
    return 0;
  }
  e.ip = ip;
  return local_tcp_peer_pid(e);
}

bool engine_bridge::foreign(const mp_call& call, int64_t instance) {
  auto i = owners_.find(instance);
  if (i == owners_.end() || i->second == call.identity)
    return false;
  // A gRPC owner's end is not announced: asked for its id, look now.
  if (is_grpc_identity(i->second)) {
    auto peer = grpc_peers_.find(i->second);
    if (peer != grpc_peers_.end() && tcp_peer_connected(peer->second) == false) {
      release_connection(std::string{i->second}, "its gRPC connection is gone");
      return false;
    }
  }
  reject(hex(call.identity), hex(call.request->uid_frame), to_string(call.request->op),
         error{"foreign_instance",
               "instance " + std::to_string(instance) + " was registered by connection "
                 + hex(i->second) + "; only that connection may use it"});
  return true;
}

void engine_bridge::on_request(std::vector<zmq::message_t>& frames) {
  ++requests_;
  auto received = clock::now();
  // Which connection this is (the descriptor libzmq read it from): a
  // descriptor seen with another identity, or none, is bound only after the
  // monitor events queued before it are read (peer_connections.hpp).
  // (ZMQ_SRCFD is the "__fd" property of the peer's metadata, which travels
  // on the frames it sent, not on the identity frame the ROUTER made up.)
  const int fd = zmq_msg_get(frames[frames.size() > 1 ? 1 : 0].handle(), ZMQ_SRCFD);
  if (fd >= 0) {
    auto identity = frames[0].to_string();
    if (conns_.needs_drain(fd, identity)) {
      drain_monitor();
      if (auto before = conns_.bind(fd, identity))
        release_connection(*before, "its descriptor was reused");
    }
  }
  auto& args = args_;
  args.clear();
  for (size_t i = 1; i < frames.size(); ++i)
    args.emplace_back(static_cast<const char*>(frames[i].data()), frames[i].size());
  serve(frames[0].to_string(), args, received, frames.size() > 1 ? &frames[1] : nullptr, {});
}

void engine_bridge::serve(std::string identity, const std::vector<std::string_view>& args,
                          clock::time_point received, zmq::message_t* first_frame,
                          std::string_view grpc_peer) {
  // subscribe_kv_events and its stream control frames (lmcache_wire/lmcache_kv_events.hpp).
  if (args.size() == 3 && args[1].empty() && streams_.control(identity, args[0], args[2]))
    return;
  if (args.size() >= 2)
    if (const auto* streamed = streamed_row(args[1])) {
      open_stream(*streamed, identity, args);
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
    if (args.size() >= 2 && !args[1].empty()) {
      // A client before 0.5.6 must get its own op back (see mp_call::legacy_client).
      auto known = releases_.find(identity);
      const bool legacy = known != releases_.end() && known->second == client_release::legacy;
      send_reply(mp_reply{identity, std::string{args[0]},
                          legacy ? std::string{args[1]} : encode_mp_failure_op(to_string(err)),
                          std::nullopt});
    }
    return;
  }
  auto req = std::make_shared<mp_request>(std::move(*res));
  if (req->release != client_release::unknown) {
    if (releases_.size() >= max_known_peers)
      releases_.clear();
    auto [it, fresh] = releases_.emplace(identity, req->release);
    // The first peers, then one in a thousand: thousands of short-lived
    // clients must not flood the log.
    if (fresh && (++peers_seen_ <= 10 || peers_seen_ % 1000 == 0))
      KVS_INFO(label(), "peer {} (#{}): LMCache client {} (from its {})", hex(identity),
               peers_seen_, to_string(req->release), to_string(req->op));
  }
  mp_call call{std::move(identity), std::move(req), std::nullopt, received};
  if (auto known = releases_.find(call.identity); known != releases_.end())
    call.legacy_client = known->second == client_release::legacy;
  // Over ipc:// the peer's uid comes with its frames; a gRPC client has
  // none (first_frame null): its endpoint's own rule applies (a 0600 unix
  // socket, or the sidecar's uid as over tcp://).
  if (ipc_ && first_frame
      && op_row(call.request->op).instance_use == mp_instance_use::registers) {
    // The identity frame is made up by the ROUTER; the peer's metadata
    // travels on the frames it sent.
    call.peer_uid = peer_uid(*first_frame);
    if (!call.peer_uid) {
      reject(hex(call.identity), hex(call.request->uid_frame), to_string(call.request->op),
             error{"no_peer_credentials", "the ipc:// peer's uid is unknown; registration "
                                          "refused"});
      send_reply(make_failure_reply(call, std::string(to_string(call.request->op))
                                            + " refused: the ipc:// peer's uid is unknown"));
      return;
    }
  }
  // Who the client is, where the platform says: the registry then maps only
  // shared memory that process holds itself (proof of possession).
  if (op_row(call.request->op).instance_use == mp_instance_use::registers)
    call.peer_pid = peer_pid(first_frame, grpc_peer);
  route(std::move(call));
}

const engine_bridge::stream_handler engine_bridge::stream_handlers_[] = {
  {mp_op::subscribe_kv_events, &engine_bridge::on_subscribe},
};

bool bridge_streams(mp_op op) {
  for (const auto& h : engine_bridge::stream_handlers_)
    if (h.op == op)
      return true;
  return false;
}

void engine_bridge::open_stream(const mp_op_row& row, const std::string& identity,
                                const std::vector<std::string_view>& args) {
  for (const auto& h : stream_handlers_)
    if (h.op == row.op) {
      (this->*h.open)(identity, args);
      return;
    }
  // A streamed row with no handler here: a failure, never silence.
  KVS_ERROR(label(), "op {} is streamed but has no stream handler", row.name);
  send_reply(mp_reply{identity, std::string{args[0]},
                      encode_mp_failure_op(std::string(row.name) + ": no handler for this stream"),
                      std::nullopt});
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

void engine_bridge::route(mp_call call) {
  // The op's row says who serves it: the bridge answers its own ops here;
  // every other request goes to the session router once its instance is
  // this connection's (lmcache_wire/lmcache_ops.cpp).
  const auto& row = op_row(call.request->op);
  if (row.route == mp_route::bridge) {
    answer(call);
    return;
  }
  if (!claim_instance(call, row))
    return;
  send(p_.router, std::move(call));
}

bool engine_bridge::claim_instance(const mp_call& call, const mp_op_row& row) {
  const auto& req = *call.request;
  switch (row.instance_use) {
    case mp_instance_use::none:
      return true;
    case mp_instance_use::registers: {
      // Refused like a failed registration: the failure reply (the
      // connector's start-up fails at once with the reason; LMCache's vLLM
      // adapter retries on its next ping).
      auto id = *instance_of(req);
      if (foreign(call, id)) {
        send_reply(make_failure_reply(call, std::string(row.name) + " refused: instance "
                                              + std::to_string(id)
                                              + " belongs to another connection"));
        return false;
      }
      owners_[id] = call.identity;
      return true;
    }
    case mp_instance_use::unregisters: {
      // unregister has no failure reply in LMCache (None): a foreign one is
      // answered None and changes nothing.
      auto id = *instance_of(req);
      if (foreign(call, id)) {
        send_reply(make_reply(call, std::nullopt));
        return false;
      }
      owners_.erase(id);
      return true;
    }
    case mp_instance_use::uses: {
      auto instance = *instance_of(req);
      if (instance >= 0 && foreign(call, instance)) {
        // LMCache's failure value of the op ((b"", False), False, ...), or
        // the failure reply where it has none (prepare_store).
        if (auto body = failure_body(req.op))
          send_reply(make_reply(call, std::move(body)));
        else
          send_reply(make_failure_reply(call, std::string(row.name) + " refused: instance "
                                                + std::to_string(instance)
                                                + " belongs to another connection"));
        return false;
      }
      return true;
    }
  }
  return true;
}

// The handlers of the ops whose row routes them to the bridge.
const engine_bridge::op_handler engine_bridge::handlers_[] = {
  {mp_op::get_chunk_size,
   [](engine_bridge& b, const mp_call& call) {
     b.send_reply(make_reply(call, encode_reply_int(b.p_.chunk_size)));
   }},
  {mp_op::noop,
   [](engine_bridge& b, const mp_call& call) {
     b.send_reply(make_reply(call, encode_reply_str("OK")));
   }},
  {mp_op::negotiate_chunk_size,
   [](engine_bridge& b, const mp_call& call) {
     // LMCache 0.5.7 rounds its chunk size up to the alignment until the
     // first session; kvsidecar's is fixed (cache.chunk_size), so it is the
     // answer when it is a multiple, and the failure names both otherwise.
     const auto& req = *call.request;
     const int64_t cs = b.p_.chunk_size;
     const int64_t a = std::get<negotiate_chunk_size_req>(req.body).required_chunk_alignment;
     if (a >= 1 && cs % a == 0) {
       b.send_reply(make_reply(call, encode_reply_int(cs)));
     } else {
       b.reject(hex(call.identity), hex(req.uid_frame), "negotiate_chunk_size",
                error{"chunk_size", "alignment " + std::to_string(a)});
       b.send_reply(make_failure_reply(
         call, "negotiate_chunk_size: cache.chunk_size " + std::to_string(cs)
                 + " is not a multiple of the required alignment " + std::to_string(a)
                 + " (set cache.chunk_size to a multiple of the engine's block size)"));
     }
   }},
  {mp_op::server_module_call, [](engine_bridge& b, const mp_call& call) { b.no_module(call); }},
  {mp_op::server_module_affinity_call,
   [](engine_bridge& b, const mp_call& call) { b.no_module(call); }},
  {mp_op::report_block_allocation,
   [](engine_bridge& b, const mp_call& call) {
     // LMCache's blend / p2p modules use it; the cache needs nothing from it.
     b.send_reply(make_reply(call, std::nullopt));
   }},
  {mp_op::get_experimental,
   [](engine_bridge& b, const mp_call& call) {
     // With the log on, LMCache's vLLM adapter opens subscribe_kv_events.
     b.send_reply(make_reply(call, encode_reply_str_list(b.streams_.enabled()
                                                        ? std::vector<std::string>{"kv_event_stream"}
                                                        : std::vector<std::string>{})));
   }},
  {mp_op::ping,
   [](engine_bridge& b, const mp_call& call) {
     // Answered here (the heartbeat must not queue behind anything); the
     // registry learns the instance is alive (through the router).
     // Only the owning connection keeps an instance alive: an engine that
     // reconnected (new identity) re-registers once the old one is reaped.
     const auto& p = std::get<ping_req>(call.request->body);
     if (p.instance_id) {
       auto o = b.owners_.find(*p.instance_id);
       if (o == b.owners_.end() || o->second == call.identity) {
         b.send(b.p_.router, seen_atom_v, *p.instance_id, true);
         b.streams_.touch(*p.instance_id, clock::now());
       }
     }
     b.send_reply(make_reply(call, encode_reply_bool(true)));
   }},
};

bool bridge_answers(mp_op op) {
  for (const auto& h : engine_bridge::handlers_)
    if (h.op == op)
      return true;
  return false;
}

void engine_bridge::no_module(const mp_call& call) {
  // No server modules here: LMCache's own answer for an unknown method.
  send_reply(make_reply(
    call, encode_reply_server_module_call(
            false, "", "unknown server module method: "
                         + std::get<server_module_call_req>(call.request->body).method)));
}

void engine_bridge::answer(const mp_call& call) {
  for (const auto& h : handlers_)
    if (h.op == call.request->op) {
      h.serve(*this, call);
      return;
    }
  // A row routed to the bridge with no handler here: a failure, never silence.
  KVS_ERROR(label(), "op {} is routed to the bridge but has no handler",
            to_string(call.request->op));
  send_reply(make_failure_reply(call, "no handler for this operation"));
}

void engine_bridge::send_reply(const mp_reply& r) {
  if (is_grpc_identity(r.identity)) {
    // Its RPC is the gRPC bridge's (lmcache_frames).
    if (grpc_) {
      grpc_->deliver(r);
      count_reply(r);
    }
    return;
  }
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
    count_reply(r);
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH) {
      ++reply_unroutable_; // the client left before its answer: normal
      return;
    }
    KVS_WARN(label(), "reply to peer {} failed: {}", hex(r.identity), e.what());
  }
}

void engine_bridge::count_reply(const mp_reply& r) {
  ++replies_;
  if (r.received != clock::time_point{})
    latency_[r.op].observe(std::chrono::duration<double>(clock::now() - r.received).count());
}

stats_snapshot engine_bridge::snapshot() {
  stats_snapshot s;
  s.counter("requests", "kvsidecar_cache_requests_total", requests_)
    .counter("grpc_requests", "kvsidecar_cache_grpc_requests_total", grpc_requests_)
    .counter("replies", "kvsidecar_cache_replies_total", replies_)
    .log_only("rejected", rejected_.total());
  rejected_.add_to(s);
  s.counter("reply_drops", "kvsidecar_cache_reply_drops_total", reply_drops_)
    .counter("reply_unroutable", "kvsidecar_cache_reply_unroutable_total", reply_unroutable_)
    .counter("connections_ended", "kvsidecar_cache_connections_ended_total", connections_ended_)
    .log_only("instances_released", instances_released_)
    .gauge("kv_event_subscribers", "kvsidecar_cache_kv_event_subscribers", streams_.subscribers())
    .gauge("kv_event_log", "kvsidecar_cache_kv_event_log_records", streams_.log().size());
  for (size_t op = 0; op < latency_.size(); ++op)
    if (latency_[op].count > 0)
      s.histogram("kvsidecar_cache_request_duration_seconds", latency_[op], "op",
                  to_string(static_cast<mp_op>(op)));
  return s;
}

} // namespace kvs
