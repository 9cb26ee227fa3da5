#!/usr/bin/env bash
# Snapshot benchmark: a rank's index of BLOCKS blocks (default 1 M, 16-token
# blocks), then live latency at RATE batches/s (16 events each), side by
# side in one run: alone ("baseline") and while a router asks for snapshots
# of the rank in a loop ("snapshots": bench_relay latency --snapshot 1; the
# snapshot client runs at normal priority, on the same CPUs). REPEATS rounds,
# the two phases alternating, medians at the end.
#
#   tests/bench/run_snapshot_bench.sh        # ~1 minute per repeat on 2 cores
#
# Prints: index memory (the sidecar's RSS before/after the fill, and the
# indexer's own index_bytes estimate), each phase's RESULT line (snapshot
# time and bytes, live p50/p99), a summary (medians of p50/p99 per phase,
# the per-round p99 difference snapshots - baseline, snapshot seconds, load
# average at start and end), the sidecar's peak RSS (VmHWM), and one line
# `BENCH_SNAPSHOT {json}` for scripts.
# Environment: BUILD_DIR [build]  BENCH [$BUILD_DIR/tests/bench_relay]  BLOCKS [1000000]  RATE [5000]  LAT_SECONDS [4]
#   REPEATS [3]  REPLAY_RATE [50000] (events.replay_rate: snapshot batches/s)
#   REPLAY_NICE [the config default] (events.replay_nice; unset for builds
#   that do not know the key)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
BLOCKS="${BLOCKS:-1000000}"
RATE="${RATE:-5000}"
LAT_SECONDS="${LAT_SECONDS:-4}"
REPEATS="${REPEATS:-3}"
REPLAY_RATE="${REPLAY_RATE:-50000}"
SIDECAR="$BUILD_DIR/kvsidecar"
# The client side may come from another build (e.g. the current bench
# against an older sidecar): BENCH overrides it.
BENCH="${BENCH:-$BUILD_DIR/tests/bench_relay}"
WORK="$(mktemp -d)"
trap 'kill $SC_PID 2>/dev/null || true; rm -rf "$WORK"' EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
INGEST=$(port); PUB=$(port); REPLAY=$(port)
EXTRA=()
[[ -n "${REPLAY_NICE:-}" ]] && EXTRA+=(--set events.replay_nice="$REPLAY_NICE")
# Every stats line written (the driver reads them), where the binary has the key.
"$SIDECAR" --print-default-config | grep '^stats_repeat' >/dev/null && EXTRA+=(--set 'sidecar.stats_repeat="0s"')

LOAD_START="$(cut -d' ' -f1-3 /proc/loadavg)"
# The replay buffer is kept small so the RSS delta is the index alone.
"$SIDECAR" --set cache.enabled=false --set http.enabled=false --set sidecar.stats_interval=1s \
  --set events.ingest_endpoint="tcp://127.0.0.1:$INGEST" \
  --set events.endpoint="tcp://*:$PUB" --set events.replay_endpoint="tcp://*:$REPLAY" \
  --set events.buffer_steps=16 --set events.replay_rate="$REPLAY_RATE" \
  --set events.index_max_blocks=$((BLOCKS + 100000)) "${EXTRA[@]}" 2>"$WORK/sidecar.log" &
SC_PID=$!
for _ in $(seq 100); do grep -q "kvsidecar ready" "$WORK/sidecar.log" && break; sleep 0.1; done
rss() { awk -v k="$1:" '$1 == k {print $2 * 1024}' "/proc/$SC_PID/status"; }

RSS0=$(rss VmRSS)
# Phase 1: fill the index (no measurement load).
"$BENCH" latency --batch 16 --rate 1000 --seconds 0.01 --ingest-port "$INGEST" --sub-port "$PUB" \
  --fill-blocks "$BLOCKS" > "$WORK/fill.out" 2>&1
# The index follows the published stream on its own thread: wait until its
# stats line (once a second) shows every block (older builds kept the index
# in the publisher, whose line is read then).
STATS=""
for _ in $(seq 120); do
  sleep 0.5
  STATS=$(grep -E "(index|publisher)\[dp=0\].*stats:.*index_blocks" "$WORK/sidecar.log" | tail -1 || true)
  [[ "$STATS" =~ index_blocks=([0-9]+) ]] && (( BASH_REMATCH[1] >= BLOCKS )) && break
done
RSS1=$(rss VmRSS)
echo "index: blocks=$BLOCKS rss_before=$RSS0 rss_after=$RSS1 rss_per_block=$(( (RSS1 - RSS0) / BLOCKS ))"
echo "index stats: ${STATS#*stats: }"

