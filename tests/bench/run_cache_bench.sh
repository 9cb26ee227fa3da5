#!/usr/bin/env bash
# KV cache server benchmark: kvsidecar serving the LMCache 0.5.6 MP protocol
# (host backend) on loopback, against a raw libzmq ROUTER echo of the same
# frames and against memcpy of the same bytes, in one run.
#
#   tests/bench/run_cache_bench.sh          # ~2-3 minutes on 2 cores
#
# Steps: build kvsidecar, bench_cache_echo and bench_cache_index (one job);
# start kvsidecar (events off, host backend, 1 GiB L1, stats every 250 ms)
# and the echo ROUTER; run bench_cache.py (store/retrieve GB/s interleaved
# with memcpy, then the lookup+wait round trip interleaved with the echo,
# then 1,000 concurrent sessions); stop both (kvsidecar must exit 0); run
# bench_cache_index's lookups over 1,000,000 indexed chunks; print one
# table (medians, ratios against the targets) and the load average.
#
# Environment (defaults in brackets):
#   BUILD_DIR [build-cbench]  REPS [5]  RTT_ITERS [2000]  SESSIONS [1000]
#   LAYOUTS ["sglang,vllm"]  NO_BUILD=1 to use the binaries as they are;
#   KEEP=DIR keeps the logs and JSON results there.
#   METRICS [scrape|off]: /metrics on and scraped every second, or HTTP off
#   (tests/bench/metrics_mode.sh; run_metrics_overhead.sh compares the two).
#   SIDECAR_SETS: more `--set k=v` for kvsidecar, space-separated, e.g.
#   "sidecar.worker_threads=1" (A/B runs of one setting).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-cbench}"
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
REPS="${REPS:-5}"
RTT_ITERS="${RTT_ITERS:-2000}"
SESSIONS="${SESSIONS:-1000}"
LAYOUTS="${LAYOUTS:-sglang,vllm}"
PY="${PYTHON:-python3}"

SIDECAR="$BUILD_DIR/kvsidecar"
ECHO="$BUILD_DIR/tests/bench_cache_echo"
INDEX="$BUILD_DIR/tests/bench_cache_index"
DRIVER="$ROOT/tests/bench/bench_cache.py"

# --- build (only what is needed, one job: the machine is shared) -----------------
if [[ "${NO_BUILD:-0}" != 1 ]]; then
  if [[ ! -f "$BUILD_DIR/build.ninja" && ! -f "$BUILD_DIR/Makefile" ]]; then
    cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSIDECAR_BENCH=ON >/dev/null
  fi
  BUILD_LOG="${TMPDIR:-/tmp}/cache_bench_build.$$.log"
  if ! cmake --build "$BUILD_DIR" -j1 --target kvsidecar bench_cache_echo bench_cache_index >"$BUILD_LOG" 2>&1; then
    if [[ -x "$SIDECAR" && -x "$ECHO" && -x "$INDEX" ]]; then
      echo "warning: build failed (see $BUILD_LOG); using the existing binaries" >&2
    else
      cat "$BUILD_LOG" >&2
      exit 1
    fi
  fi
fi
for f in "$SIDECAR" "$ECHO" "$INDEX"; do
  [[ -x "$f" ]] || { echo "missing $f (build it or unset NO_BUILD)" >&2; exit 1; }
done

WORK="${KEEP:-$(mktemp -d "${TMPDIR:-/tmp}/cache_bench.XXXXXX")}"
mkdir -p "$WORK"

source "$ROOT/tests/bench/metrics_mode.sh"
read -r P_CACHE P_ECHO P_HTTP < <("$PY" - <<'EOF'
import socket
socks = []
for _ in range(3):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(*[s.getsockname()[1] for s in socks])
EOF
)

SIDECAR_PID=""
ECHO_PID=""
STOP_RC=0
stop_pid() {  # pid: SIGTERM, wait; the exit status in STOP_RC (not in a subshell: wait needs the parent)
  STOP_RC=0
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || STOP_RC=$?
}
cleanup() {
  stop_scraper
  if [[ -n "$SIDECAR_PID" ]]; then stop_pid "$SIDECAR_PID"; fi
  if [[ -n "$ECHO_PID" ]]; then stop_pid "$ECHO_PID"; fi
  # Pools the driver left behind if it was killed.
  rm -f /dev/shm/kvs_cb_* 2>/dev/null || true
  [[ -n "${KEEP:-}" ]] || rm -rf "$WORK"
}
trap cleanup EXIT

LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"

# --- servers ----------------------------------------------------------------------------
# Stats lines are INFO: log_level stays info so the driver can read locks and
# sessions from them; nothing else logs per request at that level. Every
# line is written (sidecar.stats_repeat = 0s, where the binary has it: an
# A/B against an older build runs the same script).
REPEAT=()
"$SIDECAR" --print-default-config | grep '^stats_repeat' >/dev/null && REPEAT=(--set 'sidecar.stats_repeat="0s"')
"$SIDECAR" "${REPEAT[@]}" --set events.enabled=false --set gpu.backend=\"host\" --set cache.l1_size=\"1GiB\" \
  --set cache.endpoint=\"tcp://127.0.0.1:$P_CACHE\" --set sidecar.log_level=\"info\" \
  --set sidecar.stats_interval=\"250ms\" $(metrics_args "$P_HTTP") \
  $(for kv in ${SIDECAR_SETS:-}; do printf -- '--set %s ' "$kv"; done) \
  >"$WORK/kvsidecar.stdout.log" 2>"$WORK/kvsidecar.stderr.log" &
SIDECAR_PID=$!
"$ECHO" echo --endpoint "tcp://127.0.0.1:$P_ECHO" --hits 8 2>"$WORK/echo.log" &
ECHO_PID=$!
for _ in $(seq 1 200); do
  grep -q "kvsidecar ready" "$WORK/kvsidecar.stderr.log" 2>/dev/null && break
  kill -0 "$SIDECAR_PID" 2>/dev/null || { cat "$WORK/kvsidecar.stderr.log" >&2; exit 1; }
  sleep 0.05
done
grep -q "kvsidecar ready" "$WORK/kvsidecar.stderr.log" || { echo "kvsidecar not ready" >&2; exit 1; }

start_scraper "$P_HTTP"
echo "kvsidecar pid $SIDECAR_PID on $P_CACHE, echo on $P_ECHO, metrics $METRICS; work dir $WORK"
T0=$(date +%s)
"$PY" "$DRIVER" run --server "tcp://127.0.0.1:$P_CACHE" --echo "tcp://127.0.0.1:$P_ECHO" \
  --log "$WORK/kvsidecar.stderr.log" --memcpy-bin "$ECHO" --out "$WORK/server.json" \
  --server-pid "$SIDECAR_PID" --echo-pid "$ECHO_PID" \
  --reps "$REPS" --rtt-iters "$RTT_ITERS" --sessions "$SESSIONS" --layouts "$LAYOUTS" --workdir "$WORK"
LOAD_DURING="$(cut -d' ' -f1-3 /proc/loadavg)"

stop_scraper
stop_pid "$SIDECAR_PID"; RC_SIDECAR=$STOP_RC; SIDECAR_PID=""
stop_pid "$ECHO_PID"; RC_ECHO=$STOP_RC; ECHO_PID=""
[[ "$RC_SIDECAR" == 0 ]] || { echo "kvsidecar exited with $RC_SIDECAR" >&2; tail -20 "$WORK/kvsidecar.stderr.log" >&2; exit 1; }
WARNS=$(grep -c -E "Z (WARN|ERROR|CRITICAL) " "$WORK/kvsidecar.stderr.log" || true)

# --- the chunk index with 1,000,000 entries --------------------------------------------------
echo "chunk index lookups over 1,000,000 chunks ..."
"$INDEX" --benchmark_filter='BM_Lookup|BM_LedgerLookupEnd' --benchmark_min_time=0.3 \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_out="$WORK/index_all.json" --benchmark_out_format=json >"$WORK/index.txt" 2>&1
# Keep the medians only.
"$PY" - "$WORK/index_all.json" "$WORK/index.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
d["benchmarks"] = [dict(b, name=b["run_name"]) for b in d["benchmarks"] if b.get("aggregate_name") == "median"]
json.dump(d, open(sys.argv[2], "w"))
EOF
T1=$(date +%s)

echo
echo "== KV cache server benchmark ($(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), $((T1 - T0)) s) =="
"$PY" "$DRIVER" report --server-json "$WORK/server.json" --index-json "$WORK/index.json" \
  --loadavg "before $LOAD_BEFORE, after the server phases $LOAD_DURING"
echo "kvsidecar exit status $RC_SIDECAR, echo $RC_ECHO; warn/error lines in the sidecar log: $WARNS"
