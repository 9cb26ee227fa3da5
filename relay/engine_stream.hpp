// The sequence logic of one DP rank's engine stream, without sockets, CAF
// or a clock of its own: what the ingest bridge (actors/relay/ingest_bridge.hpp)
// decides about every engine batch. Inputs are what arrived (a live batch
// with its seq, an answer of the engine's replay, the engine connection
// coming up, time passing) with `now`; outputs are actions the bridge carries
// out in order: publish a batch (the restart fence included), ask the
// engine's replay for its batches from a seq, write a log line.
//
// The rules (docs/ARCHITECTURE.md, "Relay"):
// - seq == expected: published. The first batch of a stream sets expected.
// - a jump: a gap. With a replay, the missing batches are fetched and
//   published in order before the live one (live batches that arrive
//   meanwhile are held back, at most max_held_back); what the replay did not
//   serve by gap_timeout is lost. Without one the jump is lost at once.
// - seq going back, or jumping more than jump_limit: a new engine stream.
//   The fence (AllBlocksCleared) is published first, the jump is not lost.
//   At most one fence per restart_min_interval: a new stream seen sooner
//   after the last fence (a burst of forged or random seqs from one
//   connection; no engine restarts that fast) publishes none at once and is
//   counted as coalesced; one fence is owed instead and published when the
//   interval has passed (before the next batch, or on the tick), so routers
//   still drop whatever the coalesced streams announced: never a stale index.
//   The first new stream after a reconnect is always fenced at once (one
//   fence per reconnect or per interval).
// - the connection comes up: the replay is asked for everything from what
//   was not published yet (catch-up, never lost); after a reconnect the
//   replay must still hold our last live batch byte for byte, or the engine
//   restarted meanwhile (fence, then its new stream from 0).
// - the first live batch after a catch-up may jump: ZeroMQ's slow joiner
//   (batches sent before our subscription reached the engine). Fetched the
//   same way, counted as caught up (a join), not as a gap.
// - the first batch seen at seq > 0 with a replay: the engine's earlier
//   batches are fetched first (catch-up).
#pragma once

