// bench_relay: the KV event relay benchmark driver.
//
// One process plays both ends of the relay so that it knows exactly what was
// sent and when: the engine (a PUB, bound, sending pre-encoded batches as
// [topic, seq, payload]) and the router (a SUB). Modes:
//
//   raw      engine PUB -> router SUB directly over tcp loopback: the ceiling,
//            libzmq alone moving the same frames.
//   relay    engine PUB -> kvsidecar (ingest) ... kvsidecar PUB -> router SUB.
//   latency  as relay, paced at --rate batches/s; each batch carries its send
//            time (CLOCK_MONOTONIC seconds) in the envelope's ts field, which
//            the sidecar relays unchanged, so receive - ts is the latency.
//            --replay-port adds a client that replays the sidecar's whole
//            buffer from seq 0 in a loop for the whole measurement; with
//            --snapshot 1 that client asks for snapshots ("snapshot/1") in a
//            loop instead, and --fill-blocks N first stores N distinct blocks
//            (chains of 1000, unpaced) so the snapshots have that size;
//            --index-port P (the sidecar's replay ROUTER) then waits until the
//            sidecar's block index has applied them all before measuring (a
//            snapshot request is answered once the indexer has worked through
//            everything published before it; the bench reads that first
//            answer and leaves).
//   codec    decode_event_batch / encode_event_batch alone, per batch.
//   minirelay  a one-thread reference relay without actors (see run_minirelay).
//
// Throughput runs send for --seconds with at most --window batches in flight
// (sent, not yet received): a closed loop, so the number measured is what the
// path sustains without queues growing or the sidecar dropping, and nothing
// in the bench itself drops (HWM 0 on its sockets). events/s = events
// received / (last receive - first receive).
//
// Slow joiners: before measuring, the engine sends warm-up batches (ts < 0,
// no events) every 10 ms until the router has seen one; the router ignores
// warm-ups, so the measured run starts with the first real batch.
//
// Prints a human line and one `RESULT key=value ...` line for scripts.
//   bench_relay raw     --batch 16 --seconds 1.5 --port 41000
//   bench_relay relay   --batch 16 --seconds 1.5 --ingest-port 41001 --sub-port 41002
//   bench_relay latency --batch 16 --rate 5000 --seconds 3 --ingest-port .. --sub-port ..
//                       [--replay-port ..] [--prefill 10000] [--replay-nice 19]
//                       [--snapshot 1 --fill-blocks 1000000 --index-port ..]
//   bench_relay codec   --batch 16 --seconds 1      (the codec alone, no sockets)
//   bench_relay minirelay --work full|validate|none --ingest-port .. --sub-port .. --seconds 60
//            (a one-thread reference relay without actors, to run in place of kvsidecar)
#include "relay/block_index.hpp"
#include "actors/relay/ingest_bridge.hpp"
#include "actors/zmq_frames.hpp"
#include "events_wire/kv_event_codec.hpp"

#include <zmq.hpp>

#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <variant>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct options {
  std::string mode;
  int batch = 16;
  double seconds = 1.5;
  int64_t window = 0; // batches in flight; 0 = max(64, 65536 / batch)
  int port = 0;        // raw
  int ingest_port = 0; // relay, latency: the engine PUB the sidecar connects to
  int sub_port = 0;    // relay, latency: the sidecar's PUB
  int replay_port = 0; // latency: the sidecar's replay ROUTER (0 = no replay load)
  double rate = 5000;  // latency: batches/s
  int64_t prefill = 0; // latency: batches sent (unpaced) before measuring
  int replay_nice = 0; // latency: nice value of the replaying client's thread
  bool snapshot = false;   // latency: the --replay-port client asks for snapshots
  int64_t fill_blocks = 0; // latency: distinct blocks stored before measuring
  int index_port = 0;      // latency: after the fill, wait for the sidecar's index (replay ROUTER)
  std::string work = "full"; // minirelay: full | validate | none
  std::string format = "vllm";
  std::string dump;          // codec: write the payloads here (for codec_msgspec_bench.py)
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "bench_relay: %s\nusage: bench_relay raw|relay|latency|codec|minirelay [--batch N] [--seconds S] "
               "[--window N] [--port P] [--ingest-port P] [--sub-port P] [--replay-port P] "
               "[--rate R] [--prefill N] [--replay-nice N] [--work full|validate|none] "
               "[--format vllm|tokenspeed] [--dump FILE] [--snapshot 0|1] [--fill-blocks N]\n",
               why);
  std::exit(2);
}

