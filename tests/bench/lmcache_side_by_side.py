#!/usr/bin/env python3
"""kvsidecar and LMCache 0.5.6's own MP server, side by side, driven by
LMCache 0.5.6's own client classes (run by run_lmcache_side_by_side.sh, in a
virtual environment where lmcache==0.5.6 and its torch are installed).

Both servers get the very same requests from the same code: the client made by
`create_request_client` (as the 0.5.6 adapters make it), `cpu_shm` KV pools
(0.5.6's CpuShmTensorWrapper, POSIX shared memory from tests/tools/shm_pool.py).
Every repetition runs one block per server, the order alternating (A B, B A,
...); medians over the repetitions.

  rtt       LOOKUP + WAIT_PREFETCH_STATUS of an 8-chunk prompt stored first
            (every lookup hits), one pair at a time, a new request id each,
            END_SESSION outside the timed span: p50 / p99.
  copy      STORE then (LOOKUP and) RETRIEVE of 8 chunks of 256 tokens, fresh
            tokens each time, for the vLLM flash-attn layout and the SGLang
            MHA layout: GB/s = bytes / request round trip. LMCache 0.5.6
            cannot register SGLang MHA pools on its CPU platform: its
            registration gets no reply, reported as such (not worked around).
  sessions  1,000 request ids: all LOOKUPs, all WAITs, all END_SESSIONs.
  cpu       server CPU (user+sys from /proc) per lookup+wait pair.
  memory    server RSS at idle (before the first request) and its peak (VmHWM).
  idle      server CPU while nothing is asked, over 5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tools"))

import shm_pool  # noqa: E402
from lmcache.utils import EngineType  # noqa: E402
from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey as Key  # noqa: E402
from lmcache.v1.multiprocess.transport.zmq_impl import create_request_client  # noqa: E402
from lmcache.v1.platform.base.ipc_wire import CpuShmIPCData, TensorMetadata  # noqa: E402
from lmcache.v1.platform.devices.cpu.shm import CpuShmTensorWrapper  # noqa: E402

CHUNK = 256
PAGE = 16
EVENT = bytes(64)
T = 60.0


def tokens(n_chunks: int, salt: int) -> tuple[int, ...]:
    return tuple((salt * 1_000_003 + i * 7919) % 150_000 for i in range(n_chunks * CHUNK))


def proc_cpu_s(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def proc_mem_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def wrappers(pools) -> list:
    return [CpuShmTensorWrapper.from_wire(CpuShmIPCData(
        version=1, metadata=TensorMetadata(**d["metadata"]), shm_name=d["shm_name"],
        nbytes=d["nbytes"])) for d in pools.descriptors()]


class Server:
    def __init__(self, name: str, endpoint: str, pid: int, layers: int, heads: int, dim: int):
        self.name, self.pid = name, pid
        self.c = create_request_client(endpoint)
        assert self.c.noop().result(timeout=T) == "OK", f"{name} does not answer"
        self.idle_rss_kib = proc_mem_kib(pid, "VmRSS")
        self.pools, self.instances = {}, {}
        # 8 chunks stored from pages 0.., retrieved into pages 8 chunks further.
        pages = 2 * 8 * CHUNK // PAGE
        for i, layout in enumerate(("vllm", "sglang")):
            make = shm_pool.vllm_flash_attn_pools if layout == "vllm" else shm_pool.sglang_mha_pools
            p = make(layers, pages, PAGE, heads, dim, prefix=f"kvs_sbs_{name}")
            p.fill(i + 1)
            hints = p.layout_hints() if layout == "vllm" else {"tokens_per_block": PAGE}
            inst = 9000 + i
            fut = self.c.register_kv_cache(inst, wrappers(p), "bench/model", 1,
                                           EngineType.VLLM if layout == "vllm" else EngineType.SGLANG,
                                           hints, [])
            try:
                fut.result(timeout=30.0)
                self.instances[layout] = inst
            except Exception as e:  # noqa: BLE001 - reported in the table
                self.instances[layout] = f"registration failed: {type(e).__name__} {e}"[:120]
            self.pools[layout] = p
            self.c.ping(inst).result(timeout=T)

    def key(self, toks, rid, worker=0, n=8):
        return Key(model_name="bench/model", world_size=1, worker_id=worker, token_ids=toks,
                   start=0, end=n * CHUNK, request_id=rid, num_kv_readers=1)

    def store(self, layout, toks, rid):
        blocks = list(range(0, 8 * CHUNK // PAGE))
        _, ok = self.c.store(self.key(toks, rid), self.instances[layout], [blocks],
                             EVENT).result(timeout=T)
        return ok

    def lookup_wait(self, toks, rid):
        self.c.lookup(self.key(toks, rid, worker=None), 1).result(timeout=T)
        return self.c.wait_prefetch_status(rid, 30.0).result(timeout=T)

    def lookup_until(self, toks, rid, want=8, timeout=30.0):
        """A STORE's chunks become visible when its copy completes (on both
        servers the reply may come first): look up until all are there."""
        deadline = time.monotonic() + timeout
        for attempt in range(1_000_000):
            r = f"{rid}-{attempt}"
            if self.lookup_wait(toks, r) == want:
                return r
            self.c.end_session(r).result(timeout=T)
            assert time.monotonic() < deadline, f"{self.name}: stored chunks not visible"
            time.sleep(0.01)

    def retrieve(self, layout, toks, rid):
        blocks = list(range(8 * CHUNK // PAGE, 16 * CHUNK // PAGE))
        _, ok = self.c.retrieve(self.key(toks, rid), self.instances[layout], [blocks], EVENT,
                                0).result(timeout=T)
        return ok

    def close(self):
        for p in self.pools.values():
            p.close()
        self.c.close()


def block_rtt(s: Server, iters: int, rep: int) -> dict:
    toks = tokens(8, salt=1)
    s.store("vllm", toks, "rtt-store")
    s.c.end_session("rtt-store").result(timeout=T)
    s.c.end_session(s.lookup_until(toks, f"rtt-visible-{rep}")).result(timeout=T)
    lat, cpu0 = [], proc_cpu_s(s.pid)
    for i in range(iters):
        rid = f"rtt-{rep}-{i}"
        t0 = time.perf_counter()
        hit = s.lookup_wait(toks, rid)
        lat.append(time.perf_counter() - t0)
        assert hit == 8, f"{s.name}: lookup hit {hit} of 8"
        s.c.end_session(rid).result(timeout=T)
    cpu = proc_cpu_s(s.pid) - cpu0
    lat.sort()
    return {"p50_us": lat[len(lat) // 2] * 1e6, "p99_us": lat[int(len(lat) * 0.99)] * 1e6,
            "cpu_us_per_pair": cpu / iters * 1e6}  # includes the END_SESSIONs


def block_copy(s: Server, layout: str, rep: int) -> dict:
    if not isinstance(s.instances[layout], int):
        return {"error": s.instances[layout]}
    nbytes = s.pools[layout].chunk_bytes(CHUNK) * 8
    toks = tokens(8, salt=1000 + rep)
    rid = f"copy-{layout}-{rep}"
    t0 = time.perf_counter()
    ok = s.store(layout, toks, rid)
    t_store = time.perf_counter() - t0
    reader = s.lookup_until(toks, rid + "-r")  # locks the 8 chunks for the retrieve
    t0 = time.perf_counter()
    ok2 = s.retrieve(layout, toks, reader)
    t_retrieve = time.perf_counter() - t0
    for r in (rid, reader):
        s.c.end_session(r).result(timeout=T)
    return {"store_GBps": nbytes / t_store / 1e9 if ok else None,
            "retrieve_GBps": nbytes / t_retrieve / 1e9 if ok2 else None}


def block_sessions(s: Server, n: int, rep: int) -> dict:
    toks = tokens(8, salt=1)
    t0 = time.perf_counter()
    futs = [s.c.lookup(s.key(toks, f"s-{rep}-{i}", worker=None), 1) for i in range(n)]
    for f in futs:
        f.result(timeout=T)
    waits = [s.c.wait_prefetch_status(f"s-{rep}-{i}", 30.0) for i in range(n)]
    hits = [f.result(timeout=T) for f in waits]
    ends = [s.c.end_session(f"s-{rep}-{i}") for i in range(n)]
    for f in ends:
        f.result(timeout=T)
    dt = time.perf_counter() - t0
    assert all(h == 8 for h in hits), f"{s.name}: {sum(h != 8 for h in hits)} sessions missed"
    return {"sessions_per_s": n / dt}


def idle_cpu(s: Server, seconds: float = 5.0) -> float:
    c0 = proc_cpu_s(s.pid)
    time.sleep(seconds)
    return (proc_cpu_s(s.pid) - c0) / seconds * 100


def med(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    return statistics.median(xs) if xs else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="kvsidecar endpoint")
    ap.add_argument("--a-pid", type=int, required=True)
    ap.add_argument("--b", required=True, help="LMCache endpoint")
    ap.add_argument("--b-pid", type=int, required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rtt-iters", type=int, default=1000)
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    servers = [Server("kvsidecar", a.a, a.a_pid, a.layers, a.heads, a.head_dim),
               Server("lmcache", a.b, a.b_pid, a.layers, a.heads, a.head_dim)]
    res = {s.name: {"rtt": [], "vllm": [], "sglang": [], "sessions": []} for s in servers}
    for s in servers:
        res[s.name]["idle_rss_MiB"] = s.idle_rss_kib / 1024
        res[s.name]["idle_cpu_pct"] = idle_cpu(s)
        res[s.name]["registration"] = s.instances
    for rep in range(a.reps):
        order = servers if rep % 2 == 0 else servers[::-1]
        for s in order:
            time.sleep(0.05)
            res[s.name]["rtt"].append(block_rtt(s, a.rtt_iters, rep))
            for layout in ("vllm", "sglang"):
                res[s.name][layout].append(block_copy(s, layout, rep))
            res[s.name]["sessions"].append(block_sessions(s, a.sessions, rep))
    for s in servers:
        res[s.name]["peak_rss_MiB"] = proc_mem_kib(s.pid, "VmHWM") / 1024
        s.close()
    Path(a.out).write_text(json.dumps(res, indent=1))

    rows = [("lookup+wait p50 (µs)", lambda r: med(x["p50_us"] for x in r["rtt"]), False),
            ("lookup+wait p99 (µs)", lambda r: med(x["p99_us"] for x in r["rtt"]), False),
            ("server CPU per lookup+wait+end (µs)",
             lambda r: med(x["cpu_us_per_pair"] for x in r["rtt"]), False)]
    for layout in ("vllm", "sglang"):
        for op in ("store", "retrieve"):
            rows.append((f"{op} {layout} (GB/s)",
                         lambda r, l=layout, o=op: med(x.get(f"{o}_GBps") for x in r[l]), True))
    rows += [("1,000 sessions (sessions/s)", lambda r: med(x["sessions_per_s"] for x in r["sessions"]), True),
             ("RSS idle (MiB)", lambda r: r["idle_rss_MiB"], False),
             ("RSS peak (MiB)", lambda r: r["peak_rss_MiB"], False),
             ("idle CPU (%)", lambda r: r["idle_cpu_pct"], False)]
    k, l = res["kvsidecar"], res["lmcache"]
    print(f"| what | kvsidecar | LMCache 0.5.6 | kvsidecar better by |")
    print("|---|---|---|---|")
    for name, f, higher_better in rows:
        x, y = f(k), f(l)
        fx = "n/a" if x is None else f"{x:,.1f}"
        fy = "n/a" if y is None else f"{y:,.1f}"
        ratio = "" if not x or not y else f"{(x / y if higher_better else y / x):.2f}×"
        print(f"| {name} | {fx} | {fy} | {ratio} |")
    for s in ("kvsidecar", "lmcache"):
        for layout, v in res[s]["registration"].items():
            if not isinstance(v, int):
                print(f"{s}: {layout} pools: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
