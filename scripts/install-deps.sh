#!/usr/bin/env bash
# Installs what kvsidecar needs to build and test on Debian 12: the Debian
# packages (only when one is missing) and the PyPI packages of the tests.
set -euo pipefail
cd "$(dirname "$0")/.."

DEB_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libcaf-dev cppzmq-dev libzmq3-dev libmsgpack-cxx-dev libtomlplusplus-dev
  doctest-dev libspdlog-dev libfmt-dev libxxhash-dev libcli11-dev libbenchmark-dev
  prometheus-cpp-dev
  clang libclang-rt-14-dev python3 python3-pip
  libhiredis-dev redis-server redis-tools
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
  if ! python3 -c 'import zmq, msgspec, pytest, pydantic, cachetools, yaml, dynamo' 2>/dev/null; then
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
  # LMCache 0.5.6's own client classes drive the cache server in one test
  # file; the wheel is only read (never installed: it needs a GPU stack).
  wheels=build-wheels
  if ! ls "$wheels"/lmcache-0.5.6-*.whl >/dev/null 2>&1; then
    python3 -m pip download -q --no-deps lmcache==0.5.6 -d "$wheels" \
      || echo "warning: could not download lmcache==0.5.6; its client tests will be skipped"
  fi
fi
