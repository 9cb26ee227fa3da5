// replay_bridge[dp=r]: the replay ROUTER routers ask for missed batches.
//
// Two requests:
//   replay:   [identity, "", start_seq (8 bytes BE)] -> every kept batch with
//             seq >= start_seq, up to the newest at the request (from the
//             rank's replay actor, a part of 1,024 batches at a time, so a
//             client that stops reading pins one part, not the buffer; one
//             that reads slower than the buffer turns over gets the end
//             marker where its next batch left the buffer, `fell_behind`);
//   snapshot: [identity, "", "snapshot/1"] -> the rank's current blocks as
//             BlockStored batches, each carrying the seq S they are
//             consistent with (from the rank's indexer, part by part; no
//             batch at all when the rank never published: replay from 0;
//             encoded here, in the published dialect).
// Anything else is logged (once per kind) and ignored.
//
// Bounded under any number of clients: at most `max_streams` requests stream
// at once (each holds at most one part of the buffer and the client's pipe),
// at most `max_waiting` more wait for a turn in arrival order, and past that
// a request is refused (counted as `refused`, logged once; the client hears
// nothing, times out and asks again). A client's own requests queue in its
// pipe beyond a few (request_hwm), so thousands of peers that send and leave
// cost bounded work: a request whose client left ends at its first send
// (`abandoned`). Replay parts and snapshot parts only update their stream;
// streams are pumped once per poll round, so a burst of parts costs O(1)
// each. Every request is accounted for:
//   requests = completed + abandoned + streaming + waiting + refused.
// Both are streamed to
// the client at the client's pace (ROUTER_MANDATORY: a full pipe defers the
// client, never blocks the others or live publishing) and events.replay_rate,
// then the end marker. Layout by dialect:
//   vllm:       [id, "", topic, seq, payload] ... [id, "", "", END_SEQ, ""]
//   tokenspeed: [id, "", seq, payload]        ... [id, "", END_SEQ, ""]
#pragma once

#include "actors/interfaces.hpp"
#include "actors/zmq_bridge.hpp"

#include <deque>
#include <set>

namespace kvs {

struct replay_bridge_params {
  int64_t rank = 0;
  std::string endpoint;
  std::string config_key;
  std::string topic;
  event_dialect dialect = event_dialect::vllm;
  replay_actor replay;
  indexer_actor indexer; ///< serves snapshots
  int64_t rate = 0; ///< batches/s streamed at most, all clients together (0 = unlimited)
  std::string curve_secret_key; ///< [security]: CURVE server key, "" = off
  int64_t max_connections = 1024; ///< peers held at once (events.max_connections / cache.max_connections)
  int64_t hwm = 1000; ///< per-client send (and request receive) HWM: events.replay_hwm
  /// events.replay_nice: this thread's (and the replay context's I/O
  /// thread's) nice value, so streaming yields the CPU to the live relay.
  int nice = 0;
  /// events.replay_max_streams: replays and snapshots streaming at once.
  int64_t max_streams = 64;
  /// events.replay_max_waiting: valid requests waiting for a stream.
  int64_t max_waiting = 1024;
};

class replay_bridge : public zmq_bridge {
public:
  /// How the tree holds it (interfaces.hpp; spawn_bridge casts to it once).
  using handle_type = replay_bridge_actor;

  replay_bridge(caf::actor_config& cfg, zmq::context_t& ctx, caf::actor supervisor,
                std::chrono::nanoseconds stats_interval, replay_bridge_params params);

protected:
  std::optional<std::string> open() override;
  caf::behavior handlers() override;
  void on_socket(size_t index, short revents) override;
  stats_snapshot snapshot() override;
  std::chrono::milliseconds poll_timeout() override;
  void after_poll() override;

private:
  struct pending {
    replay_stream stream;
    size_t next = 0;       ///< next batch to send
    bool blocked = false;  ///< last send hit the client's HWM
    uint64_t snapshot = 0; ///< snapshot id (0: a replay)
    uint64_t replay = 0;   ///< replay id (0: a snapshot)
    uint64_t end_seq = 0;  ///< a replay's last seq (the newest when it was asked)
    bool complete = true;  ///< all batches are here (the last part came)
    bool awaiting = false; ///< the next part was asked for
    /// Nothing to send until the indexer's next part arrives.
    bool idle() const {
      return !complete && next == stream.batches.size();
    }
  };

  /// A valid request (replay from `start_seq`, or a snapshot) as read.
  struct request {
    std::string client;
    uint64_t start_seq = 0;
    bool snapshot = false;
  };

  /// Starts `r` now, queues it, or refuses it (the limits above).
  void admit(request r);
  void start(request r);
  /// Starts waiting requests while streams are free.
  void start_waiting();
  void pump();
  /// Token bucket for `rate`: refills, returns how many batches may go now.
  size_t allowance();
  /// Sends one message of the stream; false when the client's pipe is full.
  bool send_batch(const std::string& client, const encoded_batch* b);
  void reject(const std::string& kind, const std::string& detail);
  void on_snapshot_part(snapshot_part& part);
  void on_replay_part(replay_stream& part);
  /// Asks for the next part (of the indexer for a snapshot, of the replay
  /// actor for a replay) when little is left.
  void credit(pending& s);

  replay_bridge_params p_;
  zmq::socket_t router_;
  std::deque<pending> streams_;
  std::deque<request> waiting_;
  std::set<std::string> rejected_kinds_;
  uint64_t requests_ = 0;
  uint64_t rejected_ = 0;
  uint64_t sent_ = 0;
  uint64_t abandoned_ = 0;
  uint64_t completed_ = 0;    ///< streams that ended with their end marker
  uint64_t refused_ = 0;      ///< valid requests refused: max_streams + max_waiting reached
  uint64_t trim_requests_ = 0; ///< requests_ when free memory was last given back
  uint64_t snapshots_ = 0; ///< snapshot requests (also the last id given)
  uint64_t replay_ids_ = 0; ///< the last replay id given
  uint64_t trimmed_at_ = 0; ///< sent_ when free memory was last given back
  uint64_t fell_behind_ = 0; ///< replays ended early: the client read slower than the buffer turned over
  double tokens_ = 0;
  std::chrono::steady_clock::time_point refilled_ = std::chrono::steady_clock::now();
};

} // namespace kvs