# Phase 2: live latency without and with snapshots in a loop, alternating.
# Every bench_relay run is a new engine stream (its seq starts at 0 again),
# which the sidecar fences with AllBlocksCleared: the index is emptied, so
# each run fills it again, and waits until the sidecar's index has applied
# the fill (--index-port), before it measures.
: > "$WORK/results.txt"
for REP in $(seq 1 "$REPEATS"); do
  "$BENCH" latency --batch 16 --rate "$RATE" --seconds "$LAT_SECONDS" --ingest-port "$INGEST" \
    --sub-port "$PUB" --fill-blocks "$BLOCKS" --index-port "$REPLAY" 2>/dev/null | sed "s/^/baseline: /; s/\$/ rep=$REP/" \
    | tee -a "$WORK/results.txt"
  "$BENCH" latency --batch 16 --rate "$RATE" --seconds "$LAT_SECONDS" --ingest-port "$INGEST" \
    --sub-port "$PUB" --replay-port "$REPLAY" --snapshot 1 --fill-blocks "$BLOCKS" \
    --index-port "$REPLAY" 2>/dev/null \
    | sed "s/^/snapshots: /; s/\$/ rep=$REP/" | tee -a "$WORK/results.txt"
done
LOAD_END="$(cut -d' ' -f1-3 /proc/loadavg)"
PEAK=$(rss VmHWM)
echo "sidecar: peak_rss=$PEAK rss_now=$(rss VmRSS)"
grep -E "snapshot [0-9]+ at seq" "$WORK/sidecar.log" | head -3 || true
python3 - "$WORK/results.txt" "$LOAD_START" "$LOAD_END" "$PEAK" "$BLOCKS" "$RSS0" "$RSS1" <<'PY'
import json, statistics, sys
path, load_start, load_end, peak, blocks, rss0, rss1 = sys.argv[1:8]
rows = {"baseline": [], "snapshots": []}
for line in open(path):
    phase, rest = line.split(":", 1)
    kv = dict(p.split("=", 1) for p in rest.split()[2:])
    rows[phase.strip()].append(kv)
med = lambda phase, k: statistics.median(float(r[k]) for r in rows[phase]) if rows[phase] else None
deltas = [float(s["p99_us"]) - float(b["p99_us"]) for b, s in zip(rows["baseline"], rows["snapshots"])]
snap_s = [float(r["first_request_s"]) for r in rows["snapshots"] if float(r["first_request_s"]) > 0]
out = {
    "load_start": load_start, "load_end": load_end, "repeats": len(rows["baseline"]),
    "baseline_p50_us": med("baseline", "p50_us"), "baseline_p99_us": med("baseline", "p99_us"),
    "snapshots_p50_us": med("snapshots", "p50_us"), "snapshots_p99_us": med("snapshots", "p99_us"),
    "p99_baseline_runs_us": [float(r["p99_us"]) for r in rows["baseline"]],
    "p99_snapshot_runs_us": [float(r["p99_us"]) for r in rows["snapshots"]],
    "p99_delta_runs_us": deltas,
    "p99_delta_median_us": statistics.median(deltas) if deltas else None,
    "sender_late_us_median": {p: med(p, "worst_late_us") for p in rows},
    "snapshots_per_run": [int(r["requests_done"]) for r in rows["snapshots"]],
    "first_snapshot_s": snap_s, "snapshot_bytes": max((int(r["request_bytes"]) for r in rows["snapshots"]), default=0),
    "lost": sum(int(r["lost"]) for p in rows for r in rows[p]),
    "peak_rss_bytes": int(peak), "rss_per_block": (int(rss1) - int(rss0)) / int(blocks),
}
f = lambda v: "-" if v is None else f"{v:,.0f}"
print(f"summary ({out['repeats']} rounds, load {load_start} -> {load_end}):")
print(f"  live p50 / p99 without a snapshot: {f(out['baseline_p50_us'])} / {f(out['baseline_p99_us'])} us (medians)")
print(f"  live p50 / p99 during snapshots:   {f(out['snapshots_p50_us'])} / {f(out['snapshots_p99_us'])} us (medians)")
print(f"  p99 snapshots - baseline per round: {', '.join(f(d) for d in deltas)} us (median {f(out['p99_delta_median_us'])})")
print(f"  first snapshot of each run: {', '.join(f'{s:.2f}' for s in snap_s)} s; snapshots per run {out['snapshots_per_run']}; lost {out['lost']}")
print("BENCH_SNAPSHOT " + json.dumps(out, sort_keys=True))
PY
kill -TERM $SC_PID; wait $SC_PID || true
