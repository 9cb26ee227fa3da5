#!/usr/bin/env bash
# L2 tier benchmarks side by side in one run (BENCHMARKS.md, "L2 tiers"):
# disk_tier vs plain file writes/reads, then redis_client vs redis-benchmark
# (tests/bench/l2_redis_side_by_side.py: same value size, pipeline depth,
# connections and key space, on one redis-server started on loopback,
# alternating rounds, medians).
#   tests/bench/run_l2_bench.sh [build dir] [value bytes] [pipeline]
# Environment: N (requests per round, 2000), REPS (rounds, 5), KEYS (key
# space, 256), CONNS (connections, 1), ALSO ("name=path/to/bench_l2": another
# client build in the same rounds, e.g. the one before a change).
set -euo pipefail
BUILD=${1:-build}
BYTES=${2:-1048576}
PIPE=${3:-8}
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=$(mktemp -d /tmp/kvs-l2-bench.XXXXXX)
trap 'rm -rf "$DIR"' EXIT

echo "== disk: 64 objects of 4 MiB in $DIR"
"$BUILD/tests/bench_l2" disk "$DIR/disk" 64 4
echo "== redis"
python3 "$HERE/l2_redis_side_by_side.py" --bench "$BUILD/tests/bench_l2" \
  --bytes "$BYTES" --pipeline "$PIPE" --requests "${N:-2000}" --reps "${REPS:-5}" \
  --keys "${KEYS:-256}" --conns "${CONNS:-1}" ${ALSO:+--also "$ALSO"}
