#!/usr/bin/env bash
# Quick start: install what is missing, build, and start kvsidecar on its
# built-in default configuration (extra arguments are passed to it, e.g.
# `scripts/run.sh --config my.toml`). Ctrl-C stops it cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# A tree scripts/test.sh (or an earlier run) already configured is only
# brought up to date: configuring again with other options would change the
# flags and rebuild; ninja re-runs CMake by itself when a CMakeLists changes.
[ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSIDECAR_CUDA=AUTO >/dev/null
cmake --build build -j"$(nproc)" --target kvsidecar
exec build/kvsidecar "$@"