options parse(int argc, char** argv) {
  if (argc < 2)
    usage("no mode");
  options o;
  o.mode = argv[1];
  for (int i = 2; i < argc; i += 2) {
    std::string k = argv[i];
    if (i + 1 >= argc)
      usage(("no value for " + k).c_str());
    const char* v = argv[i + 1];
    if (k == "--batch") o.batch = std::atoi(v);
    else if (k == "--seconds") o.seconds = std::atof(v);
    else if (k == "--window") o.window = std::atoll(v);
    else if (k == "--port") o.port = std::atoi(v);
    else if (k == "--ingest-port") o.ingest_port = std::atoi(v);
    else if (k == "--sub-port") o.sub_port = std::atoi(v);
    else if (k == "--replay-port") o.replay_port = std::atoi(v);
    else if (k == "--rate") o.rate = std::atof(v);
    else if (k == "--prefill") o.prefill = std::atoll(v);
    else if (k == "--replay-nice") o.replay_nice = std::atoi(v);
    else if (k == "--work") o.work = v;
    else if (k == "--format") o.format = v;
    else if (k == "--dump") o.dump = v;
    else if (k == "--snapshot") o.snapshot = std::atoi(v) != 0;
    else if (k == "--fill-blocks") o.fill_blocks = std::atoll(v);
    else if (k == "--index-port") o.index_port = std::atoi(v);
    else usage(("unknown option " + k).c_str());
  }
  if (o.mode != "raw" && o.mode != "relay" && o.mode != "latency" && o.mode != "codec"
      && o.mode != "minirelay")
    usage("mode must be raw, relay, latency, codec or minirelay");
  if (o.work != "full" && o.work != "validate" && o.work != "none")
    usage("--work must be full, validate or none");
  if (o.batch < 1 || o.seconds <= 0 || o.rate <= 0)
    usage("--batch, --seconds and --rate must be positive");
  if (o.format != "vllm" && o.format != "tokenspeed")
    usage("--format must be vllm or tokenspeed");
  if (o.mode == "raw" ? o.port == 0
                      : o.mode != "codec" && (o.ingest_port == 0 || o.sub_port == 0))
    usage("ports missing");
  if (o.window <= 0)
    o.window = std::max<int64_t>(64, 65536 / o.batch);
  return o;
}

double mono_seconds() {
  return std::chrono::duration<double>(clock_type::now().time_since_epoch()).count();
}

// --- payloads ----------------------------------------------------------------

/// A batch of n BlockStored events, one 16-token block each, chained by parent
/// hash, shaped like vLLM 0.26's capture (medium, extra_keys [None], group_idx,
/// kv_cache_spec_kind). The tokenspeed dialect keeps what it can represent.
kvs::kv_event_batch make_batch(int n, std::mt19937_64& rng, double ts) {
  kvs::kv_event_batch b;
  b.ts = ts;
  b.dp_rank = 0;
  uint64_t parent = rng();
  for (int i = 0; i < n; ++i) {
    kvs::block_stored e;
    uint64_t h = rng();
    e.block_hashes = {h};
    e.parent_block_hash = parent;
    for (int t = 0; t < 16; ++t)
      e.token_ids.push_back(static_cast<int64_t>(rng() % 128000));
    e.block_size = 16;
    e.medium = "GPU";
    e.extra_keys_msgpack = std::string("\x91\xc0", 2); // [None]
    e.group_idx = 0;
    e.kv_cache_spec_kind = "full_attention";
    b.events.emplace_back(std::move(e));
    parent = h;
  }
  return b;
}

// Every payload starts [fixarray 3][float64 marker][8 bytes ts]: ts is patched
// in place and read back without decoding the rest.
constexpr size_t ts_offset = 2;

bool has_ts_layout(const void* p, size_t n) {
  auto b = static_cast<const unsigned char*>(p);
  return n >= ts_offset + 8 && b[0] == 0x93 && b[1] == 0xcb;
}

double read_ts(const void* p, size_t n) {
  if (!has_ts_layout(p, n))
    return -1e300; // not one of ours: treated like a warm-up
  uint64_t bits = kvs::get_be64(static_cast<const unsigned char*>(p) + ts_offset);
  double v;
  std::memcpy(&v, &bits, 8);
  return v;
}

void write_ts(void* p, double ts) {
  uint64_t bits;
  std::memcpy(&bits, &ts, 8);
  kvs::put_be64(bits, static_cast<unsigned char*>(p) + ts_offset);
}

struct payloads {
  std::vector<std::string> real; // ts = 0 (relay/raw) or patched per send
  std::string warmup;            // ts = -1, no events
};

