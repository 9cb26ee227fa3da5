#!/usr/bin/env python3
"""LOOKUP + WAIT_PREFETCH_STATUS of a hybrid-KV model's 8-chunk prompt served
from the disk tier, beside a one-group model's of the same chunk size, in the
same sidecar and the same rounds (BENCHMARKS.md, "L2 tiers", hybrid-KV).

LMCache 0.5.7's own client classes register both engine-driven instances
(inline transfer) and store the prompts:
  hybrid:    a full-attention group of [2, 8, 256, 512] bf16 chunks (4 MiB) and
             a 1-chunk sliding window of [2, 8, 128, 512] bf16 (2 MiB): a hit
             of 8 chunks needs group 0's 8 chunks and the window's last one
             (34 MiB), fetched in two phases (l2_prefetch_groups);
  one-group: 8 chunks of [2, 8, 256, 512] bf16 (32 MiB), one fetch.
Timed: CLEAR (drops the unlocked L1 chunks) and then LOOKUP + WAIT, so every
chunk is read from the disk and copied into L1; the two models alternate
within each round. Also the same lookups with the chunks in L1. Medians.

    bench_l2_hybrid_lookup.py <kvsidecar binary> [reps]
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
sys.path.insert(0, str(HERE.parent / "tools"))

import msgspec  # noqa: E402

from kvsidecar_harness import Sidecar  # noqa: E402
from lmcache_client import MPClient  # noqa: E402

CHUNK = 256
N = 8
FULL = (2, 8, CHUNK, 512)
WINDOW = (2, 8, CHUNK // 2, 512)
FULL_BYTES = 2 * 8 * CHUNK * 512 * 2
WINDOW_BYTES = FULL_BYTES // 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    binary = sys.argv[1]
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    os.environ["KVSIDECAR_BIN"] = binary
    import test_cache_lmcache_057 as t057  # LMCache 0.5.7's client, as the tests load it

    lmc = t057._load()
    ct = lmc.custom_types
    work = Path(tempfile.mkdtemp(prefix="kvs-l2-hybrid."))
    port = free_port()
    sc = Sidecar(work / "sc", {
        "events.enabled": False, "cache.l1_size": "1GiB", "gpu.backend": "host",
        "sidecar.stats_interval": "0s", "cache.endpoint": f"tcp://127.0.0.1:{port}",
        "cache.engine_driven_transfer": "inline", "l2.disk.enabled": True,
        "l2.disk.path": str(work / "disk"), "l2.disk.size": "2GiB"}, name="kvsidecar").start()
    import zmq
    ctx = zmq.Context()
    client = lmc.create_request_client(f"tcp://127.0.0.1:{port}", context=ctx)
    admin = MPClient(f"tcp://127.0.0.1:{port}")
    try:
        groups = [ct.GroupLayout(num_layers=8, hidden_dim_size=512, dtype_str="bfloat16",
                                 tokens_per_block=32, window_tokens=CHUNK, kv_size=2),
                  ct.GroupLayout(num_layers=8, hidden_dim_size=512, dtype_str="bfloat16",
                                 tokens_per_block=32, window_tokens=CHUNK // 2, kv_size=2,
                                 window_chunks=1)]
        models = {"hybrid": ("bench/hybrid", 1, groups), "one-group": ("bench/one-group", 2, [])}
        for model, instance, gl in models.values():
            client.register_kv_cache_engine_driven_context(ct.RegisterEngineDrivenContextPayload(
                instance_id=instance, model_name=model, world_size=1, block_size=32,
                num_layers=16 if gl else 8, hidden_dim_size=512, dtype_str="bfloat16",
                use_mla=False, num_physical_slots=CHUNK, group_layouts=gl)).result(timeout=10)
        toks = [(i * 7919) % 150000 for i in range(N * CHUNK)]
        data = os.urandom(FULL_BYTES)

        def key(model, rid, worker=0, readers=0):
            return lmc.IPCCacheServerKey.from_token_ids(
                model_name=model, world_size=1, worker_id=worker, token_ids=toks, start=0,
                end=N * CHUNK, request_id=rid, num_kv_readers=readers)

        hybrid_env = t057._grouped([(0, "bfloat16", FULL, [data] * N),
                                    (N - 1, "bfloat16", WINDOW, [data[:WINDOW_BYTES]])])
        plain_env = msgspec.msgpack.encode({"version": 1, "tensors": [
            {"dtype": "bfloat16", "shape": list(FULL), "data": data} for _ in range(N)]})
        for name, env in (("hybrid", hybrid_env), ("one-group", plain_env)):
            model, instance, _ = models[name]
            k = key(model, "store")
            client.prepare_store(k, instance).result(timeout=10)
            assert client.commit_store(k, instance, env).result(timeout=30) is True
            client.end_session("store").result(timeout=10)
        def lookup(name: str, rid: str, want: int | None = N) -> tuple[float, int]:
            model, _, _ = models[name]
            t0 = time.perf_counter()
            assert client.lookup(key(model, rid, worker=None, readers=1), 1).result(timeout=30) \
                is None
            n = client.wait_prefetch_status(rid, 30.0).result(timeout=30)
            dt = time.perf_counter() - t0
            assert want is None or n == want, f"{name}: hit {n} of {want}"
            client.end_session(rid).result(timeout=10)
            return dt, n

        # Written through before timing: both prompts hit from the disk alone.
        deadline = time.monotonic() + 60
        while True:
            admin.clear(False)
            if all(lookup(name, f"probe-{name}", None)[1] == N for name in models):
                break
            assert time.monotonic() < deadline, "not written through in 60 s"
            time.sleep(0.05)

        times: dict[str, list[float]] = {f"{n} {w}": [] for n in models for w in ("L2", "L1")}
        for i in range(reps):
            order = ("hybrid", "one-group") if i % 2 == 0 else ("one-group", "hybrid")
            for name in order:
                admin.clear(False)
                times[f"{name} L2"].append(lookup(name, f"{name}-l2-{i}")[0])
                times[f"{name} L1"].append(lookup(name, f"{name}-l1-{i}")[0])
        # The raw limit: the same objects read from the page cache with
        # plain open/readinto into one reused buffer (no header check, no L1).
        files = sorted((work / "disk").rglob("*.kvl2"))
        assert len(files) == 2 * N + 1, files
        buf = bytearray(FULL_BYTES + 4096)
        raw = []
        for _ in range(reps):
            t0 = time.perf_counter()
            total = 0
            for f in files:
                with open(f, "rb", buffering=0) as fh:
                    total += fh.readinto(buf)
            raw.append(total / (time.perf_counter() - t0) / 2**30)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"8-chunk prompts (hybrid: 8 x 4 MiB + 2 MiB window; one-group: 8 x 4 MiB), "
              f"median of {reps}, models alternating:")
        for k, v in med.items():
            print(f"  {k:14s} {v:8.2f} ms")
        mib = {"hybrid": (N * FULL_BYTES + WINDOW_BYTES) / 2**20,
               "one-group": N * FULL_BYTES / 2**20}
        for name in models:
            print(f"  {name} from disk: {mib[name] / (med[name + ' L2'] / 1e3) / 1024:.2f} GiB/s")
        raw_gibs = statistics.median(raw)
        print(f"  raw page-cache read of the {len(files)} objects: {raw_gibs:.2f} GiB/s")
        for name in models:
            gibs = mib[name] / (med[name + ' L2'] / 1e3) / 1024
            print(f"  {name} from disk / raw read: {gibs / raw_gibs:.2f}x")
        print(f"  hybrid / one-group, from disk: {med['hybrid L2'] / med['one-group L2']:.2f}x "
              f"(bytes {mib['hybrid'] / mib['one-group']:.3f}x)")
    finally:
        client.close()
        admin.close()
        ctx.destroy(linger=0)
        sc.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
