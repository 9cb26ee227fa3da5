#include "actors/relay/replay_bridge.hpp"

#include "actors/thread_priority.hpp"
#include "actors/zap_handler.hpp"
#include "actors/zmq_frames.hpp"
#include "log/log.hpp"
#include "events_wire/kv_event_codec.hpp"

#include <caf/send.hpp>

#include <algorithm>
#include <cerrno>
#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace kvs {

namespace {

/// How soon a stream that cannot continue now (a client with a full pipe,
/// or events.replay_rate's budget spent) is tried again: zmq_poll's finest
/// step, so a router that reads at full speed is not slowed down, and the
/// thread sleeps in between instead of spinning.
constexpr std::chrono::milliseconds retry_after{1};
// How many messages one client gets per round before the others' turn.
constexpr size_t batches_per_turn = 256;
constexpr uint64_t end_seq = ~uint64_t{0}; // -1 as signed BE
const std::string snapshot_verb = "snapshot/1";
// Snapshots streaming at once per rank; more requests are refused (each
// holds the rank's index in snapshot mode while it lasts).
constexpr size_t max_snapshots = 16;
// A snapshot's next part is asked for when fewer batches than this are left.
constexpr size_t snapshot_low_water = 8;
// A replay is fetched from the replay actor this many batches at a time,
// the next part asked for when fewer than replay_low_water are left: a
// client that stops reading pins at most ~one part of the buffer's
// payloads (plus what its pipe holds, events.replay_hwm messages).
constexpr size_t replay_part = 1024;
constexpr size_t replay_low_water = 256;
// Batches streamed, or requests taken, since the last trim before the next
// (see below).
constexpr uint64_t trim_after_batches = 10000;
constexpr uint64_t trim_after_requests = 1000;
// Requests read per poll round at most (see on_socket).
constexpr int max_requests_per_round = 256;
// The ROUTER's receive high-water mark per client: a router sends one
// request and reads its answer, so a few suffice; more wait in the client's
// own queue (TCP back-pressure) instead of in ours, and a client that leaves
// leaves at most this many requests behind.
constexpr int request_hwm = 16;

/// A replay storm leaves many small freed blocks (pipes, parts) that glibc
/// keeps in its arenas: RSS would stay at the storm's peak. Once the last
/// stream has ended, their pages go back to the system.
void release_free_memory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}
} // namespace

replay_bridge::replay_bridge(caf::actor_config& cfg, zmq::context_t& ctx,
                             caf::actor supervisor, std::chrono::nanoseconds stats_interval,
                             replay_bridge_params params)
  : zmq_bridge(cfg, ctx, "replay_bridge", "dp=" + std::to_string(params.rank),
               std::move(supervisor), stats_interval),
    p_(std::move(params)) {}

std::optional<std::string> replay_bridge::open() {
  // Before the first socket: the context's I/O thread, started by it,
  // inherits the lowered priority (one started earlier, e.g. by the CURVE
  // authoriser, is found by its name).
  if (auto err = lower_this_thread_priority(p_.nice))
    KVS_WARN(label(), "events.replay_nice = {}: {} (replays run at normal priority)", p_.nice,
             *err);
  router_ = zmq::socket_t{ctx_, zmq::socket_type::router};
  lower_thread_priority_by_name(replay_io_thread_name, p_.nice);
  own(router_);
  router_.set(zmq::sockopt::router_mandatory, 1);
  serve_curve(router_, p_.curve_secret_key);
  router_.set(zmq::sockopt::sndhwm, static_cast<int>(p_.hwm));
  router_.set(zmq::sockopt::rcvhwm, request_hwm);
  // A request is 8 bytes: a frame size announced beyond this is refused
  // before libzmq allocates it (raw TCP garbage can announce 2^63 bytes).
  router_.set(zmq::sockopt::maxmsgsize, int64_t{64} << 10);
  limit_connections(router_, p_.config_key, "events.max_connections", p_.max_connections);
  auto r = open_endpoint(router_, p_.endpoint, true);
  if (!r.ok)
    return p_.config_key + " = \"" + p_.endpoint + "\": " + r.endpoint;
  KVS_INFO(label(), "bound {} ({})", r.endpoint, p_.config_key);
  watch(router_, ZMQ_POLLIN);
  return std::nullopt;
}