payloads build_payloads(const options& o) {
  auto dialect = o.format == "vllm" ? kvs::event_dialect::vllm : kvs::event_dialect::tokenspeed;
  std::mt19937_64 rng{12345};
  payloads p;
  for (int k = 0; k < 16; ++k) {
    std::string s;
    kvs::encode_event_batch(make_batch(o.batch, rng, 0.0), dialect, s);
    if (!has_ts_layout(s.data(), s.size()))
      usage("encoded payload does not start [fixarray3, float64]");
    p.real.push_back(std::move(s));
  }
  kvs::kv_event_batch w;
  w.ts = -1.0;
  w.dp_rank = 0;
  kvs::encode_event_batch(w, dialect, p.warmup);
  return p;
}

// --- sockets -------------------------------------------------------------------

void send_batch(zmq::socket_t& pub, uint64_t seq, const void* data, size_t size) {
  pub.send(zmq::message_t{}, zmq::send_flags::sndmore);
  pub.send(kvs::be64_frame(seq), zmq::send_flags::sndmore);
  pub.send(zmq::message_t{data, size}, zmq::send_flags::none);
}

/// Receives one [topic, seq, payload] message into `payload`; false on timeout.
/// Counts messages of any other shape in `bad` (and skips them). Reuses the
/// caller's frames: the receive loop is part of the measured path.
bool recv_batch(zmq::socket_t& sub, zmq::message_t& payload, int timeout_ms, uint64_t& bad) {
  zmq::pollitem_t it{sub.handle(), 0, ZMQ_POLLIN, 0};
  zmq::message_t topic, seq, extra;
  for (;;) {
    if (!sub.recv(topic, zmq::recv_flags::dontwait)) {
      if (zmq::poll(&it, 1, std::chrono::milliseconds{timeout_ms}) == 0)
        return false;
      continue;
    }
    size_t parts = 1;
    bool shape_ok = topic.more();
    if (shape_ok) {
      (void) sub.recv(seq, zmq::recv_flags::none);
      ++parts;
      shape_ok = seq.size() == 8 && seq.more();
      if (seq.more()) {
        (void) sub.recv(payload, zmq::recv_flags::none);
        ++parts;
        bool more = payload.more();
        while (more) {
          (void) sub.recv(extra, zmq::recv_flags::none);
          more = extra.more();
          shape_ok = false;
        }
      }
    }
    if (!shape_ok || parts != 3) {
      ++bad;
      continue;
    }
    return true;
  }
}

// Two contexts, one I/O thread each: the engine and the router are separate
// processes in real life, and in raw mode they get the same I/O threads the
// relay set-up has.
struct ends {
  zmq::context_t engine_ctx{1};
  zmq::context_t router_ctx{1};
  zmq::socket_t pub{engine_ctx, zmq::socket_type::pub};
  zmq::socket_t sub{router_ctx, zmq::socket_type::sub};

  explicit ends(const options& o) {
    pub.set(zmq::sockopt::sndhwm, 0);
    pub.set(zmq::sockopt::linger, 0);
    sub.set(zmq::sockopt::rcvhwm, 0);
    sub.set(zmq::sockopt::linger, 0);
    sub.set(zmq::sockopt::subscribe, "");
    int engine_port = o.mode == "raw" ? o.port : o.ingest_port;
    int router_port = o.mode == "raw" ? o.port : o.sub_port;
    pub.bind("tcp://127.0.0.1:" + std::to_string(engine_port));
    sub.connect("tcp://127.0.0.1:" + std::to_string(router_port));
  }
};

/// Shared between the engine (sender) thread and the router (main) thread.
struct progress {
  std::atomic<bool> synced{false};   // the router saw a warm-up batch
  std::atomic<uint64_t> received{0}; // real batches the router got
  std::atomic<uint64_t> sent{0};     // real batches the engine sent
  std::atomic<bool> done{false};     // the engine stopped sending
};

/// The engine side of the slow-joiner handshake. Returns the next seq.
uint64_t warm_up(zmq::socket_t& pub, const payloads& p, progress& pr) {
  uint64_t seq = 0;
  auto deadline = clock_type::now() + 20s;
  while (!pr.synced.load()) {
    if (clock_type::now() > deadline) {
      std::fprintf(stderr, "bench_relay: no warm-up batch came through in 20 s\n");
      std::exit(1);
    }
    send_batch(pub, seq++, p.warmup.data(), p.warmup.size());
    std::this_thread::sleep_for(10ms);
  }
  return seq;
}

