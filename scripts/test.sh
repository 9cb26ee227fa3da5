#!/usr/bin/env bash
# Every test: installs what is missing, then
#   1. the shipped build: exactly the Dockerfile's configuration (Release,
#      CUDA off, benchmarks off), warnings as errors: the unit tests and the
#      integration tests labelled "release" (the real vLLM engine, memory
#      bounds, start/stop);
#   2. the CUDA backend (when nvcc is present), RelWithDebInfo: compiled
#      warning-free (no GPU to run it);
#   3. every test, unit and integration (pytest against the real binary),
#      built with AddressSanitizer + UBSan (Debug), the benchmarks compiled;
#   4. each fuzz target (libFuzzer, clang): a reproducible run, fixed seed
#      and a fixed number of inputs over the committed corpus.
# Set KVS_SKIP_ASAN=1 or KVS_SKIP_FUZZ=1 to leave a stage out locally,
# KVS_SKIP_RELWITHDEBINFO=1 to skip the compile check of stage 2.
# KVS_FUZZ_SECONDS=N fuzzes each target N seconds with a random seed instead
# (a longer search, not reproducible); KVS_FUZZ_RUNS=N changes the fixed
# run's number of inputs (default 50000: ~1-2 minutes for all targets).
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

stage "release build (the Dockerfile's configuration)"
# The same cmake line as the Dockerfile's build stage (keep them in step:
# README's "Build" section shows it too), plus -Werror for our own code.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DKVSIDECAR_CUDA=OFF -DKVSIDECAR_BENCH=OFF -DKVSIDECAR_WERROR=ON >/dev/null
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

if [ -z "${KVS_SKIP_RELWITHDEBINFO:-}" ]; then
  # Compiled, not run (no GPU here): the CUDA backend (nvcc, when present)
  # in the configuration a developer builds by default. Only its library:
  # the rest of the tree is compiled by the other stages (a whole second
  # optimised build cost CI ~9 minutes).
  stage "RelWithDebInfo build of the CUDA backend"
  cmake -S . -B build-relwithdebinfo -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DKVSIDECAR_CUDA=AUTO -DKVSIDECAR_BENCH=OFF -DKVSIDECAR_WERROR=ON >/dev/null
  cmake --build build-relwithdebinfo -j"$jobs" --target kvs_gpu
fi

if [ -z "${KVS_SKIP_ASAN:-}" ]; then
  stage "AddressSanitizer + UBSan build"
  # The benchmarks are compiled here (cheap beside the libraries they share),
  # so they never rot; they are run by hand (BENCHMARKS.md).
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKVSIDECAR_SANITIZE=ON \
        -DKVSIDECAR_CUDA=OFF -DKVSIDECAR_BENCH=ON -DKVSIDECAR_WERROR=ON >/dev/null
  cmake --build build-asan -j"$jobs"
  stage "AddressSanitizer + UBSan tests"
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j1
fi

if [ -z "${KVS_SKIP_FUZZ:-}" ]; then
  stage "fuzz targets (libFuzzer)"
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
        -DKVSIDECAR_FUZZ=ON -DKVSIDECAR_CUDA=OFF -DKVSIDECAR_BENCH=OFF -DKVSIDECAR_WERROR=ON >/dev/null
  # Every harness in tests/fuzz/ (tests/CMakeLists.txt globs the same).
  fuzzers=()
  for src in tests/fuzz/fuzz_*.cpp; do fuzzers+=("$(basename "$src" .cpp)"); done
  cmake --build build-fuzz -j"$jobs" --target "${fuzzers[@]}"
  for f in "${fuzzers[@]}"; do
    # A fresh folder takes the new inputs, so the committed seeds
    # (tests/fuzz/seeds/, real engine inputs and past findings) are only
    # read and every run starts from the same corpus.
    scratch=build-fuzz/corpus/$f
    rm -rf "$scratch" && mkdir -p "$scratch" build-fuzz/findings
    if [ -n "${KVS_FUZZ_SECONDS:-}" ]; then
      echo "-- $f: ${KVS_FUZZ_SECONDS} s, random seed"
      budget=(-max_total_time="$KVS_FUZZ_SECONDS")
      same=()
    else
      echo "-- $f: ${KVS_FUZZ_RUNS:-50000} inputs, seed 1"
      # The same inputs every run: a fixed seed and count, no re-reading of
      # the corpus folder on a timer (-reload=0), and no address-space
      # randomisation (setarch -R): with it, ASan's addresses steer a few
      # branches and the runs part ways after a few thousand inputs.
      budget=(-seed=1 -runs="${KVS_FUZZ_RUNS:-50000}" -reload=0)
      same=()
      setarch "$(uname -m)" -R true 2>/dev/null && same=(setarch "$(uname -m)" -R)
    fi
    log=build-fuzz/$f.log
    if ! "${same[@]}" build-fuzz/tests/$f "${budget[@]}" -rss_limit_mb=2048 -print_final_stats=1 \
           -artifact_prefix=build-fuzz/findings/$f- "$scratch" "tests/fuzz/seeds/$f" >"$log" 2>&1; then
      # The whole report: the reason, the stack and the input's path (a
      # fixed finding's input goes into tests/fuzz/seeds/<target>/).
      echo "!! $f found a failure; its log ($log):"
      grep -v '^#[0-9]' "$log" | tail -n 80
      exit 1
    fi
    grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' "$log" || tail -n 3 "$log"
  done
fi
echo "all tests passed"
