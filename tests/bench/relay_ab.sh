#!/usr/bin/env bash
# Two sidecars side by side, A and B, relay runs alternating between them:
# events/s and sidecar CPU per batch (whole process, and its ZeroMQ I/O
# thread) for each run, then per size the medians and the median of B/A over
# the pairs. Alternating pairs on one machine is how a change is told from
# this 2-core machine's noise (a single run varies by 15-25%).
#
#   EXTRA_A="--set sidecar.io_nice=0" tests/bench/relay_ab.sh          # ~1 minute
#   RENICE_B="ZMQbg/IO/0=-5 ingest:0=-5" tests/bench/relay_ab.sh       # renice B's threads by name
#
# Environment: BUILD_A, BUILD_B [build-bench] (each with kvsidecar and
# tests/bench_relay)  EXTRA_A, EXTRA_B extra kvsidecar arguments (--set ...)
# RENICE_B "thread=nice ..." set once B runs  SIZES ["16"]  REPEATS [6] pairs
# RUN_SECONDS [2] per run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
abs() { case "$1" in /*) echo "$1" ;; *) echo "$ROOT/$1" ;; esac; }
BUILD_A="$(abs "${BUILD_A:-build-bench}")"
BUILD_B="$(abs "${BUILD_B:-build-bench}")"
SIZES="${SIZES:-16}"
REPEATS="${REPEATS:-6}"
RUN_SECONDS="${RUN_SECONDS:-2}"
for b in "$BUILD_A" "$BUILD_B"; do
  for f in "$b/kvsidecar" "$b/tests/bench_relay"; do
    [[ -x "$f" ]] || { echo "missing $f: build it first (tests/bench/run_relay_bench.sh builds both)" >&2; exit 1; }
  done
done

# shellcheck source=relay_sidecar.sh
source "$ROOT/tests/bench/relay_sidecar.sh"
WORK="$(mktemp -d)"
PA="" PB=""
trap 'kill $PA $PB 2>/dev/null; wait; rm -rf "$WORK"' EXIT
read -r INA PUBA REPA INB PUBB REPB < <(free_ports 6)
# shellcheck disable=SC2086  # EXTRA_A/B are lists of arguments
start_relay_sidecar "$BUILD_A/kvsidecar" "$WORK/a.err" "$INA" "$PUBA" "$REPA" ${EXTRA_A:-}
PA=$SIDECAR_PID
# shellcheck disable=SC2086
start_relay_sidecar "$BUILD_B/kvsidecar" "$WORK/b.err" "$INB" "$PUBB" "$REPB" ${EXTRA_B:-}
PB=$SIDECAR_PID
for spec in ${RENICE_B:-}; do
  for t in /proc/$PB/task/*; do
    if [[ "$(cat "$t/comm")" == "${spec%=*}" ]]; then
      renice -n "${spec#*=}" -p "${t##*/}" >/dev/null
      echo "B: ${spec%=*} at nice ${spec#*=}"
    fi
  done
done

ticks() { awk '{print $14 + $15}' "$1"; }
io_ticks() {
  local t; for t in /proc/$1/task/*; do
    if [[ "$(cat "$t/comm")" == "ZMQbg/IO/0" ]]; then ticks "$t/stat"; fi
  done
}
# one BUILD PID INGEST PUB SIZE -> "events/s cpu_us_per_batch io_us_per_batch"
one() {
  local c0 i0 c1 i1 out
  c0=$(ticks "/proc/$2/stat"); i0=$(io_ticks "$2")
  out=$("$1/tests/bench_relay" relay --batch "$5" --seconds "$RUN_SECONDS" --ingest-port "$3" \
        --sub-port "$4" | grep RESULT)
  c1=$(ticks "/proc/$2/stat"); i1=$(io_ticks "$2")
  python3 - "$out" "$c0" "$c1" "$i0" "$i1" "$(getconf CLK_TCK)" <<'PY'
import sys
kv = dict(p.split("=", 1) for p in sys.argv[1].split()[1:])
c0, c1, i0, i1, hz = map(float, sys.argv[2:7])
n = max(1, int(kv["received"]))
print(kv["events_per_s"], f"{(c1 - c0) * 1e6 / hz / n:.2f}", f"{(i1 - i0) * 1e6 / hz / n:.2f}")
PY
}

OUT="$WORK/runs"
# Warm both (fill their replay rings) before measuring.
for s in $SIZES; do one "$BUILD_A" "$PA" "$INA" "$PUBA" "$s" >/dev/null; one "$BUILD_B" "$PB" "$INB" "$PUBB" "$s" >/dev/null; done
for _ in $(seq "$REPEATS"); do
  for s in $SIZES; do
    echo "A $s $(one "$BUILD_A" "$PA" "$INA" "$PUBA" "$s")" | tee -a "$OUT"
    echo "B $s $(one "$BUILD_B" "$PB" "$INB" "$PUBB" "$s")" | tee -a "$OUT"
  done
done
python3 - "$OUT" <<'PY'
import statistics as st, sys
rows = [l.split() for l in open(sys.argv[1])]
for s in sorted({r[1] for r in rows}, key=int):
    a = [r for r in rows if r[0] == "A" and r[1] == s]
    b = [r for r in rows if r[0] == "B" and r[1] == s]
    for k, r in (("A", a), ("B", b)):
        print(f"size {s} {k}: events/s {st.median(float(x[2]) for x in r):,.0f}, sidecar CPU "
              f"{st.median(float(x[3]) for x in r):.2f} us/batch (I/O thread "
              f"{st.median(float(x[4]) for x in r):.2f})")
    ratios = [float(y[2]) / float(x[2]) for x, y in zip(a, b)]
    print(f"size {s}: B/A per pair, median {st.median(ratios):.3f} "
          f"(B better in {sum(q > 1 for q in ratios)} of {len(ratios)})")
PY
