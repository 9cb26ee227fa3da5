#!/usr/bin/env bash
# Issue #35's reproduction, A/B: each binary on its default config (its own
# ports), a 6 s flood of short-lived hostile DEALERs on the replay port
# (tests/integration/hostile_peers.py: ~thousands of peers, valid start seqs
# and garbage, two 64 MiB+1 frames, never reading), then: RSS before / peak /
# after, whether a well-behaved replay client gets its end marker within 5 s,
# the replay bridge's last stats line, and how long SIGTERM takes.
#
#   tests/bench/hostile_replay_ab.sh OLD/kvsidecar build/kvsidecar
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
[ -n "${KEEP:-}" ] && trap - EXIT && echo "logs in $WORK"
rss() { awk '/VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

for BIN in "$@"; do
  base=$((20000 + RANDOM % 20000))
  "$BIN" --set "events.ingest_endpoint=\"tcp://127.0.0.1:$base\"" \
    --set "events.endpoint=\"tcp://*:$((base + 1))\"" \
    --set "events.replay_endpoint=\"tcp://*:$((base + 2))\"" \
    --set "cache.endpoint=\"tcp://127.0.0.1:$((base + 3))\"" \
    --set "http.listen=\"127.0.0.1:$((base + 4))\"" --set 'cache.l1_size="64MiB"' \
    --set 'sidecar.stats_interval="1s"' 2>"$WORK/log" &
  pid=$!
  for _ in $(seq 50); do grep -q "kvsidecar ready" "$WORK/log" && break; sleep 0.1; done
  if ! grep -q "kvsidecar ready" "$WORK/log"; then
    echo "== $BIN did not start:"; tail -3 "$WORK/log"; kill -9 $pid 2>/dev/null || true; continue
  fi
  before=$(rss $pid)
  python3 "$ROOT/tests/integration/hostile_peers.py" dealer "tcp://127.0.0.1:$((base + 2))" \
    --seconds 6 --open 20 --valid '[["", "0000000000000000"], ["", "ffffffffffffffff"], ["", "00000000075bcd15"]]' \
    --seed 1 >"$WORK/flood" &
  fp=$!
  peak=$before
  while kill -0 $fp 2>/dev/null; do r=$(rss $pid); ((r > peak)) && peak=$r; sleep 0.05; done
  good=$(python3 - "$((base + 2))" <<'PY'
import struct, sys, time, zmq
d = zmq.Context().socket(zmq.DEALER)
d.connect(f"tcp://127.0.0.1:{sys.argv[1]}")
t0 = time.time()
d.send_multipart([b"", struct.pack(">Q", 0)])
while d.poll(5000):
    f = d.recv_multipart()
    if f[2] == b"\xff" * 8:
        print(f"end marker in {(time.time() - t0) * 1000:.1f} ms")
        break
else:
    print("no end marker within 5 s")
PY
)
  sleep 1.5
  after=$(rss $pid)
  t0=$(date +%s.%N)
  kill -TERM $pid 2>/dev/null || true
  for _ in $(seq 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  if kill -0 $pid 2>/dev/null; then took="not within 10 s"; kill -9 $pid; else
    took="$(echo "$(date +%s.%N) - $t0" | bc | cut -c1-4) s"; fi
  wait $pid 2>/dev/null || true
  echo "== $BIN"
  echo "flood: $(cat "$WORK/flood")"
  echo "RSS KiB: before $before, peak $peak, after $after"
  echo "good client: $good; SIGTERM: $took"
  grep "replay_bridge.*stats" "$WORK/log" | tail -1 | sed 's/.*stats: /replay_bridge: /'
done
