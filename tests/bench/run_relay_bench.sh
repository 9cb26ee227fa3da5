#!/usr/bin/env bash
# KV event relay benchmark: engine -> kvsidecar -> subscriber on loopback,
# against the raw libzmq ceiling and the seed's Python publisher.
#
#   tests/bench/run_relay_bench.sh            # ~3 minutes on 2 cores
#
# For each batch size (events per batch, 16-token blocks) and each repeat, it
# runs side by side: the codec alone (bench_relay codec: kvsidecar's decode,
# encode and pass-through check; codec_msgspec_bench.py: msgspec's typed
# decode + encode of the very same payloads), raw (libzmq PUB->SUB, bench_relay raw), relay (through
# one kvsidecar, bench_relay relay; then "steady", the same once more while
# the replay buffer still holds this size's batches) and seed (tokenspeed's ZmqEventPublisher,
# relay_seed_bench.py), plus two one-thread reference relays without actors
# (bench_relay minirelay: "mini" decodes and re-encodes like kvsidecar,
# "passthru" validates and forwards the engine's bytes) that show what the
# per-batch work itself costs here. Then latency at a steady RATE batches/s of
# 16 events, without and with a client replaying the sidecar's whole buffer
# in a loop (once at normal priority, once niced: see below).
# Prints a table of medians, the ratios against the targets, and one line
# `BENCH_RELAY {json}` for scripts.
#
# Environment (defaults in brackets):
#   BUILD_DIR [build-bench]  REPEATS [5]  SIZES ["1 16 256"]  RUN_SECONDS [1.5]
#   RATE [5000]  LAT_SECONDS [3]  LAT_REPEATS [3]  FORMAT [vllm|tokenspeed]
#   MINI [1]: 0 skips the reference relays.  CODEC_SECONDS [0.5] per codec timing.
#   NO_BUILD=1 to use the binaries as they are; KEEP=DIR keeps logs/results there.
#   METRICS [scrape|off]: /metrics on and scraped every second, or HTTP off
#   (tests/bench/metrics_mode.sh; run_metrics_overhead.sh compares the two).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-bench}"
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
REPEATS="${REPEATS:-5}"
SIZES="${SIZES:-1 16 256}"
RUN_SECONDS="${RUN_SECONDS:-1.5}"
RATE="${RATE:-5000}"
LAT_SECONDS="${LAT_SECONDS:-3}"
LAT_REPEATS="${LAT_REPEATS:-3}"
FORMAT="${FORMAT:-vllm}"
PY="${PYTHON:-python3}"

SIDECAR="$BUILD_DIR/kvsidecar"
BENCH="$BUILD_DIR/tests/bench_relay"
SEED_BENCH="$ROOT/tests/bench/relay_seed_bench.py"
MSGSPEC_BENCH="$ROOT/tests/bench/codec_msgspec_bench.py"
CODEC_SECONDS="${CODEC_SECONDS:-0.5}"

# --- build (only these two targets, one job: the machine is shared) --------------
if [[ "${NO_BUILD:-0}" != 1 ]]; then
  if [[ ! -f "$BUILD_DIR/build.ninja" && ! -f "$BUILD_DIR/Makefile" ]]; then
    cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSIDECAR_BENCH=ON >/dev/null
  fi
  if ! cmake --build "$BUILD_DIR" -j1 --target kvsidecar bench_relay >"${TMPDIR:-/tmp}/relay_bench_build.log" 2>&1; then
    if [[ -x "$SIDECAR" && -x "$BENCH" ]]; then
      echo "warning: build failed (see ${TMPDIR:-/tmp}/relay_bench_build.log); using the existing binaries" >&2
    else
      cat "${TMPDIR:-/tmp}/relay_bench_build.log" >&2
      exit 1
    fi
  fi
fi
for f in "$SIDECAR" "$BENCH"; do
  [[ -x "$f" ]] || { echo "missing $f (build it or unset NO_BUILD)" >&2; exit 1; }
done

WORK="${KEEP:-$(mktemp -d "${TMPDIR:-/tmp}/relay_bench.XXXXXX")}"
mkdir -p "$WORK"
RESULTS="$WORK/results.txt"
: >"$RESULTS"

# --- ports: distinct free ones, from the kernel's ephemeral range ------------------
source "$ROOT/tests/bench/metrics_mode.sh"
read -r P_RAW P_INGEST P_PUB P_REPLAY P_SEED P_MF_IN P_MF_OUT P_MV_IN P_MV_OUT P_HTTP < <("$PY" - <<'EOF'
import socket
socks = []
for _ in range(10):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(*[s.getsockname()[1] for s in socks])
EOF
)