/// Sends real batches (as they are) for `seconds`, or `count` of them when
/// count > 0, keeping at most `window` in flight.
uint64_t send_windowed(zmq::socket_t& pub, const payloads& p, progress& pr, uint64_t seq,
                       int64_t window, double seconds, uint64_t count) {
  auto end = clock_type::now() + std::chrono::duration<double>(seconds);
  uint64_t sent = pr.sent.load();
  uint64_t target = sent + count;
  for (size_t k = 0;; ++k) {
    if (count > 0 ? sent >= target : clock_type::now() >= end)
      break;
    if (static_cast<int64_t>(sent - pr.received.load(std::memory_order_relaxed)) >= window) {
      std::this_thread::sleep_for(20us);
      continue;
    }
    const auto& s = p.real[k % p.real.size()];
    send_batch(pub, seq++, s.data(), s.size());
    pr.sent.store(++sent, std::memory_order_relaxed);
  }
  return seq;
}

void print_result(const options& o, const std::string& fields) {
  std::printf("RESULT mode=%s format=%s batch=%d %s\n", o.mode.c_str(), o.format.c_str(), o.batch,
              fields.c_str());
  std::fflush(stdout);
}

// --- throughput ------------------------------------------------------------------

int run_throughput(const options& o) {
  auto p = build_payloads(o);
  ends e{o};
  progress pr;
  std::thread engine([&] {
    uint64_t seq = warm_up(e.pub, p, pr);
    send_windowed(e.pub, p, pr, seq, o.window, o.seconds, 0);
    pr.done.store(true);
  });

  zmq::message_t payload;
  uint64_t n = 0, bad = 0, stray = 0;
  clock_type::time_point first{}, last{};
  auto idle_deadline = clock_type::now() + 25s;
  for (;;) {
    if (pr.done.load() && n >= pr.sent.load())
      break;
    if (!recv_batch(e.sub, payload, 100, bad)) {
      if (clock_type::now() > idle_deadline)
        break; // gave up: the rest is counted as lost
      continue;
    }
    double ts = read_ts(payload.data(), payload.size());
    if (ts < 0) {
      if (n > 0)
        ++stray; // a warm-up after real traffic: would mean reordering
      pr.synced.store(true);
      continue;
    }
    last = clock_type::now();
    if (n == 0)
      first = last;
    pr.received.store(++n, std::memory_order_relaxed);
    // Lost batches would stall the window; this bounds the wait for them.
    idle_deadline = last + (pr.done.load() ? 2s : 10s);
  }
  pr.done.store(true);
  engine.join();

  uint64_t sent = pr.sent.load();
  double secs = std::chrono::duration<double>(last - first).count();
  double bps = n > 1 && secs > 0 ? static_cast<double>(n - 1) / secs : 0.0;
  double eps = bps * o.batch;
  size_t bytes = p.real[0].size();
  std::fprintf(stderr,
               "%-7s batch=%-4d %10.0f events/s %9.0f batches/s (%.1f MB/s payload)  sent=%llu "
               "received=%llu lost=%llu in %.2f s\n",
               o.mode.c_str(), o.batch, eps, bps, bps * static_cast<double>(bytes) / 1e6,
               static_cast<unsigned long long>(sent), static_cast<unsigned long long>(n),
               static_cast<unsigned long long>(sent - std::min(sent, n)), secs);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "events_per_s=%.0f batches_per_s=%.0f sent=%llu received=%llu lost=%llu "
                "bad=%llu stray=%llu seconds=%.3f payload_bytes=%zu window=%lld",
                eps, bps, static_cast<unsigned long long>(sent),
                static_cast<unsigned long long>(n),
                static_cast<unsigned long long>(sent - std::min(sent, n)),
                static_cast<unsigned long long>(bad), static_cast<unsigned long long>(stray), secs,
                bytes, static_cast<long long>(o.window));
  print_result(o, buf);
  return n == 0 ? 1 : 0;
}

// --- latency -------------------------------------------------------------------------

/// A router replaying the sidecar's whole buffer from seq 0, over and over.
struct replayer {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> batches{0};
  std::atomic<uint64_t> replays{0}; // completed (end marker seen)
  std::atomic<uint64_t> bytes{0};   // payload bytes received
  bool snapshot = false;            // ask for snapshots instead of replays
  std::vector<double> durations_s;  // each completed request, first batch asked to end marker
  std::atomic<bool> started{false}; // first reply arrived
  std::thread thread;

