#!/usr/bin/env python3
"""What a client scraping /metrics in a loop costs the actors.

    KVSIDECAR_BIN=build-bench/kvsidecar tests/bench/bench_scrape_cost.py [--seconds 5]

Starts a relay sidecar (2 DP ranks, no traffic), scrapes /metrics back to
back from one client for SECONDS, and prints the scrapes per second and the
CPU each thread of the sidecar spent per scrape (from /proc/<pid>/task/*/stat,
10 ms ticks: figures under one tick per run do not show). The actor threads
(ingest, index, pub, replay_bridge, caf.*) answer each collection; `http`
and `http-scrape` are the HTTP server's own.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import socket
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "integration"))
import zmq  # noqa: E402
from kvsidecar_harness import EventsRig  # noqa: E402


def thread_ticks(pid: int) -> dict[tuple[str, str], int]:
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            name = open(f"/proc/{pid}/task/{t}/comm").read().strip()
            f = open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()
            out[(t, name)] = int(f[11]) + int(f[12])  # utime + stime
        except OSError:
            pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    ctx = zmq.Context()
    with tempfile.TemporaryDirectory() as tmp:
        r = EventsRig(ctx, pathlib.Path(tmp), dp_size=2)
        r.start()
        try:
            pid, port = r.sidecar.proc.pid, r.sidecar.http_port
            before, t0, n = thread_ticks(pid), time.time(), 0
            while time.time() - t0 < args.seconds:
                with socket.create_connection(("127.0.0.1", port)) as s:
                    s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                    while s.recv(65536):
                        pass
                n += 1
            after = thread_ticks(pid)
        finally:
            r.close()
    per: dict[str, int] = {}
    for k, v in after.items():
        if v - before.get(k, 0):
            per[k[1]] = per.get(k[1], 0) + v - before.get(k, 0)
    tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
    actors = sum(v for k, v in per.items() if not k.startswith("http"))
    print(f"{n} scrapes in {args.seconds:.0f} s ({n / args.seconds:.0f}/s)")
    for name, v in sorted(per.items(), key=lambda x: -x[1]):
        print(f"  {name:16} {v * tick_us / n:8.0f} us per scrape")
    print(f"actor threads: {actors * tick_us / 1e3:.0f} ms of CPU in {args.seconds:.0f} s "
          f"({actors * tick_us / 1e4 / args.seconds:.1f}% of a core)")


if __name__ == "__main__":
    main()
