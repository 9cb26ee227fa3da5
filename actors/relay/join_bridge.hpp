// join_bridge[dp=r]: a PUB endpoint for a router that only replays on a gap
// (events.join_endpoint; smg-grpc-servicer's relay): it gets the rank's
// whole state when it subscribes, then the live stream.
//
// Such a router takes the first batch it sees as its cursor and asks the
// replay ROUTER only for what it misses after it. Joining the plain PUB
// late, it never learns what the engine stored before. Here, when the first
// subscriber arrives, the bridge holds the live stream, takes a snapshot
// from the rank's indexer (consistent with the last seq applied, S, the
// same snapshot `snapshot/1` serves) and sends it first, as ordinary
// BlockStored batches numbered S-K+1 .. S (K batches; merged when S+1 < K),
// then the held live batches after S. Whatever was published between S
// and the first live batch it gets is a gap the router fills from the
// replay ROUTER with the real batches. So the router ends with exactly the
// state of a router that saw every batch.
//
// Only one router per join endpoint: XPUB sends every message to every
// subscriber, so a second router subscribing while one is there gets the
// live stream only (warned once). Nothing is sent while nobody subscribes,
// so the first subscriber's first message is always its snapshot.
//
// No batch is dropped silently: snapshot batches wait for the subscriber's
// pipe (events.hwm) however long it takes; live batches wait too, up to
// events.hwm of them, past which the oldest live ones are dropped (counted;
// the router sees a gap and replays them).
#pragma once

#include "actors/interfaces.hpp"
#include "actors/zmq_bridge.hpp"
#include "core/event_dialect.hpp"

#include <deque>

namespace kvs {

struct join_bridge_params {
  int64_t rank = 0;
  std::string endpoint;   ///< already offset for the rank
  std::string config_key; ///< "events.join_endpoint", for errors
  std::string topic;
  event_dialect dialect = event_dialect::vllm;
  int64_t hwm = 0; ///< events.hwm: the pipe, and live batches held at most
  indexer_actor indexer;
  std::chrono::nanoseconds linger{};
  std::string curve_secret_key; ///< [security]: CURVE server key, "" = off
  int64_t max_connections = 1024; ///< peers held at once (events.max_connections / cache.max_connections)
};

class join_bridge : public zmq_bridge {
public:
  /// How the tree holds it (interfaces.hpp; spawn_bridge casts to it once).
  using handle_type = join_bridge_actor;

  join_bridge(caf::actor_config& cfg, zmq::context_t& ctx, caf::actor supervisor,
              std::chrono::nanoseconds stats_interval, join_bridge_params params);

protected:
  std::optional<std::string> open() override;
  caf::behavior handlers() override;
  void on_socket(size_t index, short revents) override;
  stats_snapshot snapshot() override;
  std::chrono::milliseconds poll_timeout() override;
  void after_poll() override;
  void close_sockets() override;

private:
  void on_live(encoded_batches& bs);
  void on_part(snapshot_part& part);
  void start_join();
  /// Numbers the collected snapshot S-K+1 .. S and queues it before the
  /// held live batches after S.
  void finish_join(uint64_t seq);
  void cancel_join();
  /// Sends what is queued while the subscriber's pipe takes it.
  void pump();
  /// One [topic, seq, payload] without dropping: false when the pipe is full.
  bool try_send(const encoded_batch& b);

  join_bridge_params p_;
  zmq::socket_t pub_;
  int64_t subscribers_ = 0;
  uint64_t joining_ = 0; ///< id of the snapshot being taken (0: none)
  uint64_t joins_ = 0;   ///< snapshots asked for (also the last id)
  std::vector<kv_event_batch> parts_; ///< the snapshot being collected
  std::deque<encoded_batch> snapshot_out_;
  std::deque<encoded_batch> live_out_;
  bool blocked_ = false;
  bool warned_second_ = false;
  bool warned_dropped_ = false;
  uint64_t snapshot_batches_ = 0; ///< snapshot batches sent
  uint64_t snapshot_blocks_ = 0;  ///< blocks in them
  uint64_t sent_ = 0;             ///< live batches sent
  uint64_t dropped_ = 0;          ///< live batches dropped past events.hwm held
};

} // namespace kvs