# --- the sidecar: events only, no stats lines, warnings only -------------------------
SIDECAR_PID=""
MINI_PIDS=()
cleanup() {
  stop_scraper
  for p in "${MINI_PIDS[@]}"; do
    kill -TERM "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  if [[ -n "$SIDECAR_PID" ]] && kill -0 "$SIDECAR_PID" 2>/dev/null; then
    kill -TERM "$SIDECAR_PID" 2>/dev/null || true
    wait "$SIDECAR_PID" 2>/dev/null || true
  fi
  [[ -n "${KEEP:-}" ]] || rm -rf "$WORK"
}
trap cleanup EXIT

"$SIDECAR" \
  --set cache.enabled=false \
  --set 'sidecar.stats_interval="0s"' \
  --set 'sidecar.log_level="warn"' \
  --set "events.format=\"$FORMAT\"" \
  --set "events.ingest_endpoint=\"tcp://127.0.0.1:$P_INGEST\"" \
  --set "events.endpoint=\"tcp://*:$P_PUB\"" \
  --set "events.replay_endpoint=\"tcp://127.0.0.1:$P_REPLAY\"" \
  $(metrics_args "$P_HTTP") \
  >"$WORK/sidecar.out" 2>"$WORK/sidecar.err" &
SIDECAR_PID=$!
# Ready when its PUB and replay ROUTER accept connections (the ready line is
# an info line, hidden at log_level warn).
"$PY" - "$P_PUB" "$P_REPLAY" "$SIDECAR_PID" <<'EOF' || { cat "$WORK/sidecar.err" >&2; exit 1; }
import os, socket, sys, time
ports, pid = [int(p) for p in sys.argv[1:3]], int(sys.argv[3])
deadline = time.monotonic() + 15
for port in ports:
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            os.kill(pid, 0)  # raises if it died
            if time.monotonic() > deadline:
                sys.exit(f"kvsidecar did not open port {port} in 15 s")
            time.sleep(0.05)
EOF

start_scraper "$P_HTTP"

# Reference relays without actors (bench_relay minirelay), one thread each:
# "mini" decodes and re-encodes every batch as kvsidecar does; "passthru"
# validates (decodes) and forwards the engine's bytes. They bound what the
# per-batch work itself costs on this machine.
if [[ "${MINI:-1}" == 1 ]]; then
  "$BENCH" minirelay --work full --ingest-port "$P_MF_IN" --sub-port "$P_MF_OUT" --seconds 3600 \
    --format "$FORMAT" 2>"$WORK/mini_full.err" &
  MINI_PIDS+=($!)
  "$BENCH" minirelay --work validate --ingest-port "$P_MV_IN" --sub-port "$P_MV_OUT" --seconds 3600 \
    --format "$FORMAT" 2>"$WORK/mini_validate.err" &
  MINI_PIDS+=($!)
fi

LOAD_START="$(cut -d' ' -f1-3 /proc/loadavg)"
echo "kvsidecar pid $SIDECAR_PID (format $FORMAT, metrics $METRICS): ingest $P_INGEST, pub $P_PUB, replay $P_REPLAY; $REPEATS repeats of $RUN_SECONDS s; load $LOAD_START" >&2

run() { # [LABEL=x] cmd...: appends RESULT lines; a failed run is reported and skipped
  local out label=""
  if [[ "$1" == LABEL=* ]]; then label="${1#LABEL=}"; shift; fi
  if out="$("$@" 2>>"$WORK/runs.err")"; then
    grep '^RESULT ' <<<"$out" | sed -e "s/\$/ rep=$REP/" \
      -e "${label:+s/^RESULT mode=[a-z]*/RESULT mode=$label/}" >>"$RESULTS" || true
  else
    echo "run failed: $*" >&2
    tail -3 "$WORK/runs.err" >&2
  fi
}

# --- the codec alone: kvsidecar (C++) and msgspec on the same payloads -----------
for REP in $(seq 1 "$REPEATS"); do
  for B in $SIZES; do
    run "$BENCH" codec --batch "$B" --seconds "$CODEC_SECONDS" --format "$FORMAT" \
      --dump "$WORK/payloads_$B.bin"
    run "$PY" "$MSGSPEC_BENCH" --payloads "$WORK/payloads_$B.bin" --batch "$B" \
      --format "$FORMAT" --seconds "$CODEC_SECONDS"
  done
done