  void run(zmq::context_t& ctx, int port, int nice_value) {
    thread = std::thread([this, &ctx, port, nice_value] {
      // A niced client reads only with spare CPU: on a small machine it stands
      // for a router on another host instead of competing with the sidecar.
      if (nice_value != 0)
        (void) setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), nice_value);
      zmq::socket_t d{ctx, zmq::socket_type::dealer};
      // Niced, it must also push back: with a bounded pipe the (un-niced)
      // I/O thread reads no faster than the client consumes.
      d.set(zmq::sockopt::rcvhwm, nice_value != 0 ? 1000 : 0);
      d.set(zmq::sockopt::linger, 0);
      d.connect("tcp://127.0.0.1:" + std::to_string(port));
      zmq::pollitem_t it{d.handle(), 0, ZMQ_POLLIN, 0};
      while (!stop.load()) {
        auto asked = clock_type::now();
        d.send(zmq::message_t{}, zmq::send_flags::sndmore);
        if (snapshot)
          d.send(zmq::str_buffer("snapshot/1"), zmq::send_flags::none);
        else
          d.send(kvs::be64_frame(0), zmq::send_flags::none);
        for (;;) {
          if (zmq::poll(&it, 1, 100ms) == 0) {
            if (stop.load())
              return;
            continue;
          }
          std::vector<zmq::message_t> parts;
          do {
            parts.emplace_back();
            (void) d.recv(parts.back(), zmq::recv_flags::none);
          } while (parts.back().more());
          started.store(true);
          // ["", (topic,) seq, payload]; the end marker's seq is -1.
          if (parts.size() >= 3 && parts[parts.size() - 2].size() == 8
              && kvs::get_be64(parts[parts.size() - 2].data()) == ~uint64_t{0}) {
            durations_s.push_back(std::chrono::duration<double>(clock_type::now() - asked).count());
            replays.fetch_add(1);
            break;
          }
          bytes.fetch_add(parts.back().size(), std::memory_order_relaxed);
          batches.fetch_add(1, std::memory_order_relaxed);
        }
      }
    });
  }
};

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty())
    return 0.0;
  auto idx = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size()))) - 1;
  return sorted[std::min(idx, sorted.size() - 1)];
}

/// Stores `blocks` distinct blocks as batches of one BlockStored chain of
/// 1000 blocks (ts = 0: not timed), then waits until the router got them.
uint64_t fill(zmq::socket_t& pub, const options& o, progress& pr, uint64_t seq) {
  auto dialect = o.format == "vllm" ? kvs::event_dialect::vllm : kvs::event_dialect::tokenspeed;
  std::mt19937_64 rng{777};
  std::string s;
  for (int64_t done = 0; done < o.fill_blocks;) {
    kvs::block_stored e;
    for (int i = 0; i < 1000 && done < o.fill_blocks; ++i, ++done) {
      e.block_hashes.push_back(rng());
      for (int t = 0; t < 16; ++t)
        e.token_ids.push_back(static_cast<int64_t>(rng() % 128000));
    }
    e.block_size = 16;
    e.medium = "GPU";
    kvs::kv_event_batch b;
    b.dp_rank = 0;
    b.events.emplace_back(std::move(e));
    s.clear();
    kvs::encode_event_batch(b, dialect, s);
    while (pr.sent.load() - pr.received.load() >= 64)
      std::this_thread::sleep_for(100us);
    send_batch(pub, seq++, s.data(), s.size());
    pr.sent.fetch_add(1);
  }
  while (pr.received.load() < pr.sent.load())
    std::this_thread::sleep_for(1ms);
  return seq;
}

/// Waits until the sidecar's indexer has applied everything published so
/// far: it answers a snapshot request only after the batches queued before
/// it. Reads the first answer and leaves (the sidecar cancels the rest).
void wait_for_index(int port) {
  zmq::context_t ctx{1};
  zmq::socket_t d{ctx, zmq::socket_type::dealer};
  d.set(zmq::sockopt::linger, 0);
  d.connect("tcp://127.0.0.1:" + std::to_string(port));
  d.send(zmq::message_t{}, zmq::send_flags::sndmore);
  d.send(zmq::str_buffer("snapshot/1"), zmq::send_flags::none);
  zmq::message_t m;
  d.set(zmq::sockopt::rcvtimeo, 120000);
  if (!d.recv(m, zmq::recv_flags::none))
    std::fprintf(stderr, "bench_relay: no snapshot answer in 120 s (index not caught up?)\n");
}

