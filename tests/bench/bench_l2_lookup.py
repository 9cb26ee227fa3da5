#!/usr/bin/env python3
"""LOOKUP + WAIT_PREFETCH_STATUS round trip of an 8-chunk prompt served from
L1, from the disk tier, and from Redis (BENCHMARKS.md, "L2 tiers").

One kvsidecar (host backend) with [l2.disk] and [l2.redis] (a redis-server
on a free port, started here). The prompt is stored once and written through.
  L1:    repeated lookups of the stored prompt (all 8 chunks in L1).
  L2:    CLEAR (drops the unlocked L1 chunks) before each timed lookup, so all
         8 chunks are read from the tier and copied into L1 before the status
         answers. "disk" runs with both tiers on (disk is asked first);
         "redis" runs a second sidecar with only Redis.
Each timed pair is a new request id, followed (untimed) by END_SESSION.

With --ab-format, every tier runs in both l2.format values ("kvsidecar":
its own header and XXH3 names; "lmcache": LMCache's names, BLAKE3 chunk
hash, raw bytes) in ROUNDS rounds, the order alternating each round, and
prints the median per tier and format (BENCHMARKS.md, "LMCache-format L2").

    bench_l2_lookup.py <kvsidecar binary> [reps] [layers] [--ab-format [rounds]]
"""

from __future__ import annotations

import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
sys.path.insert(0, str(HERE.parent / "tools"))

import shm_pool  # noqa: E402
from kvsidecar_harness import Sidecar, wait_until  # noqa: E402
from lmcache_client import MPClient, SeedFlow  # noqa: E402

CHUNK = 256
MODEL = "bench/l2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(binary: str, work: Path, tiers: dict, reps: int, layers: int) -> dict[str, float]:
    import os
    os.environ["KVSIDECAR_BIN"] = binary
    port = free_port()
    o = {"events.enabled": False, "cache.l1_size": "2GiB", "gpu.backend": "host",
         "sidecar.stats_interval": "0s", "cache.endpoint": f"tcp://127.0.0.1:{port}"}
    o.update(tiers)
    sc = Sidecar(work / f"sc{port}", o, name="kvsidecar").start()
    pools = shm_pool.sglang_mha_pools(layers, 8 * CHUNK // 16 * 2, 16, 8, 128, prefix="kvs_bl2")
    pools.fill(1)
    c = MPClient(f"tcp://127.0.0.1:{port}")
    try:
        f = SeedFlow(c, pools, MODEL, instance_id=1, engine="sglang", wrapper_kind="host_shm")
        f.register()
        toks = [(i * 7919) % 150000 for i in range(8 * CHUNK)]
        assert f.store_kv(toks, "store", list(range(8 * CHUNK // 16)))
        f.end_session("store")
        f.drain()
        chunk_mib = layers * 2 * 16 * 8 * 128 * 2 * 16 / 2**20

        def timed(clear: bool) -> float:
            out = []
            for i in range(reps):
                if clear:
                    c.clear(False)
                rid = f"r{clear}{i}{time.monotonic_ns()}"
                t0 = time.perf_counter()
                n = f.lookup_kv(toks, rid)
                dt = time.perf_counter() - t0
                assert n == 8 * CHUNK, f"hit {n}"
                f.end_session(rid)
                f.drain()
                out.append(dt)
            return statistics.median(out) * 1e3

        # Written through before we start timing L2 hits.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            c.clear(False)
            if f.lookup_kv(toks, "probe") == 8 * CHUNK:
                f.end_session("probe")
                f.drain()
                break
            f.end_session("probe")
            f.drain()
            time.sleep(0.05)
        l2 = timed(True)
        l1 = timed(False)
        return {"l1_ms": l1, "l2_ms": l2, "chunk_mib": chunk_mib}
    finally:
        c.close()
        sc.stop()
        pools.close()


def ab_format(binary: str, work: Path, rport: int, reps: int, layers: int, rounds: int) -> None:
    """Both formats, both tiers, alternating order per round."""
    got: dict[tuple[str, str], list[float]] = {}
    for rnd in range(rounds):
        order = ["kvsidecar", "lmcache"] if rnd % 2 == 0 else ["lmcache", "kvsidecar"]
        for fmt in order:
            for tier, o in (("disk", {"l2.disk.enabled": True, "l2.disk.size": "4GiB",
                                      "l2.disk.path": str(work / f"disk-{fmt}-{rnd}")}),
                            ("redis", {"l2.redis.enabled": True,
                                       "l2.redis.endpoints": [f"127.0.0.1:{rport}"]})):
                subprocess.run(["redis-cli", "-p", str(rport), "FLUSHALL"], capture_output=True)
                r = run(binary, work, {"l2.format": fmt, **o}, reps, layers)
                got.setdefault((tier, fmt), []).append(r["l2_ms"])
                got.setdefault(("L1", fmt), []).append(r["l1_ms"])
                chunk_mib = r["chunk_mib"]
    print(f"8 chunks of {chunk_mib:.1f} MiB, median of {reps} per run, {rounds} rounds "
          "(per-round medians listed):")
    print("| served from | l2.format = kvsidecar | l2.format = lmcache |")
    print("|---|---|---|")
    for tier in ("disk", "redis", "L1"):
        cells = []
        for fmt in ("kvsidecar", "lmcache"):
            xs = got[(tier, fmt)]
            cells.append(f"{statistics.median(xs):.2f} ms ({' / '.join(f'{x:.2f}' for x in xs)})")
        print(f"| {tier} | {cells[0]} | {cells[1]} |")


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    ab = "--ab-format" in sys.argv
    binary = args[0]
    reps = int(args[1]) if len(args) > 1 else 30
    layers = int(args[2]) if len(args) > 2 else 4
    rounds = int(args[3]) if len(args) > 3 else 3
    work = Path(tempfile.mkdtemp(prefix="kvs-l2-lookup."))
    rport = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no", "--dir", str(work)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: subprocess.run(["redis-cli", "-p", str(rport), "PING"],
                                          capture_output=True, text=True).stdout.strip() == "PONG",
                   10, "redis up")
        if ab:
            ab_format(binary, work, rport, reps, layers, rounds)
            return
        disk = run(binary, work, {"l2.disk.enabled": True, "l2.disk.path": str(work / "disk"),
                                  "l2.disk.size": "4GiB"}, reps, layers)
        rds = run(binary, work, {"l2.redis.enabled": True,
                                 "l2.redis.endpoints": [f"127.0.0.1:{rport}"]}, reps, layers)
        print(f"8 chunks of {disk['chunk_mib']:.1f} MiB, median of {reps}:")
        print(f"  all-L1 hit          {disk['l1_ms']:.2f} ms")
        print(f"  all-L2 hit (disk)   {disk['l2_ms']:.2f} ms")
        print(f"  all-L1 hit          {rds['l1_ms']:.2f} ms   (redis-only sidecar)")
        print(f"  all-L2 hit (redis)  {rds['l2_ms']:.2f} ms")
    finally:
        redis.kill()
        redis.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