# --- throughput: raw, relay, seed side by side ----------------------------------
for REP in $(seq 1 "$REPEATS"); do
  for B in $SIZES; do
    run "$BENCH" raw --batch "$B" --seconds "$RUN_SECONDS" --port "$P_RAW" --format "$FORMAT"
    run "$BENCH" relay --batch "$B" --seconds "$RUN_SECONDS" --ingest-port "$P_INGEST" \
      --sub-port "$P_PUB" --format "$FORMAT"
    # Once more at once: "steady" finds the replay buffer already full of
    # batches of this size. The run above started with it full of the
    # previous size's and paid for the change (at 256 events/batch glibc
    # faults the ~500 MB of payload memory in again: BENCHMARKS.md).
    run LABEL=steady "$BENCH" relay --batch "$B" --seconds "$RUN_SECONDS" --ingest-port "$P_INGEST" \
      --sub-port "$P_PUB" --format "$FORMAT"
    run "$PY" "$SEED_BENCH" --batch "$B" --seconds "$RUN_SECONDS" --port "$P_SEED"
    if [[ "${MINI:-1}" == 1 ]]; then
      run LABEL=mini "$BENCH" relay --batch "$B" --seconds "$RUN_SECONDS" --ingest-port "$P_MF_IN" \
        --sub-port "$P_MF_OUT" --format "$FORMAT"
      run LABEL=passthru "$BENCH" relay --batch "$B" --seconds "$RUN_SECONDS" \
        --ingest-port "$P_MV_IN" --sub-port "$P_MV_OUT" --format "$FORMAT"
    fi
  done
  echo "  repeat $REP/$REPEATS done (load $(cut -d' ' -f1 /proc/loadavg))" >&2
done

# --- latency at a steady rate, without and with a full replay in a loop ----------------
# The first run also fills the replay buffer (buffer_steps batches of 16 events).
# "replay" runs the replaying client at normal priority (on 2 cores it competes
# with the sidecar for CPU); "replay_niced" runs it at nice 19 with a bounded
# pipe, standing for a router on another host.
for REP in $(seq 1 "$LAT_REPEATS"); do
  run "$BENCH" latency --batch 16 --rate "$RATE" --seconds "$LAT_SECONDS" \
    --ingest-port "$P_INGEST" --sub-port "$P_PUB" --format "$FORMAT" \
    --prefill $([[ $REP == 1 ]] && echo 10000 || echo 0)
  run "$BENCH" latency --batch 16 --rate "$RATE" --seconds "$LAT_SECONDS" \
    --ingest-port "$P_INGEST" --sub-port "$P_PUB" --replay-port "$P_REPLAY" --format "$FORMAT"
  run "$BENCH" latency --batch 16 --rate "$RATE" --seconds "$LAT_SECONDS" \
    --ingest-port "$P_INGEST" --sub-port "$P_PUB" --replay-port "$P_REPLAY" --replay-nice 19 \
    --format "$FORMAT"
done

LOAD_END="$(cut -d' ' -f1-3 /proc/loadavg)"
RSS_PEAK_KB="$(awk '/^VmHWM/ {print $2}' "/proc/$SIDECAR_PID/status" 2>/dev/null || echo 0)"
# Warnings other than the expected ones would mean drops or errors in the
# sidecar. Expected: "engine restarted" (each bench run starts its engine
# seq at 0 again), "engine connection lost" (each run's engine exits), and
# a subscriber at its high-water mark (the 1-event runs' window of 65,536
# batches is above the sidecar's HWMs: it drops and counts, see "lost"), and
# for the same runs a full publisher queue (the rank's indexer, at ~300,000
# batches/s, falls max_queue_size batches behind: ingest then drops, counted
# in "lost" the same way).
SIDECAR_WARNINGS="$(grep -c -v -e 'engine seq went back' -e 'engine connection lost' \
  -e 'a subscriber reached the high-water mark' -e 'publisher queue of dp=.* is full' \
  "$WORK/sidecar.err" || true)"

"$PY" - "$RESULTS" "$FORMAT" "$LOAD_START" "$LOAD_END" "$RSS_PEAK_KB" "$SIDECAR_WARNINGS" <<'EOF'
import json, os, platform, statistics, sys

path, fmt, load_start, load_end, rss_kb, warnings = sys.argv[1:7]
rows = []
for line in open(path):
    kv = dict(p.split("=", 1) for p in line.split()[1:])
    rows.append(kv)

def med(mode, batch, key):
    vals = [float(r[key]) for r in rows if r["mode"] == mode and r.get("batch") == str(batch)
            and key in r and ("received" not in r or int(r["received"]) > 0)]
    return statistics.median(vals) if vals else None