void replay_bridge::reject(const std::string& kind, const std::string& detail) {
  ++rejected_;
  if (rejected_kinds_.insert(kind).second)
    KVS_WARN(label(), "ignored a malformed replay request ({}): {} (further ones of this kind "
                      "are only counted)", kind, detail);
}

void replay_bridge::on_socket(size_t, short revents) {
  if (!(revents & ZMQ_POLLIN))
    return;
  // At most a round's worth per call: the poll comes straight back while
  // more wait (zmq_poll is level-triggered), and streams, parts, scrapes
  // and a stop get their turn in between.
  for (int handled = 0; handled < max_requests_per_round; ++handled) {
    std::vector<zmq::message_t> frames;
    if (!recv_message(router_, frames))
      break;
    if (frames.size() != 3) {
      reject("frame_count", "expected 3 frames [identity, \"\", start_seq], got "
                              + std::to_string(frames.size()));
      continue;
    }
    // Frame 1 is the REQ/DEALER delimiter; like vLLM we do not inspect it.
    request r;
    r.client = frames[0].to_string();
    if (frames[2].to_string_view() == snapshot_verb) {
      r.snapshot = true;
    } else if (frames[2].size() != 8) {
      reject("seq_length", "start_seq must be 8 bytes big-endian (or \"" + snapshot_verb
                             + "\"), got " + std::to_string(frames[2].size()) + " bytes");
      continue;
    } else {
      r.start_seq = get_be64(frames[2].data());
    }
    ++requests_;
    admit(std::move(r));
    if (mailbox_waiting(handled))
      break;
  }
}

void replay_bridge::admit(request r) {
  if (streams_.size() < static_cast<size_t>(p_.max_streams) && waiting_.empty()) {
    start(std::move(r));
    return;
  }
  if (waiting_.size() < static_cast<size_t>(p_.max_waiting)) {
    waiting_.push_back(std::move(r));
    return;
  }
  ++refused_;
  if (rejected_kinds_.insert("busy").second)
    KVS_WARN(label(), "refused a replay request: {} streams run (events.replay_max_streams) and "
                      "{} wait (events.replay_max_waiting); its client hears nothing and may "
                      "ask again (further ones are only counted: refused)",
             streams_.size(), waiting_.size());
}

void replay_bridge::start(request r) {
  if (r.snapshot) {
    size_t active = 0;
    for (auto& s : streams_)
      active += s.snapshot != 0;
    if (active >= max_snapshots) {
      // Each holds the rank's index in snapshot mode while it lasts.
      ++refused_;
      if (rejected_kinds_.insert("snapshot_busy").second)
        KVS_WARN(label(), "refused a snapshot request: {} snapshots are streaming already "
                          "(further ones are only counted: refused)", active);
      return;
    }
    pending s;
    s.stream.client = std::move(r.client);
    s.snapshot = ++snapshots_;
    s.complete = false;
    s.awaiting = true; // the indexer sends the first parts unasked
    streams_.push_back(std::move(s));
    KVS_DEBUG(label(), "snapshot request {}", snapshots_);
    send(p_.indexer, snapshot_request{snapshots_});
    return;
  }
  replay_request req;
  req.client = r.client;
  req.start_seq = r.start_seq;
  req.id = ++replay_ids_;
  req.max_batches = replay_part;
  KVS_DEBUG(label(), "replay request {} from seq {}", req.id, req.start_seq);
  pending s;
  s.stream.client = std::move(r.client);
  s.replay = req.id;
  s.complete = false;
  s.awaiting = true;
  streams_.push_back(std::move(s));
  send(p_.replay, replay_atom_v, std::move(req));
}

void replay_bridge::start_waiting() {
  while (!waiting_.empty() && streams_.size() < static_cast<size_t>(p_.max_streams)) {
    auto r = std::move(waiting_.front());
    waiting_.pop_front();
    start(std::move(r));
  }
}

