#!/usr/bin/env bash
# kvsidecar next to LMCache 0.5.6's own MP server, both on loopback, driven by
# LMCache 0.5.6's own client classes (tests/bench/lmcache_side_by_side.py: what
# is measured, and how). Optional, not in CI (a benchmark, not a test): it
# needs LMCache's Python package and torch 2.14.0 in a virtual environment of
# ~6.3 GB (PyPI's torch wheel brings CUDA libraries; nothing here needs a GPU).
# LMCache's server runs on its CPU platform (StubCPUDevice) and serves
# `cpu_shm` pools there; it cannot register SGLang MHA pools on that platform
# (CPUCacheContext raises AttributeError: 'list' object has no attribute
# 'data_ptr', logged, never answered): the table says so, nothing works
# around it.
#
#   VENV=/work/venv-lmcache tests/bench/run_lmcache_side_by_side.sh
#
# creates VENV on first use. Prints one markdown table (medians of REPS
# alternating A/B blocks), the memcpy reference measured in the same run, the
# load average after each repetition, and the machine (lscpu model, vCPUs,
# memory). 5–7 minutes at the defaults on 2 vCPUs; ~12 GiB of memory at
# L1_GB=4 (both L1s, ~1.5 GiB of shm pools per server).
#
# Environment (defaults in brackets): VENV [build-lmcache-venv]
#   PYTHON [python3.11] (makes VENV)
#   BUILD_DIR [build-cbench]  REPS [5]  RTT_ITERS [1000]  SESSIONS [1000]
#   RTT_CHUNKS [1,8,32] (prompt lengths of the lookup round trips)
#   COPY [32x8,32x1,4x32] (LAYERSxCHUNKS per store/retrieve; a chunk is LAYERS MiB)
#   L1_GB [4]  KEEP=DIR keeps logs and the JSON result.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${VENV:-$ROOT/build-lmcache-venv}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-cbench}"
REPS="${REPS:-5}"
RTT_ITERS="${RTT_ITERS:-1000}"
SESSIONS="${SESSIONS:-1000}"
RTT_CHUNKS="${RTT_CHUNKS:-1,8,32}"
COPY="${COPY:-32x8,32x1,4x32}"
L1_GB="${L1_GB:-4}"
WORK="${KEEP:-$(mktemp -d)}"
mkdir -p "$WORK"

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "creating $VENV (lmcache==0.5.6 and torch: ~6.3 GB) ..."
  # LMCache 0.5.6 ships only CPython 3.11 wheels (its compiled extensions).
  "${PYTHON:-$(command -v python3.11 || command -v python3)}" -m venv "$VENV"
  # torch 2.14.0: the torch LMCache 0.5.6's compiled extensions
  # (lmcache_native: libtorch, libc10) were built against, as vLLM 0.33 pins it.
  "$VENV/bin/pip" install -q "torch==2.14.0" "lmcache==0.5.6" msgspec pyzmq
fi

if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$BUILD_DIR" -j2 --target kvsidecar >/dev/null

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PA="$(free_port)"; PB="$(free_port)"
# Both servers serve Prometheus metrics on 9090 by default: one port each.
MA="$(free_port)"; MB="$(free_port)"

"$BUILD_DIR/kvsidecar" --set events.enabled=false --set gpu.backend=host \
  --set "cache.endpoint=tcp://127.0.0.1:$PA" --set "cache.l1_size=${L1_GB}GiB" \
  --set "http.listen=127.0.0.1:$MA" \
  2>"$WORK/kvsidecar.log" &
A_PID=$!
B_LAUNCH="$(date +%s.%N)"
# Usage telemetry off: it would report to LMCache's stats host (no network here).
LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1 \
"$VENV/bin/python" -m lmcache.v1.multiprocess.server --host 127.0.0.1 --port "$PB" \
  --chunk-size 256 --l1-size-gb "$L1_GB" --eviction-policy LRU --prometheus-port "$MB" \
  >"$WORK/lmcache.log" 2>&1 &
B_PID=$!
cleanup() {
  kill -TERM "$A_PID" "$B_PID" 2>/dev/null || true
  wait "$A_PID" "$B_PID" 2>/dev/null || true
}
trap cleanup EXIT

# Both answer NOOP (LMCache's start-up takes a while: torch, its L1 buffer);
# how long LMCache took from its launch is printed at the end.
"$VENV/bin/python" - "$PA" "$PB" "$B_LAUNCH" >"$WORK/lmcache_startup.txt" <<'PY'
import sys, time
from lmcache.v1.multiprocess.transport.zmq_impl import create_request_client
for port in sys.argv[1:3]:
    c = create_request_client(f"tcp://127.0.0.1:{port}")
    deadline = time.monotonic() + 300
    while True:
        try:
            if c.noop().result(timeout=5) == "OK":
                break
        except Exception:
            pass
        if time.monotonic() > deadline:
            sys.exit(f"server on port {port} not ready after 300 s")
    c.close()
print(f"{time.time() - float(sys.argv[3]):.1f}")
PY

"$VENV/bin/python" "$ROOT/tests/bench/lmcache_side_by_side.py" \
  --a "tcp://127.0.0.1:$PA" --a-pid "$A_PID" --b "tcp://127.0.0.1:$PB" --b-pid "$B_PID" \
  --reps "$REPS" --rtt-iters "$RTT_ITERS" --rtt-chunks "$RTT_CHUNKS" --copy "$COPY" \
  --sessions "$SESSIONS" --l1-gb "$L1_GB" --out "$WORK/result.json"

kill -TERM "$A_PID"
if ! wait "$A_PID"; then
  echo "kvsidecar did not exit 0 on SIGTERM (log: $WORK/kvsidecar.log)" >&2
  exit 1
fi
echo "start-up: LMCache answered its first NOOP $(tail -1 "$WORK/lmcache_startup.txt") s after" \
  "its launch; kvsidecar logged 'starting' at $(head -1 "$WORK/kvsidecar.log" | cut -d' ' -f1)" \
  "and 'ready' at $(grep -m1 'kvsidecar ready' "$WORK/kvsidecar.log" | cut -d' ' -f1)"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) vCPUs, $(free -g | awk '/Mem:/{print $2}') GiB; logs and JSON: $WORK"
