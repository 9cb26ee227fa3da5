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
# creates VENV on first use. Prints one markdown table per transport
# (kvsidecar vs LMCache: medians of REPS alternating A/B blocks), with both
# transports a table of kvsidecar's gRPC endpoint vs its ZeroMQ one, the
# memcpy reference measured in the same run, the load average after each
# repetition, and the machine (lscpu model, vCPUs, memory). 5–7 minutes per
# transport at the defaults on 2 vCPUs; ~12 GiB of memory at L1_GB=4 and one
# transport (both L1s, ~1.5 GiB of shm pools per server); TRANSPORT=both runs
# one kvsidecar (both endpoints) and two LMCache servers (one per transport):
# ~3 L1s.
#
# Environment (defaults in brackets): VENV [build-lmcache-venv]
#   PYTHON [python3.11] (makes VENV)
#   TRANSPORT [both]: zmq (kvsidecar's cache.endpoint, LMCache's default
#     transport), grpc (kvsidecar's cache.grpc_endpoint, LMCache's
#     `--transport grpc`; LMCache's gRPC client), or both, in one run
#   LMCACHE_CLIENT [0.5.6]: 0.5.7 puts lmcache==0.5.7rc2 (pip install --no-deps
#     --target LMC057_DIR [build-lmcache-0.5.7rc2], ~100 MB, on first use; same
#     dependencies as 0.5.6) ahead of VENV's 0.5.6 on PYTHONPATH: the client
#     and LMCache's own server are then 0.5.7rc2's (0.5.6's server cannot
#     serve a 0.5.7 client)
#   KVSIDECAR: a built kvsidecar binary to use as it is (no configure, no
#     build); otherwise BUILD_DIR's is built
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
TRANSPORT="${TRANSPORT:-both}"
LMCACHE_CLIENT="${LMCACHE_CLIENT:-0.5.6}"
case "$TRANSPORT" in zmq|grpc|both) ;; *) echo "TRANSPORT: zmq, grpc or both" >&2; exit 2;; esac
use() { [[ "$TRANSPORT" == both || "$TRANSPORT" == "$1" ]]; }
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

case "$LMCACHE_CLIENT" in
  0.5.6) ;;
  0.5.7)
    LMC057_DIR="${LMC057_DIR:-$ROOT/build-lmcache-0.5.7rc2}"
    if [[ ! -f "$LMC057_DIR/lmcache/__init__.py" ]]; then
      echo "installing lmcache==0.5.7rc2 (--no-deps) into $LMC057_DIR ..."
      "$VENV/bin/pip" install -q --no-deps --target "$LMC057_DIR" "lmcache==0.5.7rc2"
    fi
    export PYTHONPATH="$LMC057_DIR${PYTHONPATH:+:$PYTHONPATH}";;
  *) echo "LMCACHE_CLIENT: 0.5.6 or 0.5.7" >&2; exit 2;;
esac

if [[ -n "${KVSIDECAR:-}" ]]; then
  [[ -x "$KVSIDECAR" ]] || { echo "KVSIDECAR=$KVSIDECAR is not an executable" >&2; exit 2; }
else
  if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
    cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  cmake --build "$BUILD_DIR" -j2 --target kvsidecar >/dev/null
  KVSIDECAR="$BUILD_DIR/kvsidecar"
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# kvsidecar's ZeroMQ endpoint is always on (on a port of its own), its gRPC one
# with TRANSPORT grpc/both. Every server serves Prometheus metrics, on 9090 by
# default: one port each.
PA="$(free_port)"; MA="$(free_port)"
A_SET=(--set "cache.endpoint=tcp://127.0.0.1:$PA")
if use grpc; then
  PAG="$(free_port)"
  A_SET+=(--set "cache.grpc_endpoint=grpc://127.0.0.1:$PAG")
fi

"$KVSIDECAR" --set events.enabled=false --set gpu.backend=host "${A_SET[@]}" \
  --set "cache.l1_size=${L1_GB}GiB" --set "http.listen=127.0.0.1:$MA" \
  2>"$WORK/kvsidecar.log" &