caf::behavior replay_bridge::handlers() {
  return typed_handlers<replay_bridge_actor>(
    [this](replay_stream& s) { on_replay_part(s); },
    [this](snapshot_part& part) { on_snapshot_part(part); });
}

void replay_bridge::on_snapshot_part(snapshot_part& part) {
  auto it = std::find_if(streams_.begin(), streams_.end(),
                         [&](const pending& s) { return s.snapshot == part.id; });
  if (it == streams_.end())
    return; // its client left; the indexer was told
  auto& bs = it->stream.batches;
  // Forget what was sent already: the stream holds at most about two parts.
  bs.erase(bs.begin(), bs.begin() + static_cast<std::ptrdiff_t>(it->next));
  it->next = 0;
  // Encoded here, not in the indexer: this thread yields to the live path.
  for (auto& b : part.batches) {
    auto payload = std::make_shared<std::string>();
    encode_event_batch(b, p_.dialect, *payload);
    bs.push_back(encoded_batch{part.seq, std::move(payload)});
  }
  it->complete = part.last;
  it->awaiting = false;
  // Streamed after this poll round (after_poll), once for every part that
  // came meanwhile.
}

void replay_bridge::on_replay_part(replay_stream& part) {
  auto it = std::find_if(streams_.begin(), streams_.end(),
                         [&](const pending& s) { return s.replay == part.id; });
  if (it == streams_.end())
    return; // its client left meanwhile
  auto& bs = it->stream.batches;
  bs.erase(bs.begin(), bs.begin() + static_cast<std::ptrdiff_t>(it->next));
  it->next = 0;
  for (auto& b : part.batches)
    bs.push_back(std::move(b));
  it->end_seq = part.end_seq;
  it->complete = part.last;
  it->awaiting = false;
  if (part.fell_behind) {
    ++fell_behind_;
    KVS_DEBUG(label(), "replay {} fell behind the buffer: it ends early", part.id);
  }
}

void replay_bridge::credit(pending& s) {
  if (s.complete || s.awaiting)
    return;
  auto left = s.stream.batches.size() - s.next;
  if (s.snapshot != 0) {
    if (left >= snapshot_low_water)
      return;
    s.awaiting = true;
    send(p_.indexer, snapshot_credit{s.snapshot, false});
    return;
  }
  if (left >= replay_low_water || s.stream.batches.empty())
    return;
  s.awaiting = true;
  replay_request req;
  req.client = s.stream.client;
  req.start_seq = s.stream.batches.back().seq + 1;
  req.id = s.replay;
  req.end_seq = s.end_seq;
  req.max_batches = replay_part;
  send(p_.replay, replay_atom_v, std::move(req));
}

