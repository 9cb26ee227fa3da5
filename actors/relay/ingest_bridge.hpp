// ingest_bridge[dp=r]: subscribes to one DP rank's engine KV-event stream.
//
// Decodes every dialect engines send (vLLM tagged maps, vLLM legacy and
// tokenspeed positional arrays) into typed batches. An event with an unknown
// tag or a malformed field is dropped alone, counted, and logged once per
// kind; a payload that is not a batch is dropped and counted. The batch's
// rank field picks the publisher when set and valid.
//
// The engine's seq is tracked: a jump is logged and, with an engine replay
// endpoint, the missing batches are fetched over a DEALER and published in
// order before the later ones (bounded by ingest_gap_timeout; what did not
// arrive is counted as lost).
//
// Restart fencing: when the engine's seq goes back, or jumps further than
// jump_limit (events.buffer_steps: more than any replay could fill, or a
// forged seq), the stream is a new one: an AllBlocksCleared batch is
// published on this rank first, so routers drop the old engine's blocks,
// and the jump is not counted as lost batches.
//
// The SUB is watched through a socket monitor (an inproc PAIR in the same
// poll): libzmq drops a connection on a frame above maxmsgsize (a protocol
// error) and never re-dials it, so on every disconnect or failed handshake
// the bridge re-dials itself (backing off while it keeps failing). Each time
// the engine connection is (re-)established, the engine's replay is asked at
// once for what the sidecar has not published yet (eager catch-up: an idle
// engine's earlier batches arrive without waiting for its next batch).
// What the engine publishes after that answer but before our subscription
// reaches its PUB (ZeroMQ's slow joiner) never arrives live: a seq jump on
// the first live batch after a catch-up is fetched the same way and counted
// as caught up, not as a gap (only what the replay cannot serve is lost).
#pragma once

#include "actors/interfaces.hpp"
#include "relay/engine_stream.hpp"
#include "relay/relay_queue.hpp"
#include "actors/zmq_bridge.hpp"
#include "events_wire/kv_event_payload_pool.hpp"

#include <chrono>
#include <map>
#include <set>
#include <vector>

namespace kvs {

/// A pass-through batch of at least this many events goes to the indexer
/// with the canonical check's record of its events (kv_events.hpp
/// canonical_record); a smaller one is decoded there instead: copying the
/// record costs more than it saves.
inline constexpr uint32_t min_recorded_events = 4;
/// After handing a wake-up's batches to a publisher, room is kept for as
/// many (at most this many) for the next wake-up.
inline constexpr size_t max_reserved_batches = 64;

struct ingest_bridge_params {
  int64_t rank = 0;
  std::string endpoint;        ///< engine PUB, offset for the rank
  std::string replay_endpoint; ///< engine replay ROUTER ("" = none)
  std::chrono::nanoseconds gap_timeout{};
  int64_t hwm = 10000;                 ///< SUB / DEALER receive HWM (events.ingest_hwm)
  int64_t max_message_size = 64 << 20; ///< events.ingest_max_message_size
  uint64_t jump_limit = 10000;         ///< a bigger seq jump is a new stream (events.buffer_steps)
  std::chrono::nanoseconds restart_min_interval{}; ///< fences at most this often (events.restart_min_interval)
  int64_t max_connections = 1024; ///< engines a bound ingest SUB holds at once (events.max_connections)
  /// The published dialect: a batch already in its exact bytes passes
  /// through undecoded (kv_event_batch::wire).
  event_dialect dialect = event_dialect::vllm;
  std::vector<publisher_actor> publishers; ///< one per rank
  std::vector<relay_queue_ptr> queues;     ///< one per rank
  /// Pass-through payloads are copied into its buffers (reused, not faulted
  /// in again; see kv_event_payload_pool.hpp). Null: each its own.
  payload_pool_ptr pool;
};

class ingest_bridge : public zmq_bridge {
public:
  /// How the tree holds it (interfaces.hpp; spawn_bridge casts to it once).
  using handle_type = ingest_bridge_actor;

  ingest_bridge(caf::actor_config& cfg, zmq::context_t& ctx, caf::actor supervisor,
                std::chrono::nanoseconds stats_interval, ingest_bridge_params params);

protected:
  std::optional<std::string> open() override;
  caf::behavior handlers() override;
  void on_socket(size_t index, short revents) override;
  stats_snapshot snapshot() override;
  std::chrono::milliseconds poll_timeout() override;
  void after_poll() override;
  void drain() override;

private:
  using clock = std::chrono::steady_clock;

  void on_live_message();
  void on_replay_message();
  void on_monitor_event();
  void engine_connected();
  void redial();
  /// Carries out what the stream decided: publishes, replay requests, log lines.
  void run(stream_actions& acts);
  bool decode(const zmq::message_t& payload, kv_event_batch& out);
  void publish(kv_event_batch batch, bool fence = false);
  void flush();
  void note(std::set<std::string>& seen, const std::string& kind, const std::string& detail);

  ingest_bridge_params p_;
  zmq::socket_t sub_;
  std::shared_ptr<connection_gate> gate_; ///< a bound SUB's connection cap (null: it dials)
  zmq::socket_t monitor_; ///< PAIR fed by zmq_socket_monitor(sub_)
  zmq::socket_t dealer_;
  bool sub_binds_ = false;
  size_t monitor_index_ = 0, dealer_index_ = 0;
  std::optional<clock::time_point> redial_at_; ///< re-dial the engine then
  int failed_dials_ = 0; ///< disconnects since the last batch: backoff
  /// The sequence logic (seq, gaps, fills, fences): relay/engine_stream.hpp.
  engine_stream stream_;
  stream_actions acts_;                   ///< reused for every input
  zmq::message_t last_live_payload_;      ///< the engine's last live batch, as sent
  std::vector<zmq::message_t> live_frames_; ///< the live message being read (reused)
  std::vector<kv_event_batches> pending_; ///< per rank, sent by flush()

  // stats
  uint64_t received_ = 0;
  uint64_t published_ = 0;
  uint64_t dropped_events_ = 0;
  uint64_t bad_payloads_ = 0;
  /// Where the canonical check records a frame's events (its capacity kept
  /// from frame to frame); each recorded batch takes an exact-size copy.
  canonical_events recorded_;
  uint64_t dropped_queue_full_ = 0;
  uint64_t disconnects_ = 0;     ///< engine connection lost (or handshake failed)
  std::set<std::string> seen_disconnects_;
  std::set<std::string> seen_event_errors_;
  std::set<std::string> seen_payload_errors_;
};

} // namespace kvs
