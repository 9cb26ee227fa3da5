#!/usr/bin/env python3
"""kvsidecar's Redis client (tests/bench_l2 redis) against redis-benchmark,
side by side on one redis-server started here on loopback (BENCHMARKS.md,
"L2 tiers").

Fair by construction: the same value size, pipeline depth (-P) and number
of connections (-c); the same key space (redis-benchmark -r K writes and
reads "key:%012d" with d < K, bench_l2 cycles through exactly those keys),
filled completely before any GET so neither side reads a missing key; SET
and GET measured separately, the two tools alternating (and alternating
which goes first) for --reps rounds; medians. Client CPU per request
(user + sys of the client process, from getrusage of the children) is
reported too: it moves less than req/s on a busy machine.

  python3 tests/bench/l2_redis_side_by_side.py [--bench build-bench/tests/bench_l2]
      [--also NAME=PATH ...] [--bytes 1048576] [--pipeline 8] [--conns 1]
      [--requests 2000] [--keys 256] [--reps 5]

--also runs another bench_l2 binary (e.g. one built before a change) in
the same rounds, for before/after figures.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_measured(cmd: list[str]) -> tuple[str, float]:
    """Output and CPU seconds (user + sys) of one child run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default="build-bench/tests/bench_l2")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--bytes", type=int, default=1 << 20)
    ap.add_argument("--pipeline", type=int, default=8)
    ap.add_argument("--conns", type=int, default=1)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--keys", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    for tool in ("redis-server", "redis-benchmark", "redis-cli"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found (Debian package redis-server / redis-tools)")
    clients = {"redis_client": a.bench}
    for spec in a.also:
        name, _, path = spec.partition("=")
        if not path:
            sys.exit(f"--also {spec!r}: expected NAME=PATH")
        clients[name] = path
    for name, path in clients.items():
        if not os.access(path, os.X_OK):
            sys.exit(f"{name}: {path} is not an executable (build it: cmake --build build "
                     "--target bench_l2)")

    port = free_port()
    tmp = tempfile.mkdtemp(prefix="kvs-redis-bench.")
    srv = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                            "--save", "", "--appendonly", "no", "--dir", tmp,
                            "--logfile", os.path.join(tmp, "redis.log")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while subprocess.run(["redis-cli", "-p", str(port), "PING"], capture_output=True,
                             text=True).stdout.strip() != "PONG":
            if time.monotonic() > deadline or srv.poll() is not None:
                sys.exit("redis-server did not start")
            time.sleep(0.05)
        return rounds(a, port, clients)
    finally:
        srv.kill()
        srv.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def rounds(a, port: int, clients: dict[str, str]) -> int:
    n = a.requests - a.requests % (a.pipeline * a.conns)
    common = [str(port), str(n), str(a.bytes), str(a.pipeline), str(a.keys)]
    # Fill the whole key space once, so every GET of either tool is a hit.
    fill = a.keys + (-a.keys) % (a.pipeline * a.conns)
    subprocess.run([a.bench, "redis", str(port), str(fill), str(a.bytes), str(a.pipeline),
                    str(a.keys), "set", str(a.conns)], check=True, capture_output=True)

    def rb(test: str) -> tuple[float, float]:
        out, cpu = run_measured(["redis-benchmark", "-p", str(port), "-c", str(a.conns),
                                 "-P", str(a.pipeline), "-n", str(n), "-d", str(a.bytes),
                                 "-r", str(a.keys), "-t", test, "-q"])
        m = re.findall(r"([\d.]+) requests per second", out.replace("\r", "\n"))
        if not m:
            sys.exit(f"redis-benchmark printed no rate: {out!r}")
        return float(m[-1]), cpu / n * 1e6

    def ours(path: str, mode: str) -> tuple[float, float]:
        out, cpu = run_measured([path, "redis", *common, mode, str(a.conns)])
        m = re.search(r"([\d.]+) req/s", out)
        if not m:
            sys.exit(f"{path} printed no rate: {out!r}")
        return float(m.group(1)), cpu / n * 1e6

    # (test, tool) -> list of (req/s, client cpu us/req)
    res: dict[tuple[str, str], list[tuple[float, float]]] = {}
    runs = [("SET", "redis-benchmark", lambda: rb("set"))]
    runs += [("SET", name, lambda p=p: ours(p, "set")) for name, p in clients.items()]
    runs += [("GET", "redis-benchmark", lambda: rb("get"))]
    runs += [("GET", name, lambda p=p: ours(p, "get")) for name, p in clients.items()]
    runs += [("GET", name + " get()", lambda p=p: ours(p, "get-fresh"))
             for name, p in clients.items()]
    print(f"# {n} requests of {a.bytes} B, pipeline {a.pipeline}, {a.conns} connection(s), "
          f"key space {a.keys}, {a.reps} rounds; load average before: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for r in range(a.reps):
        for test in ("SET", "GET"):
            batch = [x for x in runs if x[0] == test]
            if r % 2:
                batch.reverse()  # alternate who goes first
            for t, tool, fn in batch:
                res.setdefault((t, tool), []).append(fn())
        line = "  ".join(f"{t} {tool} {res[(t, tool)][-1][0]:.0f}" for t, tool, _ in runs)
        print(f"round {r + 1}: {line}", flush=True)
    print(f"# load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    stats = subprocess.run(["redis-cli", "-p", str(port), "INFO", "stats"], capture_output=True,
                           text=True).stdout
    misses = int(re.search(r"keyspace_misses:(\d+)", stats).group(1))
    print(f"# server: keyspace_misses={misses} (every GET of both tools must be a hit)")
    if misses:
        sys.exit("some GETs missed: the comparison is not fair")
    print("| test | tool | req/s (median) | all rounds | vs redis-benchmark | "
          "client CPU us/req (median) |")
    print("|---|---|---|---|---|---|")
    for t, tool, _ in runs:
        rates = [x[0] for x in res[(t, tool)]]
        cpus = [x[1] for x in res[(t, tool)]]
        ref = statistics.median(x[0] for x in res[(t, "redis-benchmark")])
        med = statistics.median(rates)
        ratio = "—" if tool == "redis-benchmark" else f"{med / ref:.2f}×"
        print(f"| {t} | {tool} | {med:.0f} | {' '.join(f'{x:.0f}' for x in rates)} | {ratio} | "
              f"{statistics.median(cpus):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
