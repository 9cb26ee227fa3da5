#!/usr/bin/env bash
# Snapshot benchmark: a rank's index of BLOCKS blocks (default 1 M, 16-token
# blocks), then live latency at RATE batches/s (16 events each) while a
# router asks for snapshots of it in a loop (bench_relay latency --snapshot 1).
#
#   tests/bench/run_snapshot_bench.sh        # ~1 minute
#
# Prints: index memory (the sidecar's RSS before/after the fill, and the
# publisher's own index_bytes estimate), each phase's RESULT line (snapshot
# time and bytes, live p50/p99), and the sidecar's peak RSS (VmHWM).
# Environment: BUILD_DIR [build]  BLOCKS [1000000]  RATE [5000]  LAT_SECONDS [4]
#   REPLAY_RATE [50000] (events.replay_rate: snapshot batches/s)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
BLOCKS="${BLOCKS:-1000000}"
RATE="${RATE:-5000}"
LAT_SECONDS="${LAT_SECONDS:-4}"
REPLAY_RATE="${REPLAY_RATE:-50000}"
SIDECAR="$BUILD_DIR/kvsidecar"
BENCH="$BUILD_DIR/tests/bench_relay"
WORK="$(mktemp -d)"
trap 'kill $SC_PID 2>/dev/null || true; rm -rf "$WORK"' EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
INGEST=$(port); PUB=$(port); REPLAY=$(port)

# The replay buffer is kept small so the RSS delta is the index alone.
"$SIDECAR" --set cache.enabled=false --set sidecar.stats_interval=1s \
  --set events.ingest_endpoint="tcp://127.0.0.1:$INGEST" \
  --set events.endpoint="tcp://*:$PUB" --set events.replay_endpoint="tcp://*:$REPLAY" \
  --set events.buffer_steps=16 --set events.replay_rate="$REPLAY_RATE" \
  --set events.index_max_blocks=$((BLOCKS + 100000)) 2>"$WORK/sidecar.log" &
SC_PID=$!
for _ in $(seq 100); do grep -q "kvsidecar ready" "$WORK/sidecar.log" && break; sleep 0.1; done
rss() { awk -v k="$1:" '$1 == k {print $2 * 1024}' "/proc/$SC_PID/status"; }

RSS0=$(rss VmRSS)
# Phase 1: fill the index (no measurement load).
"$BENCH" latency --batch 16 --rate 1000 --seconds 0.01 --ingest-port "$INGEST" --sub-port "$PUB" \
  --fill-blocks "$BLOCKS" > "$WORK/fill.out"
sleep 1.5 # one stats interval: the publisher logs index_bytes
RSS1=$(rss VmRSS)
STATS=$(grep "publisher\[dp=0\].*stats:" "$WORK/sidecar.log" | tail -1)
echo "index: blocks=$BLOCKS rss_before=$RSS0 rss_after=$RSS1 rss_per_block=$(( (RSS1 - RSS0) / BLOCKS ))"
echo "publisher: ${STATS#*stats: }"

# Phase 2: live latency without and with snapshots in a loop. Every
# bench_relay run is a new engine stream (its seq starts at 0 again), which
# the sidecar fences with AllBlocksCleared: the index is emptied, so each run
# fills it again before it measures.
"$BENCH" latency --batch 16 --rate "$RATE" --seconds "$LAT_SECONDS" --ingest-port "$INGEST" \
  --sub-port "$PUB" --fill-blocks "$BLOCKS" | sed 's/^/baseline: /'
"$BENCH" latency --batch 16 --rate "$RATE" --seconds "$LAT_SECONDS" --ingest-port "$INGEST" \
  --sub-port "$PUB" --replay-port "$REPLAY" --snapshot 1 --fill-blocks "$BLOCKS" | sed 's/^/snapshots: /'
echo "sidecar: peak_rss=$(rss VmHWM) rss_now=$(rss VmRSS)"
grep -E "snapshot [0-9]+ at seq" "$WORK/sidecar.log" | head -3
kill -TERM $SC_PID; wait $SC_PID || true