A_PID=$!
PIDS=("$A_PID")
cleanup() {
  kill -TERM "${PIDS[@]}" 2>/dev/null || true
  wait "${PIDS[@]}" 2>/dev/null || true
}
trap cleanup EXIT

# LMCache's server, one per transport: start_lmcache TRANSPORT PORT; sets
# B_PID and B_LAUNCH. Usage telemetry off: it would report to LMCache's stats
# host (no network here).
start_lmcache() {
  local mport; mport="$(free_port)"
  B_LAUNCH="$(date +%s.%N)"
  LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1 \
  "$VENV/bin/python" -m lmcache.v1.multiprocess.server --transport "$1" \
    --host 127.0.0.1 --port "$2" \
    --chunk-size 256 --l1-size-gb "$L1_GB" --eviction-policy LRU --prometheus-port "$mport" \
    >"$WORK/lmcache-$1.log" 2>&1 &
  B_PID=$!
  PIDS+=("$B_PID")
}
ARGS=(--transport "$TRANSPORT" --a-pid "$A_PID")
READY=()  # URL LAUNCH_TIME NAME, for the start-up check
if use zmq; then
  PB="$(free_port)"; start_lmcache zmq "$PB"
  ARGS+=(--a "tcp://127.0.0.1:$PA" --b "tcp://127.0.0.1:$PB" --b-pid "$B_PID")
  READY+=("tcp://127.0.0.1:$PA" 0 kvsidecar-zmq "tcp://127.0.0.1:$PB" "$B_LAUNCH" lmcache-zmq)
fi
if use grpc; then
  PBG="$(free_port)"; start_lmcache grpc "$PBG"
  ARGS+=(--a-grpc "grpc://127.0.0.1:$PAG" --b-grpc "grpc://127.0.0.1:$PBG" --b-grpc-pid "$B_PID")
  READY+=("grpc://127.0.0.1:$PAG" 0 kvsidecar-grpc "grpc://127.0.0.1:$PBG" "$B_LAUNCH" lmcache-grpc)
fi

# All answer NOOP (LMCache's start-up takes a while: torch, its L1 buffer);
# how long each LMCache server took from its launch is printed at the end.
"$VENV/bin/python" - "${READY[@]}" >"$WORK/lmcache_startup.txt" <<'PY'
import sys, time
from lmcache.v1.multiprocess.transport.factory import RequestClientFactory
args = sys.argv[1:]
for url, launched, name in zip(args[0::3], args[1::3], args[2::3]):
    c = RequestClientFactory.create(url)
    deadline = time.monotonic() + 300
    while True:
        try:
            if c.noop().result(timeout=5) == "OK":
                break
        except Exception:
            pass
        if time.monotonic() > deadline:
            sys.exit(f"{name} on {url} not ready after 300 s")
        time.sleep(0.2)
    c.close()
    if float(launched):
        print(f"{name} {time.time() - float(launched):.1f}")
PY

"$VENV/bin/python" "$ROOT/tests/bench/lmcache_side_by_side.py" "${ARGS[@]}" \
  --reps "$REPS" --rtt-iters "$RTT_ITERS" --rtt-chunks "$RTT_CHUNKS" --copy "$COPY" \
  --sessions "$SESSIONS" --l1-gb "$L1_GB" --out "$WORK/result.json"

kill -TERM "$A_PID"
if ! wait "$A_PID"; then
  echo "kvsidecar did not exit 0 on SIGTERM (log: $WORK/kvsidecar.log)" >&2
  exit 1
fi
echo "start-up: LMCache answered its first NOOP ($(paste -sd, "$WORK/lmcache_startup.txt") s after" \
  "its launch); kvsidecar logged 'starting' at $(head -1 "$WORK/kvsidecar.log" | cut -d' ' -f1)" \
  "and 'ready' at $(grep -m1 'kvsidecar ready' "$WORK/kvsidecar.log" | cut -d' ' -f1)"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) vCPUs, $(free -g | awk '/Mem:/{print $2}') GiB; logs and JSON: $WORK"
