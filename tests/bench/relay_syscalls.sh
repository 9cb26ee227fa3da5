#!/usr/bin/env bash
# System calls per relayed batch, by sidecar thread (perf stat's syscall
# tracepoints, --per-thread) during one relay run: how many batches each
# wake-up and each socket call of the ZeroMQ I/O thread moves. Needs perf
# and the right to trace (root, or kernel.perf_event_paranoid <= -1).
#
#   tests/bench/relay_syscalls.sh           # ~10 seconds
#
# Environment: BUILD_DIR [build-bench]  SIZE [16] events/batch
# RUN_SECONDS [3]  EXTRA kvsidecar arguments (--set ...).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-bench}"
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
SIZE="${SIZE:-16}"
RUN_SECONDS="${RUN_SECONDS:-3}"
command -v perf >/dev/null || { echo "perf is not installed" >&2; exit 1; }
for f in "$BUILD_DIR/kvsidecar" "$BUILD_DIR/tests/bench_relay"; do
  [[ -x "$f" ]] || { echo "missing $f: build it first (tests/bench/run_relay_bench.sh builds both)" >&2; exit 1; }
done
# shellcheck source=relay_sidecar.sh
source "$ROOT/tests/bench/relay_sidecar.sh"
read -r -a PORTS < <(free_ports 3)
WORK="$(mktemp -d)"
trap 'kill ${SIDECAR_PID:-} 2>/dev/null; wait; rm -rf "$WORK"' EXIT
# shellcheck disable=SC2086  # EXTRA is a list of arguments
start_relay_sidecar "$BUILD_DIR/kvsidecar" "$WORK/sidecar.err" "${PORTS[@]}" ${EXTRA:-}
PID=$SIDECAR_PID
relay() { "$BUILD_DIR/tests/bench_relay" relay --batch "$SIZE" --seconds "$1" \
            --ingest-port "${PORTS[0]}" --sub-port "${PORTS[1]}" | grep RESULT; }
relay 1 >/dev/null # warm-up: fills the replay ring
EVENTS="$(perf list 2>/dev/null | grep -oE 'syscalls:sys_enter_(write|sendto|sendmsg|recvfrom|recvmsg|read|epoll_wait|poll|futex)\b' | sort -u | paste -sd, -)"
perf stat -e "$EVENTS" --per-thread -p "$PID" -o "$WORK/stat" -- sleep "$((RUN_SECONDS + 1))" &
STAT=$!
OUT="$(relay "$RUN_SECONDS")"
wait "$STAT"
N="$(sed 's/.* received=\([0-9]*\).*/\1/' <<<"$OUT")"
echo "$OUT" | cut -d' ' -f2-5
awk -v n="$N" '$2 ~ /^[0-9,]+$/ && $3 ~ /^syscalls:/ {
  c = $2; gsub(",", "", c); if (c > 0) printf "%-24s %-32s %6.2f per batch\n", $1, substr($3, 20), c / n }' \
  "$WORK/stat" | sort
