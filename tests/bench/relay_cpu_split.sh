#!/usr/bin/env bash
# Where the CPU of a relayed batch goes. For raw (libzmq PUB -> SUB, one hop,
# bench_relay raw) and relay (engine -> kvsidecar -> router, bench_relay
# relay), alternating REPEATS times: the CPU time per batch of the bench
# process (engine + router, user + system, from bash's `time`) and of the
# sidecar, per thread (user + system, from /proc/<pid>/task/*/stat).
# Medians at the end, then what they imply: when both paths are CPU-bound
# (both keep the machine's CPUs busy), relay/raw is about
#   raw's CPU per batch / (relay's bench CPU + the sidecar's) per batch,
# so the sidecar CPU per batch a target ratio allows is
#   raw's CPU per batch / ratio - relay's bench CPU per batch.
#
#   tests/bench/relay_cpu_split.sh          # ~1 minute
#
# Environment: BUILD_DIR [build-bench] (kvsidecar and tests/bench_relay, as
# run_relay_bench.sh builds them)  SIZE [16] events/batch  RUN_SECONDS [2] per run
# REPEATS [5]  RATIO [0.45] the target the budget line is computed for.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-bench}"
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
SIZE="${SIZE:-16}"
RUN_SECONDS="${RUN_SECONDS:-2}"
REPEATS="${REPEATS:-5}"
RATIO="${RATIO:-0.45}"
SIDECAR="$BUILD_DIR/kvsidecar"
BENCH="$BUILD_DIR/tests/bench_relay"
for f in "$SIDECAR" "$BENCH"; do
  [[ -x "$f" ]] || { echo "missing $f: build it first (tests/bench/run_relay_bench.sh builds both)" >&2; exit 1; }
done
WORK="$(mktemp -d)"
# shellcheck source=relay_sidecar.sh
source "$ROOT/tests/bench/relay_sidecar.sh"

read -r P_IN P_PUB P_REP P_RAW < <(free_ports 4)
trap 'kill ${SIDECAR_PID:-} 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
# The same sidecar settings as run_relay_bench.sh's relay runs.
start_relay_sidecar "$SIDECAR" "$WORK/sidecar.err" "$P_IN" "$P_PUB" "$P_REP"
PID=$SIDECAR_PID

threads() { # tid name utime+stime (ticks), one line per sidecar thread
  for t in /proc/$PID/task/*; do
    echo "$(basename "$t") $(tr ' ' _ <"$t/comm") $(awk '{print $14 + $15}' "$t/stat")"
  done
}
run() { # mode rep: appends "mode rep events_per_s batches bench_s" and the thread deltas
  local mode=$1 rep=$2 cmd
  if [[ $mode == raw ]]; then
    cmd=("$BENCH" raw --batch "$SIZE" --seconds "$RUN_SECONDS" --port "$P_RAW")
  else
    cmd=("$BENCH" relay --batch "$SIZE" --seconds "$RUN_SECONDS" --ingest-port "$P_IN" --sub-port "$P_PUB")
  fi
  threads >"$WORK/t0"
  local TIMEFORMAT='CPU %U %S'
  { time "${cmd[@]}" >"$WORK/out" 2>/dev/null; } 2>"$WORK/time"
  threads >"$WORK/t1"
  local line ev nb cpu
  line=$(grep '^RESULT' "$WORK/out")
  ev=$(sed 's/.*events_per_s=\([0-9]*\).*/\1/' <<<"$line")
  nb=$(sed 's/.* received=\([0-9]*\).*/\1/' <<<"$line")
  cpu=$(awk '/^CPU/ {print $2 + $3}' "$WORK/time")
  echo "run $mode $rep $ev $nb $cpu" >>"$WORK/results"
  join "$WORK/t0" "$WORK/t1" | awk -v m="$mode" -v r="$rep" '{print "thread", m, r, $1, $2, $5 - $3}' >>"$WORK/results"
}

# Warm-up: the replay ring holds this size's batches before the first timed run.
"$BENCH" relay --batch "$SIZE" --seconds 1 --ingest-port "$P_IN" --sub-port "$P_PUB" >/dev/null 2>&1
for r in $(seq "$REPEATS"); do
  run raw "$r"
  run relay "$r"
done

python3 - "$WORK/results" "$SIZE" "$RATIO" "$(getconf CLK_TCK)" <<'PY'
import statistics as st, sys
path, size, ratio, hz = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
runs, threads = {}, {}
for f in (l.split() for l in open(path)):
    if f[0] == "run":
        runs[(f[1], f[2])] = (float(f[3]), int(f[4]), float(f[5]))
    else:
        threads.setdefault((f[1], f[2]), []).append((int(f[3]), f[4], float(f[5])))
med = st.median
us = lambda secs, nb: secs * 1e6 / nb
reps = sorted({r for _, r in runs}, key=int)
raw_ev = [runs[("raw", r)][0] for r in reps]
relay_ev = [runs[("relay", r)][0] for r in reps]
raw_cpu = [us(runs[("raw", r)][2], runs[("raw", r)][1]) for r in reps]
bench_cpu = [us(runs[("relay", r)][2], runs[("relay", r)][1]) for r in reps]
side_cpu = [us(sum(t[2] for t in threads[("relay", r)]) / hz, runs[("relay", r)][1]) for r in reps]
print(f"{size} events/batch, {len(reps)} alternating runs of each, medians:")
print(f"  raw:   {med(raw_ev):12,.0f} events/s   bench (engine + router) {med(raw_cpu):5.1f} us CPU per batch")
print(f"  relay: {med(relay_ev):12,.0f} events/s   bench (engine + router) {med(bench_cpu):5.1f} us, "
      f"sidecar {med(side_cpu):5.1f} us CPU per batch")
# Sidecar threads by name; same-named ones numbered in start order (tid).
per = {}
for r in reps:
    nb = runs[("relay", r)][1]
    names = [name for _, name, _ in threads[("relay", r)]]
    seen = {}
    for tid, name, ticks in sorted(threads[("relay", r)]):
        seen[name] = seen.get(name, 0) + 1
        label = name if names.count(name) == 1 else f"{name}#{seen[name]}"
        per.setdefault(label, []).append(us(ticks / hz, nb))
for name, v in sorted(per.items(), key=lambda kv: -med(kv[1])):
    if med(v) >= 0.05:
        print(f"    {name:<22} {med(v):5.1f} us per batch")
model = med(raw_cpu) / (med(bench_cpu) + med(side_cpu))
print(f"  relay/raw measured {med(relay_ev) / med(raw_ev):.2f}; CPU model "
      f"raw / (bench + sidecar) = {model:.2f}")
print(f"  sidecar CPU per batch that {ratio}x raw allows: "
      f"{med(raw_cpu) / ratio - med(bench_cpu):.1f} us (now {med(side_cpu):.1f})")
PY
