#!/usr/bin/env python3
"""How fast the probes answer, idle and while clients hold the HTTP port.

    tests/bench/bench_http_probes.py --bin build-bench/kvsidecar [--bin-b OTHER]
        [--requests 2000] [--held 500] [--rounds 3]

For each binary (A, and B when given: e.g. an older build), alternating, in
every round: a sidecar with the relay and the cache off, then
  idle     REQUESTS sequential GET /healthz, each on a new connection (what
           the kubelet does): p50 / p99 of the round trip, and failures
  held     the same while HELD clients each keep half a request open
           (slowloris) and HELD/5 more sent a whole /metrics request and never
           read the answer
  scrape   GET /metrics round trips (50)
Side by side, the raw limit: the same client against a Python socket server
that answers a fixed 200 without parsing anything (one accept, one recv, one
send per request), in the same run.

Prints one line per (binary, case, round) and the medians over rounds, and
BENCH_HTTP {json}. A request that gets no answer within 2 s counts as failed;
a case stops after 10 failures.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
from kvsidecar_harness import Sidecar, free_port_range  # noqa: E402

REQ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def roundtrip(port: int, req: bytes = REQ, timeout: float = 2.0) -> float | None:
    """Seconds for connect, request, whole answer, close; None on failure."""
    t0 = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(req)
            got = b""
            while True:
                b = s.recv(65536)
                if not b:
                    break
                got += b
    except OSError:
        return None
    if not got.startswith(b"HTTP/1.1 200"):
        return None
    return time.perf_counter() - t0


def measure(port: int, n: int, req: bytes = REQ, max_failed: int = 10) -> dict:
    """n round trips, or fewer: after max_failed failures (each waited 2 s)
    the case stops; `n` is then how many were tried."""
    times, failed, tried = [], 0, 0
    while tried < n and failed < max_failed:
        tried += 1
        t = roundtrip(port, req)
        if t is None:
            failed += 1
        else:
            times.append(t)
    n = tried
    times.sort()
    pick = (lambda q: times[min(len(times) - 1, int(q * len(times)))] * 1e6) if times else \
        (lambda q: float("nan"))
    return {"n": n, "failed": failed, "p50_us": pick(0.5), "p99_us": pick(0.99)}


def hold(port: int, held: int) -> list[socket.socket]:
    """Opens the held clients; stops at the third connect that fails (a
    server whose accept queue is full: each would wait 2 s)."""
    out, failed = [], 0
    for i in range(held + held // 5):
        if failed >= 3:
            break
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" if i >= held
                      else b"GET /healthz HTTP/1.1\r\nHost: x")
            out.append(s)
        except OSError:
            failed += 1  # a server that stopped accepting: measured by the probes
    return out


class RawServer:
    """The floor: accept, one recv, a fixed answer, close."""

    ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4096)
        self.port = self.sock.getsockname()[1]
        self.stop = False
        self.t = threading.Thread(target=self.serve, daemon=True)
        self.t.start()

    def serve(self) -> None:
        while not self.stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with c:
                c.recv(4096)
                c.sendall(self.ANSWER)

    def close(self) -> None:
        self.stop = True
        self.sock.close()


def run_binary(binary: str, args, workdir: Path) -> dict:
    os.environ["KVSIDECAR_BIN"] = binary
    port = free_port_range(1)
    sc = Sidecar(workdir, {"events.enabled": False, "cache.enabled": False,
                           "http.listen": f"127.0.0.1:{port}"})
    sc.start()
    try:
        res = {"idle": measure(port, args.requests)}
        held = hold(port, args.held)
        try:
            res["held"] = measure(port, args.requests)
            res["held"]["held"] = len(held)
        finally:
            for s in held:
                s.close()
        res["scrape"] = measure(port, 50, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        return res
    finally:
        sc.stop(expect=None)
        sc.kill()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--bin-b")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--held", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    bins = {"A": args.bin} | ({"B": args.bin_b} if args.bin_b else {})
    rows: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            raw = RawServer()
            try:
                rows.setdefault(("raw", "idle"), []).append(measure(raw.port, args.requests))
            finally:
                raw.close()
            for name, b in bins.items():
                res = run_binary(b, args, Path(tmp) / f"{name}{r}")
                for case, m in res.items():
                    rows.setdefault((name, case), []).append(m)
                    print(f"round {r + 1} {name:3} {case:6} p50 {m['p50_us']:9.1f} us  "
                          f"p99 {m['p99_us']:9.1f} us  failed {m['failed']}/{m['n']}"
                          + (f"  ({m['held']} clients held)" if "held" in m else ""), flush=True)
    summary = {}
    print("\nmedians over rounds:")
    for (name, case), ms in rows.items():
        med = {k: statistics.median(m[k] for m in ms) for k in ("p50_us", "p99_us", "failed")}
        summary[f"{name}.{case}"] = med
        print(f"  {name:3} {case:6} p50 {med['p50_us']:9.1f} us  p99 {med['p99_us']:9.1f} us  "
              f"failed {med['failed']:.0f}")
    print("BENCH_HTTP " + json.dumps(summary))


if __name__ == "__main__":
    main()
