#!/usr/bin/env bash
# L2 tier benchmarks side by side in one run (BENCHMARKS.md, "L2 tiers"):
# disk_tier vs plain file writes/reads, redis_client vs redis-benchmark with
# the same value size, pipelining and one connection, on a redis-server
# started here on loopback.
#   tests/bench/run_l2_bench.sh [build dir] [value bytes] [pipeline]
set -euo pipefail
BUILD=${1:-build}
BYTES=${2:-1048576}
PIPE=${3:-8}
N=${N:-2000}
DIR=$(mktemp -d /tmp/kvs-l2-bench.XXXXXX)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$DIR" \
  --logfile "$DIR/redis.log" --daemonize no &
RPID=$!
trap 'kill $RPID 2>/dev/null; wait $RPID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" PING >/dev/null 2>&1 && break; sleep 0.05; done

echo "== disk: 64 objects of 4 MiB in $DIR"
"$BUILD/tests/bench_l2" disk "$DIR/disk" 64 4
echo "== redis: $N requests of $BYTES bytes, pipeline $PIPE, 1 connection"
redis-benchmark -p "$PORT" -c 1 -P "$PIPE" -n "$N" -d "$BYTES" -t set,get -q 2>/dev/null \
  | tr '\r' '\n' | grep -E 'requests per second' | sed 's/^/redis-benchmark /'
redis-cli -p "$PORT" FLUSHALL >/dev/null
"$BUILD/tests/bench_l2" redis "$PORT" "$N" "$BYTES" "$PIPE"