def lat_rows(kind):
    def k(r):
        if r["replay"] == "0":
            return "idle"
        return "replay_niced" if r.get("replay_nice", "0") != "0" else "replay"
    return [r for r in rows if r["mode"] == "latency" and k(r) == kind]

def lat(kind, key):
    vals = [float(r[key]) for r in lat_rows(kind)]
    return (statistics.median(vals), max(vals)) if vals else (None, None)

sizes = sorted({int(r["batch"]) for r in rows if r["mode"] not in ("latency", "codec", "msgspec")})
codec_sizes = sorted({int(r["batch"]) for r in rows if r["mode"] == "codec"})
def f(v, d=0):
    return "-" if v is None else f"{v:,.{d}f}"
def ratio(a, b):
    return a / b if a is not None and b else None

cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print()
summary_codec = {}
if codec_sizes:
    print(f"codec alone, format {fmt}: medians, ns per event (per batch / events per batch)")
    print()
    hdr = (f"{'events/batch':>12} | {'decode':>7} | {'encode':>7} | {'dec+enc':>7} | {'pass-through':>12} | "
           f"{'msgspec dec':>11} | {'msgspec enc':>11} | {'msgspec d+e':>11} | {'dec+enc / msgspec':>17}")
    print(hdr)
    print("-" * len(hdr))
    for b in codec_sizes:
        d, e, pt = (med("codec", b, k) for k in ("decode_ns_per_batch", "encode_ns_per_batch",
                                                  "passthru_ns_per_batch"))
        md, me = (med("msgspec", b, k) for k in ("decode_ns_per_batch", "encode_ns_per_batch"))
        per = lambda v: None if v is None else v / b
        ours = per(d + e) if d is not None and e is not None else None
        theirs = per(md + me) if md is not None and me is not None else None
        print(f"{b:>12} | {f(per(d), 1):>7} | {f(per(e), 1):>7} | {f(ours, 1):>7} | {f(per(pt), 1):>12} | "
              f"{f(per(md), 1):>11} | {f(per(me), 1):>11} | {f(theirs, 1):>11} | {f(ratio(ours, theirs), 2):>17}")
        summary_codec[str(b)] = {"decode_ns_per_event": per(d), "encode_ns_per_event": per(e),
                                 "passthru_ns_per_event": per(pt),
                                 "msgspec_decode_ns_per_event": per(md),
                                 "msgspec_encode_ns_per_event": per(me),
                                 "ours_over_msgspec": ratio(ours, theirs)}
    print("(decode: typed, into kvsidecar's structs, incl. freeing them; encode: into a reused buffer;")
    print(" pass-through: the canonical check + the copy of the frame, what the relay does for a batch")
    print(" already in the published dialect; msgspec: typed decode into the engine's Structs + encode)")
    print()
print(f"KV event relay, format {fmt}: medians of {max((int(r['rep']) for r in rows), default=0)} "
      f"runs; {os.cpu_count()} CPUs ({cpu}); load average {load_start} at start, {load_end} at end")
print()
hdr = (f"{'events/batch':>12} | {'raw libzmq ev/s':>16} | {'relay ev/s':>14} | {'seed ev/s':>14} | "
       f"{'relay/raw':>9} | {'relay/seed':>10} | {'steady/raw':>10} | {'mini ev/s':>12} | "
       f"{'passthru ev/s':>13} | {'lost':>5}")
print(hdr)
print("-" * len(hdr))
summary = {"format": fmt, "cpus": os.cpu_count(), "load_start": load_start, "load_end": load_end,
           "sidecar_peak_rss_kb": int(rss_kb or 0), "sidecar_unexpected_warnings": int(warnings or 0),
           "throughput": {}, "latency": {}, "codec": summary_codec}
for b in sizes:
    raw, rel, seed, mini, pt, steady = (med(m, b, "events_per_s")
                                        for m in ("raw", "relay", "seed", "mini", "passthru", "steady"))
    lost = sum(int(r["lost"]) for r in rows
               if r["mode"] in ("raw", "relay", "seed", "steady") and r["batch"] == str(b))
    print(f"{b:>12} | {f(raw):>16} | {f(rel):>14} | {f(seed):>14} | {f(ratio(rel, raw), 2):>9} | "
          f"{f(ratio(rel, seed), 2):>10} | {f(ratio(steady, raw), 2):>10} | {f(mini):>12} | "
          f"{f(pt):>13} | {lost:>5}")
    summary["throughput"][str(b)] = {
        "raw_events_per_s": raw, "relay_events_per_s": rel, "seed_events_per_s": seed,
        "raw_batches_per_s": med("raw", b, "batches_per_s"),
        "relay_batches_per_s": med("relay", b, "batches_per_s"),
        "seed_batches_per_s": med("seed", b, "batches_per_s"),
        "relay_over_raw": ratio(rel, raw), "relay_over_seed": ratio(rel, seed), "lost": lost,
        "mini_events_per_s": mini, "passthru_events_per_s": pt,
        "steady_events_per_s": steady, "steady_over_raw": ratio(steady, raw),
        "payload_bytes": {m: next((int(r["payload_bytes"]) for r in rows if r["mode"] == m
                                   and r["batch"] == str(b)), None) for m in ("raw", "relay", "seed")}}