int run_latency(const options& o) {
  // Deadlines need better than the default 50 us timer slack.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  auto p = build_payloads(o);
  ends e{o};
  progress pr;
  replayer rep;
  zmq::context_t replay_ctx{1};
  std::atomic<uint64_t> paced_sent{0};
  double worst_late_us = 0;
  double wall = 0;

  rep.snapshot = o.snapshot;
  std::thread engine([&] {
    uint64_t seq = warm_up(e.pub, p, pr);
    if (o.fill_blocks > 0) {
      seq = fill(e.pub, o, pr, seq);
      if (o.index_port != 0)
        wait_for_index(o.index_port);
    }
    if (o.prefill > 0) {
      // Fills the replay buffer; ts = 0 marks these as not timed.
      seq = send_windowed(e.pub, p, pr, seq, o.window, 0, static_cast<uint64_t>(o.prefill));
      while (pr.received.load() < pr.sent.load())
        std::this_thread::sleep_for(1ms);
    }
    if (o.replay_port != 0) {
      rep.run(replay_ctx, o.replay_port, o.replay_nice);
      auto deadline = clock_type::now() + 10s;
      while (!rep.started.load() && clock_type::now() < deadline)
        std::this_thread::sleep_for(1ms);
    }
    auto period = std::chrono::duration_cast<clock_type::duration>(
      std::chrono::duration<double>(1.0 / o.rate));
    auto n = static_cast<uint64_t>(o.seconds * o.rate);
    auto t0 = clock_type::now();
    for (uint64_t i = 0; i < n; ++i) {
      auto due = t0 + period * static_cast<int64_t>(i);
      std::this_thread::sleep_until(due);
      const auto& s = p.real[i % p.real.size()];
      zmq::message_t m{s.data(), s.size()};
      auto now = clock_type::now();
      worst_late_us = std::max(worst_late_us,
                               std::chrono::duration<double, std::micro>(now - due).count());
      write_ts(m.data(), std::chrono::duration<double>(now.time_since_epoch()).count());
      e.pub.send(zmq::message_t{}, zmq::send_flags::sndmore);
      e.pub.send(kvs::be64_frame(seq++), zmq::send_flags::sndmore);
      e.pub.send(m, zmq::send_flags::none);
      paced_sent.store(i + 1);
    }
    wall = std::chrono::duration<double>(clock_type::now() - t0).count();
    pr.done.store(true);
  });

  std::vector<double> lat_us;
  lat_us.reserve(static_cast<size_t>(o.seconds * o.rate) + 16);
  zmq::message_t payload;
  uint64_t bad = 0;
  auto idle_deadline = clock_type::now() + 30s;
  for (;;) {
    if (pr.done.load() && lat_us.size() >= paced_sent.load())
      break;
    if (!recv_batch(e.sub, payload, 100, bad)) {
      if (clock_type::now() > idle_deadline)
        break;
      continue;
    }
    double now = mono_seconds();
    double ts = read_ts(payload.data(), payload.size());
    idle_deadline = clock_type::now() + (pr.done.load() ? 2s : 30s);
    if (ts < 0) {
      pr.synced.store(true);
      continue;
    }
    if (ts == 0.0) {
      pr.received.fetch_add(1, std::memory_order_relaxed); // prefill
      continue;
    }
    lat_us.push_back((now - ts) * 1e6);
  }
  pr.done.store(true);
  engine.join();
  rep.stop.store(true);
  if (rep.thread.joinable())
    rep.thread.join();

  uint64_t sent = paced_sent.load();
  auto got = static_cast<uint64_t>(lat_us.size());
  std::sort(lat_us.begin(), lat_us.end());
  double p50 = percentile(lat_us, 0.50), p99 = percentile(lat_us, 0.99),
         p999 = percentile(lat_us, 0.999), mx = lat_us.empty() ? 0.0 : lat_us.back();
  double replay_bps = wall > 0 ? static_cast<double>(rep.batches.load()) / wall : 0.0;
  std::fprintf(stderr,
               "latency batch=%d rate=%.0f/s%s: p50 %.1f us  p99 %.1f us  p99.9 %.1f us  max "
               "%.1f us  (sent=%llu received=%llu lost=%llu, sender at worst %.0f us late)%s\n",
               o.batch, o.rate, o.replay_port ? " +replay" : "", p50, p99, p999, mx,
               static_cast<unsigned long long>(sent), static_cast<unsigned long long>(got),
               static_cast<unsigned long long>(sent - std::min(sent, got)), worst_late_us,
               o.replay_port ? (" replays=" + std::to_string(rep.replays.load()) + " ("
                                + std::to_string(static_cast<long long>(replay_bps))
                                + " batches/s replayed)").c_str()
                             : "");
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "rate=%.0f replay=%d p50_us=%.1f p99_us=%.1f p999_us=%.1f max_us=%.1f sent=%llu "
                "received=%llu lost=%llu worst_late_us=%.0f replays=%llu replay_batches_per_s=%.0f "
                "payload_bytes=%zu replay_nice=%d snapshot=%d fill_blocks=%lld "
                "requests_done=%zu first_request_s=%.3f request_bytes=%llu",
                o.rate, o.replay_port ? 1 : 0, p50, p99, p999, mx,
                static_cast<unsigned long long>(sent), static_cast<unsigned long long>(got),
                static_cast<unsigned long long>(sent - std::min(sent, got)), worst_late_us,
                static_cast<unsigned long long>(rep.replays.load()), replay_bps,
                p.real[0].size(), o.replay_nice, o.snapshot ? 1 : 0,
                static_cast<long long>(o.fill_blocks), rep.durations_s.size(),
                rep.durations_s.empty() ? 0.0 : rep.durations_s[0],
                static_cast<unsigned long long>(
                  rep.replays.load() ? rep.bytes.load() / rep.replays.load() : 0));
  print_result(o, buf);
  return got == 0 ? 1 : 0;
}