bool replay_bridge::send_batch(const std::string& client, const encoded_batch* b) {
  // The identity frame decides: EAGAIN there means the client's pipe is full
  // (nothing sent, retry later); once it is accepted the rest follows.
  auto first = router_.send(zmq::buffer(client), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  if (!first)
    return false;
  router_.send(zmq::message_t{}, zmq::send_flags::sndmore);
  bool vllm = p_.dialect == event_dialect::vllm;
  if (b) {
    if (vllm)
      router_.send(zmq::buffer(p_.topic), zmq::send_flags::sndmore);
    router_.send(be64_frame(b->seq), zmq::send_flags::sndmore);
    router_.send(shared_frame(b->payload), zmq::send_flags::none);
  } else {
    if (vllm)
      router_.send(zmq::message_t{}, zmq::send_flags::sndmore);
    router_.send(be64_frame(end_seq), zmq::send_flags::sndmore);
    router_.send(zmq::message_t{}, zmq::send_flags::none);
  }
  return true;
}

size_t replay_bridge::allowance() {
  if (p_.rate <= 0)
    return SIZE_MAX;
  auto now = std::chrono::steady_clock::now();
  double rate = static_cast<double>(p_.rate);
  // At most 10 ms worth (and at least one turn) accumulates while idle.
  double cap = std::max(rate / 100.0, static_cast<double>(batches_per_turn));
  tokens_ = std::min(cap, tokens_ + rate * std::chrono::duration<double>(now - refilled_).count());
  refilled_ = now;
  return static_cast<size_t>(tokens_);
}

void replay_bridge::pump() {
  const bool streaming = !streams_.empty();
  const auto allowed = allowance();
  auto budget = allowed;
  // Round-robin over clients so one big replay never starves another.
  size_t rounds = streams_.size();
  for (size_t i = 0; i < rounds && !streams_.empty(); ++i) {
    auto cur = std::move(streams_.front());
    streams_.pop_front();
    bool finished = false;
    cur.blocked = false;
    try {
      for (size_t n = 0; n < batches_per_turn && budget > 0; ++n, --budget) {
        auto& bs = cur.stream.batches;
        if (cur.idle())
          break; // a snapshot waiting for its next part
        const encoded_batch* b = cur.next < bs.size() ? &bs[cur.next] : nullptr;
        if (!send_batch(cur.stream.client, b)) {
          cur.blocked = true;
          break;
        }
        if (!b) {
          ++completed_;
          finished = true;
          break;
        }
        ++cur.next;
        ++sent_;
      }
    } catch (const zmq::error_t& e) {
      // EHOSTUNREACH: the client left; drop what it asked for.
      ++abandoned_;
      KVS_DEBUG(label(), "replay client gone ({}), {} batches not sent", e.what(),
                cur.stream.batches.size() - cur.next);
      finished = true;
      if (!cur.complete && cur.snapshot != 0)
        send(p_.indexer, snapshot_credit{cur.snapshot, true});
    }
    if (!finished) {
      credit(cur);
      streams_.push_back(std::move(cur));
    }
  }
  if (p_.rate > 0)
    tokens_ -= static_cast<double>(allowed - budget);
  start_waiting();
  // Only after a storm's worth of batches or requests (a small gap replay
  // leaves nothing to give back, and trimming takes the allocator's locks
  // for a moment).
  if (streaming && streams_.empty()
      && (sent_ - trimmed_at_ >= trim_after_batches
          || requests_ - trim_requests_ >= trim_after_requests)) {
    trimmed_at_ = sent_;
    trim_requests_ = requests_;
    release_free_memory();
  }
}

std::chrono::milliseconds replay_bridge::poll_timeout() {
  // A snapshot waiting for its next part needs no poll: the part wakes us.
  if (std::all_of(streams_.begin(), streams_.end(), [](const pending& s) { return s.idle(); }))
    return poll_until_ready;
  // Out of budget (events.replay_rate): continue when tokens are back.
  if (p_.rate > 0 && tokens_ < 1)
    return retry_after;
  // Deferred streams: a client with a full pipe is retried shortly; one that
  // still has room continues at once.
  bool waiting = false;
  for (auto& s : streams_) {
    if (s.idle())
      continue;
    if (!s.blocked)
      return poll_now;
    waiting = true;
  }
  return waiting ? retry_after : poll_until_ready;
}

void replay_bridge::after_poll() {
  if (!streams_.empty())
    pump();
}

stats_snapshot replay_bridge::snapshot() {
  stats_snapshot s;
  s.labels = {{"dp_rank", std::to_string(p_.rank)}};
  s.counter("requests", "kvsidecar_events_replay_requests_total", requests_)
    .counter("snapshots", "kvsidecar_events_snapshot_requests_total", snapshots_)
    .counter("rejected", "kvsidecar_events_replay_rejected_total", rejected_)
    .counter("batches_sent", "kvsidecar_events_replay_batches_total", sent_)
    .counter("refused", "kvsidecar_events_replay_refused_total", refused_)
    .counter("completed", "kvsidecar_events_replay_completed_total", completed_)
    .gauge("streaming", "kvsidecar_events_replay_streams", streams_.size())
    .gauge("waiting", "kvsidecar_events_replay_waiting", waiting_.size())
    .counter("abandoned", "kvsidecar_events_replay_abandoned_total", abandoned_)
    .counter("fell_behind", "kvsidecar_events_replay_fell_behind_total", fell_behind_);
  return s;
}

} // namespace kvs