#include "events_wire/kv_events.hpp"

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kvs {

/// What the bridge must do, in this order.
struct stream_action {
  enum class kind : uint8_t { publish, fetch, info, warn };
  kind what = kind::publish;
  kv_event_batch batch; ///< publish
  bool fence = false;   ///< publish: the restart fence (AllBlocksCleared)
  uint64_t from = 0;    ///< fetch: ask the engine's replay for its batches from this seq
  std::string text;     ///< info / warn: the log line
};
using stream_actions = std::vector<stream_action>;

struct stream_counters {
  uint64_t gaps = 0;            ///< jumps in the live stream
  uint64_t refilled = 0;        ///< batches of gaps fetched from the replay
  uint64_t lost = 0;            ///< batches neither received nor fetched
  uint64_t caught_up = 0;       ///< batches fetched at (re)connect (catch-up, join)
  uint64_t reconnects = 0;      ///< connection established again after the first
  uint64_t engine_restarts = 0; ///< fences published (what routers see as restarts)
  /// New streams seen within restart_min_interval of the last fence: no
  /// fence of their own (one owed fence covers them all).
  uint64_t restarts_coalesced = 0;
  /// Batches whose seq jumped past jump_limit: a new stream, never fetched,
  /// never counted as lost (nothing could have filled it). One per such
  /// batch, so never more than the batches received.
  uint64_t skipped = 0;
};

class engine_stream {
public:
  using clock = std::chrono::steady_clock;

  struct params {
    int64_t rank = 0;
    bool have_replay = false;        ///< events.ingest_replay_endpoint is set
    uint64_t jump_limit = 10000;     ///< events.buffer_steps
    std::chrono::nanoseconds gap_timeout{};
    /// events.restart_min_interval: fences at most this often (0 = every
    /// new stream gets its own).
    std::chrono::nanoseconds restart_min_interval{};
  };

  /// The replay's end-of-answer marker (vLLM's -1 as uint64).
  static constexpr uint64_t end_seq = ~uint64_t{0};
  /// Live batches held back while a fill runs, at most (then it ends).
  static constexpr size_t max_held_back = 10000;
  /// Batches one fill keeps at most (a replay that never ends cannot grow it).
  static constexpr size_t max_fetched = 100000;

  explicit engine_stream(params p) : p_(p) {}

  /// A live batch with the engine's seq.
  void on_live(uint64_t seq, kv_event_batch batch, clock::time_point now, stream_actions& out);
  /// A live message with a seq that was not a batch: it still advances the stream.
  void on_undecodable_live(uint64_t seq);
  /// The engine connection is up (the first time, or again).
  void on_connected(clock::time_point now, stream_actions& out);

  // -- the engine replay's answers (only while filling() matters) ----------
  /// Any answer arrived (even one not wanted): the replay is alive.
  void replay_answered();
  /// The answer for verify_seq(): whether its bytes equal our last live batch's.
  void replay_verified(bool same);
  /// Whether a batch with this seq is still wanted by the fill (decode it then).
  bool wants(uint64_t seq) const;
  /// A wanted batch.
  void replay_batch(uint64_t seq, kv_event_batch batch, clock::time_point now,
                    stream_actions& out);
  /// The replay's end marker.
  void replay_end(clock::time_point now, stream_actions& out);

  /// Time passes: a fill past its deadline ends with what it has.
  void on_tick(clock::time_point now, stream_actions& out);
  /// Shutdown: whatever is held back is published now.
  void drain(clock::time_point now, stream_actions& out);

  bool filling() const { return fill_.has_value(); }
  /// When on_tick must run next: a fill's deadline, or an owed fence's.
  std::optional<clock::time_point> deadline() const;
  /// After a reconnect: the seq whose replayed bytes must equal our last live batch.
  std::optional<uint64_t> verify_seq() const { return fill_ ? fill_->verify_seq : std::nullopt; }
  std::optional<uint64_t> expected() const { return expected_; }
  const stream_counters& counters() const { return c_; }

private:
  /// Why batches are fetched from the engine's replay; decides the counters.
  enum class fill_kind {
    gap,      ///< a jump in the live stream: gaps, refilled, lost
    catch_up, ///< what the engine published before we subscribed: caught_up, never lost
    join,     ///< a jump on the first live batch after a catch-up: caught_up, lost
  };
  static constexpr uint64_t open_end = ~uint64_t{0};

  struct fill {
    uint64_t from = 0; ///< first missing seq
    uint64_t to = 0;   ///< the live seq that revealed the gap (exclusive); open_end: none
    fill_kind kind = fill_kind::gap;
    clock::time_point deadline;
    std::map<uint64_t, kv_event_batch> fetched;
    std::vector<std::pair<uint64_t, kv_event_batch>> live; ///< held back meanwhile
    std::optional<uint64_t> verify_seq;
    bool verified = false;
    bool answered = false; ///< the replay sent anything (its end marker included)
  };

  void accept(uint64_t seq, kv_event_batch batch, clock::time_point now, stream_actions& out);
  void start_fill(uint64_t from, uint64_t to, std::optional<kv_event_batch> live, fill_kind kind,
                  clock::time_point now, stream_actions& out);
  void finish(clock::time_point now, stream_actions& out);
  void restart(const std::string& why, clock::time_point now, stream_actions& out);
  /// Publishes the owed fence once restart_min_interval has passed.
  void pay_owed_fence(clock::time_point now, stream_actions& out);
  void publish_fence(clock::time_point now, stream_actions& out);
  void publish(kv_event_batch b, stream_actions& out);
  static void log(stream_actions& out, stream_action::kind k, std::string text);

  params p_;
  stream_counters c_;
  std::optional<uint64_t> expected_;
  std::optional<uint64_t> last_live_seq_;
  std::optional<fill> fill_;
  std::optional<clock::time_point> last_fence_;
  bool fence_owed_ = false;
  bool reconnected_ = false; ///< connected again since the last fence
  bool joining_ = false;       ///< a catch-up was asked for and no live batch accepted since
  bool was_connected_ = false;
};

} // namespace kvs
