#!/usr/bin/env bash
# What /metrics costs: the relay and cache benchmarks with the HTTP side off
# and with /metrics on and scraped every second, alternating, in one run.
#
#   tests/bench/run_metrics_overhead.sh       # ~6 minutes on 2 cores
#
# ROUNDS [2] rounds of: relay off, relay scrape, cache off, cache scrape
# (shortened runs: relay at 16 events/batch, cache copy and round trip).
# Prints the medians per mode and scrape/off; the target is a loss of at
# most 3% (relay events/s, store and retrieve GB/s; round trip p50 at most
# 3% longer). Uses the binaries of run_relay_bench.sh / run_cache_bench.sh
# (BUILD_DIR build-bench / build-cbench; NO_BUILD=1 after the first round).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ROUNDS="${ROUNDS:-2}"
export BUILD_DIR="${BUILD_DIR:-$ROOT/build-bench}"
PY="${PYTHON:-python3}"
OUT="${KEEP:-$(mktemp -d "${TMPDIR:-/tmp}/metrics_overhead.XXXXXX")}"
mkdir -p "$OUT"
[[ -n "${KEEP:-}" ]] || trap 'rm -rf "$OUT"' EXIT

# A run that fails (a busy machine can miss a start-up deadline) is reported
# and left out; the summary says how many samples each figure has.
run_one() {  # name, then the command
  local name=$1; shift
  if ! "$@" >"$OUT/$name.log" 2>&1; then
    echo "warning: $name failed; its log ends:" >&2
    tail -5 "$OUT/$name.log" >&2
  fi
}

build=0
for r in $(seq 1 "$ROUNDS"); do
  for mode in off scrape; do
    echo "round $r: relay, metrics $mode" >&2
    run_one "relay_${mode}_$r" env -u KEEP NO_BUILD=$build METRICS=$mode SIZES=16 REPEATS=3 MINI=0 \
      LAT_REPEATS=1 LAT_SECONDS=2 "$ROOT/tests/bench/run_relay_bench.sh"
    { grep '^BENCH_RELAY ' "$OUT/relay_${mode}_$r.log" || true; } \
      | sed "s/^BENCH_RELAY /$mode /" >>"$OUT/relay.txt"
    echo "round $r: cache, metrics $mode" >&2
    mkdir -p "$OUT/cache_${mode}_$r"
    run_one "cache_${mode}_$r" env NO_BUILD=$build METRICS=$mode REPS=3 RTT_ITERS=1000 \
      SESSIONS=200 LAYOUTS=sglang KEEP="$OUT/cache_${mode}_$r" "$ROOT/tests/bench/run_cache_bench.sh"
    build=1
  done
done

"$PY" - "$OUT" "$ROUNDS" <<'PYEOF'
import json, statistics, sys
from pathlib import Path
out, rounds = Path(sys.argv[1]), int(sys.argv[2])
vals = {m: {"relay_ev_s": [], "store_gbps": [], "retrieve_gbps": [], "rtt_p50_us": []}
        for m in ("off", "scrape")}
for line in (out / "relay.txt").read_text().splitlines():
    mode, js = line.split(" ", 1)
    vals[mode]["relay_ev_s"].append(json.loads(js)["throughput"]["16"]["relay_events_per_s"])
for mode in ("off", "scrape"):
    for r in range(1, rounds + 1):
        f = out / f"cache_{mode}_{r}" / "server.json"
        if not f.exists():
            continue
        d = json.loads(f.read_text())
        med = d["copy"]["layouts"]["sglang"]["median"]
        vals[mode]["store_gbps"].append(med["store"])
        vals[mode]["retrieve_gbps"].append(med["retrieve"])
        vals[mode]["rtt_p50_us"].append(d["rtt"]["median"]["server"]["p50"])
print(f"{'figure':<16} | {'metrics off':>12} | {'scrape 1/s':>12} | scrape/off")
res = {}
for k in ("relay_ev_s", "store_gbps", "retrieve_gbps", "rtt_p50_us"):
    a, b = statistics.median(vals["off"][k]), statistics.median(vals["scrape"][k])
    res[k] = {"off": a, "scrape": b, "ratio": b / a}
    print(f"{k:<16} | {a:>12.4g} | {b:>12.4g} | {b / a:.3f}   "
          f"(samples {len(vals['off'][k])} / {len(vals['scrape'][k])})")
ok = all(res[k]["ratio"] >= 0.97 for k in ("relay_ev_s", "store_gbps", "retrieve_gbps")) \
    and res["rtt_p50_us"]["ratio"] <= 1.03
print("target (<= 3% lost):", "met" if ok else "NOT met")
print("BENCH_METRICS " + json.dumps(res, sort_keys=True))
PYEOF