// --- codec ---------------------------------------------------------------------------

/// What the sidecar's ingest and publisher spend per batch on the codec alone
/// (no sockets, no actors): decode_event_batch (and freeing the typed batch),
/// then encode_event_batch into a reused buffer plus the copy the publisher
/// makes into its shared payload. Single thread, --seconds each.
int run_codec(const options& o) {
  auto p = build_payloads(o);
  auto dialect = o.format == "vllm" ? kvs::event_dialect::vllm : kvs::event_dialect::tokenspeed;
  auto per_batch_ns = [&](auto&& body) {
    uint64_t n = 0;
    auto t0 = clock_type::now();
    auto end = t0 + std::chrono::duration<double>(o.seconds);
    while (clock_type::now() < end)
      for (int i = 0; i < 64; ++i, ++n)
        body(n);
    return std::chrono::duration<double, std::nano>(clock_type::now() - t0).count()
           / static_cast<double>(n);
  };
  std::vector<kvs::kv_event_batch> decoded;
  for (auto& s : p.real) {
    auto r = kvs::decode_event_batch(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    if (!r.has_value())
      usage("a bench payload does not decode");
    decoded.push_back(std::move(r).value().batch);
  }
  size_t sink = 0;
  double dec = per_batch_ns([&](uint64_t n) {
    const auto& s = p.real[n % p.real.size()];
    auto r = kvs::decode_event_batch(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    sink += r.has_value() ? 0 : 1;
  });
  std::string scratch;
  double enc = per_batch_ns([&](uint64_t n) {
    scratch.clear();
    kvs::encode_event_batch(decoded[n % decoded.size()], dialect, scratch);
    sink += scratch.size();
  });
  double enc_copy = per_batch_ns([&](uint64_t n) {
    scratch.clear();
    kvs::encode_event_batch(decoded[n % decoded.size()], dialect, scratch);
    auto shared = std::make_shared<const std::string>(scratch);
    sink += shared->size();
  });
  // The relay's pass-through: the canonical check (recording the events for
  // the indexer), then the copies the ingest bridge makes of the engine's
  // frame (the publisher shares it on) and of the record.
  kvs::canonical_events recorded; // the ingest bridge's, reused
  double pass = per_batch_ns([&](uint64_t n) {
    const auto& s = p.real[n % p.real.size()];
    auto c = kvs::check_canonical_event_batch(reinterpret_cast<const uint8_t*>(s.data()), s.size(),
                                              dialect, &recorded);
    if (!c)
      usage("a bench payload is not canonical");
    auto shared = std::make_shared<const std::string>(s);
    std::shared_ptr<const kvs::canonical_record> copy;
    if (c->events >= kvs::min_recorded_events)
      copy = std::make_shared<const kvs::canonical_record>(recorded);
    sink += shared->size() + c->events + (copy ? copy->events.size() : 0);
  });
  // The indexer's work for a pass-through batch (the relay's other actor
  // on the same two cores): applying what the ingest bridge's check recorded
  // to the rank's block index; and the same batch decoded and applied event
  // by event (how the indexer applied every batch before recording).
  kvs::block_index index{1'000'000};
  std::vector<kvs::kv_event_batch> wires;
  for (const auto& s : p.real) {
    auto events = std::make_shared<kvs::canonical_events>();
    auto c = kvs::check_canonical_event_batch(reinterpret_cast<const uint8_t*>(s.data()),
                                              s.size(), dialect, events.get());
    if (!c)
      usage("a bench payload is not canonical");
    kvs::kv_event_batch w;
    w.wire = kvs::canonical_wire{std::make_shared<const std::string>(s), dialect, *c,
                                 std::make_shared<const kvs::canonical_record>(*events)};
    wires.push_back(std::move(w));
  }
  double idx = per_batch_ns([&](uint64_t n) { index.apply(wires[n % wires.size()]); });
  double idx_batch = per_batch_ns([&](uint64_t n) {
    const auto& s = p.real[n % p.real.size()];
    auto r = kvs::decode_event_batch(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    for (const auto& ev : r->batch.events)
      index.apply(ev);
  });
  sink += index.size();
  if (!o.dump.empty()) {
    // [u32 big-endian length, bytes] per payload.
    std::FILE* f = std::fopen(o.dump.c_str(), "wb");
    if (!f)
      usage("cannot write --dump");
    for (const auto& s : p.real) {
      const unsigned char len[4] = {static_cast<unsigned char>(s.size() >> 24),
                                    static_cast<unsigned char>(s.size() >> 16),
                                    static_cast<unsigned char>(s.size() >> 8),
                                    static_cast<unsigned char>(s.size())};
      std::fwrite(len, 1, 4, f);
      std::fwrite(s.data(), 1, s.size(), f);
    }
    std::fclose(f);
  }
  std::fprintf(stderr,
               "codec   batch=%-4d decode+free %9.0f ns/batch (%5.0f ns/event)  encode %9.0f "
               "ns/batch (%5.0f ns/event)  encode+copy %9.0f ns/batch  pass-through %9.0f "
               "ns/batch  index %9.0f ns/batch (decoded batch: %9.0f)  [%zu]\n",
               o.batch, dec, dec / o.batch, enc, enc / o.batch, enc_copy, pass, idx, idx_batch,
               sink % 10);
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "decode_ns_per_batch=%.0f encode_ns_per_batch=%.0f encode_copy_ns_per_batch=%.0f "
                "passthru_ns_per_batch=%.0f index_ns_per_batch=%.0f index_batch_ns_per_batch=%.0f "
                "payload_bytes=%zu",
                dec, enc, enc_copy, pass, idx, idx_batch, p.real[0].size());
  print_result(o, buf);
  return 0;
}

// --- minirelay ---------------------------------------------------------------------------

/// A reference relay with no actors: one thread receives from the engine
/// (connects to --ingest-port), and per batch does --work, then publishes on
/// --sub-port (bound) with its own seq. full: decode_event_batch +
/// encode_event_batch, what kvsidecar does for a batch that is not canonical;
/// validate: check_canonical_event_batch, then forward the engine's payload
/// bytes unchanged (kvsidecar's pass-through);
/// none: forward blindly. Run it in place of kvsidecar and point `relay` at
/// it: the gap to kvsidecar is what its actor plumbing costs. Runs --seconds.
int run_minirelay(const options& o) {
  auto dialect = o.format == "vllm" ? kvs::event_dialect::vllm : kvs::event_dialect::tokenspeed;
  zmq::context_t ctx{1};
  zmq::socket_t sub{ctx, zmq::socket_type::sub};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  sub.set(zmq::sockopt::rcvhwm, 0);
  sub.set(zmq::sockopt::subscribe, "");
  sub.set(zmq::sockopt::linger, 0);
  pub.set(zmq::sockopt::sndhwm, 0); // the bench's window bounds what is in flight
  pub.set(zmq::sockopt::linger, 0);
  sub.connect("tcp://127.0.0.1:" + std::to_string(o.ingest_port));
  pub.bind("tcp://127.0.0.1:" + std::to_string(o.sub_port));
  auto end = clock_type::now() + std::chrono::duration<double>(o.seconds);
  zmq::message_t payload;
  std::string scratch;
  uint64_t seq = 0, bad = 0, n = 0;
  while (clock_type::now() < end) {
    if (!recv_batch(sub, payload, 100, bad))
      continue;
    ++n;
    if (o.work == "validate") {
      // What kvsidecar's pass-through does: the canonical check, no decode.
      if (!kvs::check_canonical_event_batch(static_cast<const uint8_t*>(payload.data()),
                                            payload.size(), dialect)) {
        ++bad;
        continue;
      }
    } else if (o.work == "full") {
      auto r = kvs::decode_event_batch(static_cast<const uint8_t*>(payload.data()), payload.size());
      auto* ok = r ? &r.value() : nullptr;
      if (!ok) {
        ++bad;
        continue;
      }
      scratch.clear();
      kvs::encode_event_batch(ok->batch, dialect, scratch);
      payload = zmq::message_t{scratch.data(), scratch.size()};
    }
    pub.send(zmq::message_t{}, zmq::send_flags::sndmore);
    pub.send(kvs::be64_frame(seq++), zmq::send_flags::sndmore);
    pub.send(payload, zmq::send_flags::none);
  }
  std::fprintf(stderr, "minirelay work=%s: relayed %llu batches, %llu bad\n", o.work.c_str(),
               static_cast<unsigned long long>(n), static_cast<unsigned long long>(bad));
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  auto o = parse(argc, argv);
  try {
    if (o.mode == "codec")
      return run_codec(o);
    if (o.mode == "minirelay")
      return run_minirelay(o);
    return o.mode == "latency" ? run_latency(o) : run_throughput(o);
  } catch (const zmq::error_t& e) {
    std::fprintf(stderr, "bench_relay: zmq: %s\n", e.what());
    return 1;
  }
}