print("(lost: batches sent and never received by raw, relay, steady and seed, all repeats; 0 expected.")
print(" steady: the relay run again right away, its replay buffer already holding batches of this")
print(" size; relay/raw is the first run, which starts with the previous size's batches in it.")
print(" mini / passthru: one-thread reference relays without actors, bench_relay minirelay")
print(" --work full (decode + re-encode, kvsidecar's per-batch work) / validate (decode, forward bytes))")
print()
names = {"idle": "no replay load", "replay": "with a full replay in a loop",
         "replay_niced": "with a full replay in a loop, client at nice 19"}
for kind in ("idle", "replay", "replay_niced"):
    p50, _ = lat(kind, "p50_us")
    p99, p99w = lat(kind, "p99_us")
    _, mxw = lat(kind, "max_us")
    late, _ = lat(kind, "worst_late_us")
    lost = sum(int(r["lost"]) for r in lat_rows(kind))
    rb = [float(r["replay_batches_per_s"]) for r in lat_rows(kind)]
    extra = f", replaying {f(statistics.median(rb))} batches/s" if kind != "idle" and rb else ""
    rate = next((r["rate"] for r in rows if r["mode"] == "latency"), "?")
    print(f"latency, 16 events/batch at {rate} batches/s, {names[kind]}: p50 {f(p50, 1)} us, "
          f"p99 {f(p99, 1)} us (worst run {f(p99w, 1)}), max {f(mxw, 1)} us, lost {lost}; "
          f"sender late by up to {f(late)} us (median run){extra}")
    summary["latency"][kind] = {
        "p50_us": p50, "p99_us": p99, "p99_us_worst_run": p99w, "max_us": mxw, "lost": lost,
        "sender_worst_late_us": late,
        "replay_batches_per_s": statistics.median(rb) if kind != "idle" and rb else None}
print()

t16 = summary["throughput"].get("16", {})
def target(name, value, goal, ok):
    status = "n/a" if value is None else ("MET" if ok(value) else "NOT MET")
    print(f"  {name:<46} {status:<8} ({value if isinstance(value, str) else f(value, 2)} vs {goal})")
    return status
print("targets:")
targets = {}
targets["relay_events_per_s_at_16"] = target("relay >= 1,000,000 events/s at 16/batch",
    t16.get("relay_events_per_s"), "1,000,000", lambda v: v >= 1e6)
targets["relay_over_seed"] = target("relay >= 20x seed publisher (16/batch)",
    t16.get("relay_over_seed"), "20", lambda v: v >= 20)
targets["relay_over_raw"] = target("relay >= 0.7x raw libzmq (16/batch)",
    t16.get("relay_over_raw"), "0.7", lambda v: v >= 0.7)
for b in ("16", "256"):
    targets[f"relay_over_raw_045_at_{b}"] = target(f"relay >= 0.45x raw libzmq ({b}/batch)",
        summary["throughput"].get(b, {}).get("relay_over_raw"), "0.45", lambda v: v >= 0.45)
for b in sorted(summary_codec, key=int):
    targets[f"codec_vs_msgspec_at_{b}"] = target(f"decode+encode <= msgspec's ({b}/batch)",
        summary_codec[b]["ours_over_msgspec"], "1.0", lambda v: v <= 1.0)
targets["p99_idle"] = target(f"p99 < 1 ms at {rate} batches/s",
    summary["latency"]["idle"]["p99_us"], "1000 us", lambda v: v < 1000)
targets["p99_replay"] = target(f"p99 < 1 ms at {rate} batches/s during replay",
    summary["latency"]["replay"]["p99_us"], "1000 us", lambda v: v < 1000)
target("  (same, replaying client at nice 19)",
    summary["latency"]["replay_niced"]["p99_us"], "1000 us", lambda v: v < 1000)
summary["targets"] = targets
print(f"sidecar peak RSS {int(rss_kb or 0) // 1024} MiB; unexpected sidecar warnings: {warnings}")
print("BENCH_RELAY " + json.dumps(summary, sort_keys=True))
EOF
