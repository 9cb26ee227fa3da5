#!/usr/bin/env bash
# Every test: installs what is missing, then
#   1. release build (CUDA backend compiled when nvcc is present): the unit
#      tests (doctest) and the integration tests labelled "release" (the
#      real vLLM engine, memory bounds, start/stop);
#   2. every test, unit and integration (pytest against the real binary),
#      built with AddressSanitizer + UBSan;
#   3. each fuzz target (libFuzzer, clang) for a short run.
# Set KVS_SKIP_ASAN=1 or KVS_SKIP_FUZZ=1 to leave a stage out locally.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each stage's wall time, and the tests pytest skipped (with why), printed
# at the end whether the run passed or not: the tail of a CI log says where
# the time went and whether the engine test ran.
stages=() stage_name="" stage_t0=$SECONDS
stage() {
  [ -n "$stage_name" ] && stages+=("$stage_name $((SECONDS - stage_t0)) s")
  stage_name=$1 stage_t0=$SECONDS
  [ -n "$1" ] && echo "== $1"
  return 0
}
summary() {
  local rc=$?
  stage ""
  echo "== test.sh summary (exit $rc, $SECONDS s):"
  printf '   %s\n' "${stages[@]}"
  for d in build build-asan; do
    local log=$d/Testing/Temporary/LastTest.log
    [ -f "$log" ] || continue
    local skips
    skips=$(grep -h "^SKIPPED" "$log" | sed 's/^/   /' || true)
    [ -n "$skips" ] && echo "   skipped in $d:" && echo "$skips"
  done
  return $rc
}
trap summary EXIT

stage "install dependencies"
scripts/install-deps.sh --with-python
jobs=$(nproc)
# The seed publisher test (tests/integration/test_events_seed.py) is an extra:
# it runs only when KVS_SHARED_DIR names a folder with the seeds; the suite
# needs nothing beside this repository.
wheel=$(ls build-wheels/lmcache-0.5.6-*.whl 2>/dev/null | head -1 || true)
[ -n "$wheel" ] && export LMCACHE_WHEEL="$PWD/$wheel"

stage "release build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVSIDECAR_CUDA=AUTO >/dev/null
cmake --build build -j"$jobs"
# Every integration test runs once, in the strictest build that can run it:
# under ASan/UBSan below. The release build runs the unit tests and the
# integration tests labelled "release" (tests/CMakeLists.txt: the real
# engine, which skips itself under sanitizers; the memory bounds ASan's
# quarantine hides; the start/stop paths of the shipped binary). With
# KVS_SKIP_ASAN=1 it runs everything.
stage "release tests"
if [ -z "${KVS_SKIP_ASAN:-}" ]; then
  ctest --test-dir build --output-on-failure -j1 -L '^(unit|release)$'
else
  ctest --test-dir build --output-on-failure -j1
fi

if [ -z "${KVS_SKIP_ASAN:-}" ]; then
  stage "AddressSanitizer + UBSan build"
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKVSIDECAR_SANITIZE=ON \
        -DKVSIDECAR_CUDA=OFF -DKVSIDECAR_BENCH=OFF >/dev/null
  cmake --build build-asan -j"$jobs"
  stage "AddressSanitizer + UBSan tests"
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j1
fi

if [ -z "${KVS_SKIP_FUZZ:-}" ]; then
  stage "fuzz targets (libFuzzer)"
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
        -DKVSIDECAR_FUZZ=ON -DKVSIDECAR_CUDA=OFF -DKVSIDECAR_BENCH=OFF >/dev/null
  fuzzers=(fuzz_events_decode fuzz_lmcache_decode fuzz_pickle fuzz_http_request fuzz_http_admin fuzz_grpc_transcode
           fuzz_tensor_envelope)
  cmake --build build-fuzz -j"$jobs" --target "${fuzzers[@]}"
  for f in "${fuzzers[@]}"; do
    corpus=build-fuzz/corpus/$f
    mkdir -p "$corpus"
    echo "-- $f (${KVS_FUZZ_SECONDS:-15}s)"
    # New inputs go to the first folder (build-fuzz/); the committed seeds
    # (tests/tools/make_fuzz_seeds.py: real engine inputs) are only read.
    build-fuzz/tests/$f -max_total_time="${KVS_FUZZ_SECONDS:-15}" -rss_limit_mb=2048 \
      -print_final_stats=1 "$corpus" "tests/fuzz/seeds/$f" 2>&1 | tail -3
  done
fi
echo "all tests passed"
