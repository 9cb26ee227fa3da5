// subscribe_kv_events streams, as LMCache 0.5.6's server runs them
// (modules/kv_events.py KVEventModule, transport/zmq_impl/mq.py
// _start_stream): one subscription per worker instance (a new one closes the
// old), each a cursor into the kv_event_log and a credit. The first batch
// (status: enabled, incarnation, cursor) goes out at once; after that a batch
// goes out when the client has acknowledged the previous one (control frame
// `uid · b"" · b"ack"`) and there is something to say: records of its model
// past its cursor, or a loss. `b"cancel"`, the worker being reaped, or no PING
// from it for heartbeat_timeout end the stream with `identity · uid · op` and
// no body, which the client reads as "subscription ended".
//
// A plain class owned by the engine bridge (the only one that may write to
// the ROUTER socket); frames go out through the send function it is given.
#pragma once

#include "cache/kv_event_log.hpp"
#include "messages/cache_messages.hpp"
#include "lmcache_wire/lmcache_kv_events.hpp"

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <string_view>

namespace kvs {

class kv_event_streams {
public:
  using clock = std::chrono::steady_clock;
  using send_fn = std::function<void(const mp_reply&)>;

  /// log_size 0: the channel is off (not advertised; a subscriber gets one
  /// batch with enabled = false and then the end of the stream).
  /// idle_timeout 0: subscriptions never expire for lack of PINGs.
  kv_event_streams(size_t log_size, int64_t incarnation, std::chrono::nanoseconds idle_timeout,
                   send_fn send);

  bool enabled() const { return log_.enabled(); }
  void subscribe(const std::string& identity, std::string uid_frame, std::string op_frame,
                 const subscribe_kv_events_req& req, clock::time_point now);
  /// ack / cancel of a stream of this peer. False: no such stream.
  bool control(const std::string& identity, std::string_view uid_frame, std::string_view action);
  void append(std::vector<kv_event_record> records);
  /// A PING from the instance.
  void touch(int64_t instance, clock::time_point now);
  /// The instance was reaped or unregistered.
  void drop_instance(int64_t instance);
  /// Ends subscriptions without a PING for idle_timeout.
  size_t expire(clock::time_point now);
  size_t subscribers() const { return subs_.size(); }
  const kv_event_log& log() const { return log_; }

private:
  struct subscription {
    std::string identity, uid_frame, op_frame, model;
    uint64_t cursor = 0;
    size_t max_events = 1;
    bool credit = true;
    bool first = true;
    clock::time_point last_seen;
  };
  using map_t = std::map<int64_t, subscription>;

  void pump(subscription& s);
  bool pump_or_end(map_t::iterator it);  ///< false: ended and erased
  void end(map_t::iterator it);

  kv_event_log log_;
  std::chrono::nanoseconds idle_timeout_;
  send_fn send_;
  map_t subs_;  ///< by instance id
};

} // namespace kvs
