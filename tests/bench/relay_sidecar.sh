# Sourced by the relay's bench scripts (relay_ab.sh, relay_cpu_split.sh,
# relay_syscalls.sh): free loopback ports, and a relay-only sidecar started
# the way run_relay_bench.sh starts it, waited for until it is ready.

# free_ports N: N free TCP ports on 127.0.0.1, space-separated.
free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
s = [socket.socket() for _ in range(int(sys.argv[1]))]
[x.bind(("127.0.0.1", 0)) for x in s]
print(*[x.getsockname()[1] for x in s])
PY
}

# start_relay_sidecar BINARY LOG INGEST_PORT PUB_PORT REPLAY_PORT [ARGS...]:
# starts it in the background (its log, at info, in LOG; ARGS are more
# kvsidecar arguments, e.g. --set ...), sets SIDECAR_PID and returns once its
# ready line is there (fails with the log after 5 s).
start_relay_sidecar() {
  local bin=$1 log=$2 p_in=$3 p_pub=$4 p_rep=$5
  shift 5
  "$bin" --set cache.enabled=false --set http.enabled=false \
    --set 'sidecar.stats_interval="0s"' --set 'events.format="vllm"' \
    --set "events.ingest_endpoint=\"tcp://127.0.0.1:$p_in\"" --set "events.endpoint=\"tcp://*:$p_pub\"" \
    --set "events.replay_endpoint=\"tcp://127.0.0.1:$p_rep\"" "$@" 2>"$log" &
  SIDECAR_PID=$!
  local _
  for _ in $(seq 100); do
    grep -q "kvsidecar ready" "$log" && return 0
    sleep 0.05
  done
  cat "$log" >&2
  return 1
}
