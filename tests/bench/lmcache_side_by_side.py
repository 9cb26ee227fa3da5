#!/usr/bin/env python3
"""kvsidecar and LMCache 0.5.6's own MP server, side by side, driven by
LMCache 0.5.6's own client classes (run by run_lmcache_side_by_side.sh, in a
virtual environment where lmcache==0.5.6 and its torch are installed).

Both servers get the very same requests from the same code: the client made by
`create_request_client` (as the 0.5.6 adapters make it), `cpu_shm` KV pools
(0.5.6's CpuShmTensorWrapper, POSIX shared memory from tests/tools/shm_pool.py)
registered with the layout hints LMCache's own adapters send, one PING per
instance every 10 s from a heartbeat thread (as the vLLM adapter's
HeartbeatThread). Every repetition runs one block per server, the order
alternating (A B, B A, ...); medians over the repetitions.

Model shapes: `L` layers of 8 KV heads × head_dim 128, bf16, page size 16,
256-token chunks: a chunk is L MiB (L=32: Llama-3-8B, 32 MiB). Each
(layout, L) is its own instance and model name.

  rtt       LOOKUP + WAIT_PREFETCH_STATUS of an N-chunk prompt stored first
            (every lookup hits and locks N chunks), one pair at a time, a new
            request id each, END_SESSION outside the timed span: p50 / p99,
            for each N of --rtt-chunks (vLLM layout, the smallest L).
  copy      STORE of N chunks, then (LOOKUP and) RETRIEVE of them into other
            pages, fresh tokens each time, for each L×N of --copy and both
            layouts (vLLM flash-attn, SGLang MHA): GB/s = bytes / request
            round trip. The destination pages are zeroed first and compared
            with the source afterwards: a retrieve that answers True but
            leaves other bytes is reported, not counted.
  sessions  --sessions request ids: all LOOKUPs, all WAITs, all END_SESSIONs.
  cpu       server CPU (user+sys from /proc) per lookup+wait+end (rtt, 8 chunks).
  warm-up   before any block: fresh 8-chunk stores until L1's size went in
            (every L1 page written once); their median GB/s is reported.
  memory    server RSS at idle (before the first request) and its peak (VmHWM).
  idle      server CPU while nothing is asked, over 5 s.
  memcpy    the machine's reference for the GB/s rows: one 256 MiB copy
            between pre-faulted buffers, once per repetition.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tools"))

import numpy as np  # noqa: E402 - in LMCache's venv (a torch dependency)
import shm_pool  # noqa: E402
from lmcache.utils import EngineType  # noqa: E402
from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey as Key  # noqa: E402
from lmcache.v1.multiprocess.transport.zmq_impl import create_request_client  # noqa: E402
from lmcache.v1.platform.base.ipc_wire import CpuShmIPCData, TensorMetadata  # noqa: E402
from lmcache.v1.platform.devices.cpu.shm import CpuShmTensorWrapper  # noqa: E402

CHUNK = 256
PAGE = 16
BPC = CHUNK // PAGE  # pages per chunk
HEADS, HEAD_DIM = 8, 128
EVENT = bytes(64)
T = 120.0
LAYOUTS = ("vllm", "sglang")
# Every pool made here, unlinked at exit even when a block fails (1.5 GiB of
# /dev/shm per server otherwise stays behind).
ALL_POOLS: list = []


def _unlink_all() -> None:
    for p in ALL_POOLS:
        p.close()


atexit.register(_unlink_all)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


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


def fast_fill(pools, seed: int) -> None:
    """Random bytes in every object (shm_pool.fill hashes per 32 bytes:
    minutes for the GiB here)."""
    rng = np.random.default_rng(seed)
    for o in pools.objects:
        o.map[:] = rng.bytes(o.nbytes)


def spans(pools, first_block: int, n_blocks: int):
    """(mmap, offset, length) of n_blocks consecutive pages, per K/V and layer:
    in both layouts a layer's pages lie back to back."""
    for kv in range(2):
        for layer in range(pools.num_layers):
            m, off = pools._page_location(kv, layer, first_block)
            yield m, off, n_blocks * pools.page_bytes


class Server:
    def __init__(self, name: str, endpoint: str, pid: int, shapes: dict[int, int]):
        """shapes: layers -> the most chunks one request moves."""
        self.name, self.pid = name, pid
        self.c = create_request_client(endpoint)
        assert self.c.noop().result(timeout=T) == "OK", f"{name} does not answer"
        self.idle_rss_kib = proc_mem_kib(pid, "VmRSS")
        self.pools, self.instances = {}, {}
        n = 0
        for layers, max_chunks in sorted(shapes.items()):
            for i, layout in enumerate(LAYOUTS):
                make = (shm_pool.vllm_flash_attn_pools if layout == "vllm"
                        else shm_pool.sglang_mha_pools)
                # Stored from pages 0.., retrieved into the pages after them.
                p = make(layers, 2 * max_chunks * BPC, PAGE, HEADS, HEAD_DIM,
                         prefix=f"kvs_sbs_{name}")
                ALL_POOLS.append(p)
                fast_fill(p, 1000 * layers + i)
                inst = 9000 + n
                n += 1
                # The hints LMCache 0.5.6's own adapters send (shm_pool knows them).
                fut = self.c.register_kv_cache(
                    inst, wrappers(p), self.model(layout, layers), 1,
                    EngineType.VLLM if layout == "vllm" else EngineType.SGLANG,
                    p.layout_hints(), [])
                try:
                    fut.result(timeout=30.0)
                    self.instances[(layout, layers)] = inst
                except Exception as e:  # noqa: BLE001 - reported in the table
                    self.instances[(layout, layers)] = (
                        f"registration failed: {type(e).__name__} {e}"[:120])
                self.pools[(layout, layers)] = p
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True)
        self._beat.start()

    def _heartbeat(self):
        while True:
            for inst in self.instances.values():
                if isinstance(inst, int):
                    try:
                        self.c.ping(inst).result(timeout=T)
                    except Exception:  # noqa: BLE001 - the blocks report failures
                        pass
            if self._stop.wait(10.0):
                return

    @staticmethod
    def model(layout, layers):
        return f"bench/{layout}-l{layers}"

    def key(self, layout, layers, toks, rid, n, worker=0):
        return Key(model_name=self.model(layout, layers), world_size=1, worker_id=worker,
                   token_ids=toks, start=0, end=n * CHUNK, request_id=rid, num_kv_readers=1)

    def store(self, layout, layers, toks, rid, n):
        _, ok = self.c.store(self.key(layout, layers, toks, rid, n),
                             self.instances[(layout, layers)],
                             [list(range(0, n * BPC))], EVENT).result(timeout=T)
        return ok

    def lookup_wait(self, layout, layers, toks, rid, n):
        self.c.lookup(self.key(layout, layers, toks, rid, n, worker=None), 1).result(timeout=T)
        return self.c.wait_prefetch_status(rid, 30.0).result(timeout=T)

    def lookup_until(self, layout, layers, toks, rid, n, timeout=30.0):
        """A STORE's chunks become visible when its copy completes (the reply
        may come first): look up until all are there."""
        deadline = time.monotonic() + timeout
        for attempt in range(1_000_000):
            r = f"{rid}-{attempt}"
            if self.lookup_wait(layout, layers, toks, r, n) == n:
                return r
            self.c.end_session(r).result(timeout=T)
            assert time.monotonic() < deadline, f"{self.name}: stored chunks not visible"
            time.sleep(0.01)

    def retrieve(self, layout, layers, toks, rid, n, max_chunks):
        first = max_chunks * BPC
        _, ok = self.c.retrieve(self.key(layout, layers, toks, rid, n),
                                self.instances[(layout, layers)],
                                [list(range(first, first + n * BPC))], EVENT, 0).result(timeout=T)
        return ok

    def close(self):
        self._stop.set()
        self._beat.join()
        for p in self.pools.values():
            p.close()
        self.c.close()


def block_rtt(s: Server, layers: int, n: int, iters: int, rep: int) -> dict:
    toks = tokens(n, salt=1 + n)
    assert s.store("vllm", layers, toks, f"rtt-store-{n}-{rep}", n), f"{s.name}: rtt store"
    s.c.end_session(f"rtt-store-{n}-{rep}").result(timeout=T)
    s.c.end_session(s.lookup_until("vllm", layers, toks, f"rtt-visible-{n}-{rep}", n)).result(
        timeout=T)
    lat, cpu0 = [], proc_cpu_s(s.pid)
    for i in range(iters):
        rid = f"rtt-{n}-{rep}-{i}"
        t0 = time.perf_counter()
        hit = s.lookup_wait("vllm", layers, toks, rid, n)
        lat.append(time.perf_counter() - t0)
        assert hit == n, f"{s.name}: lookup hit {hit} of {n}"
        s.c.end_session(rid).result(timeout=T)
    cpu = proc_cpu_s(s.pid) - cpu0
    lat.sort()
    return {"p50_us": lat[len(lat) // 2] * 1e6, "p99_us": lat[int(len(lat) * 0.99)] * 1e6,
            "cpu_us_per_pair": cpu / iters * 1e6}  # includes the END_SESSIONs


def block_copy(s: Server, layout: str, layers: int, n: int, max_chunks: int, rep: int) -> dict:
    inst = s.instances[(layout, layers)]
    if not isinstance(inst, int):
        return {"error": inst}
    p = s.pools[(layout, layers)]
    nbytes = p.chunk_bytes(CHUNK) * n
    toks = tokens(n, salt=1000 * layers + 100 * n + rep)
    rid = f"copy-{layout}-{layers}-{n}-{rep}"
    for m, off, ln in spans(p, max_chunks * BPC, n * BPC):
        m[off:off + ln] = bytes(ln)
    t0 = time.perf_counter()
    ok = s.store(layout, layers, toks, rid, n)
    t_store = time.perf_counter() - t0
    if not ok:
        s.c.end_session(rid).result(timeout=T)
        return {"error": "store answered False"}
    reader = s.lookup_until(layout, layers, toks, rid + "-r", n)  # locks for the retrieve
    t0 = time.perf_counter()
    ok2 = s.retrieve(layout, layers, toks, reader, n, max_chunks)
    t_retrieve = time.perf_counter() - t0
    for r in (rid, reader):
        s.c.end_session(r).result(timeout=T)
    same = all(m[off:off + ln] == d[doff:doff + ln]
               for (m, off, ln), (d, doff, _) in zip(spans(p, 0, n * BPC),
                                                     spans(p, max_chunks * BPC, n * BPC)))
    out = {"store_GBps": nbytes / t_store / 1e9}
    if not ok2:
        out["error"] = "retrieve answered False"
    elif not same:
        out["error"] = "retrieve answered True, destination pages differ from the stored ones"
    else:
        out["retrieve_GBps"] = nbytes / t_retrieve / 1e9
    return out


def warm_up(s: Server, layers: int, l1_bytes: int) -> float:
    """Store fresh 8-chunk prompts until as many bytes as L1 holds went in,
    so that every L1 page has been written once before anything is timed
    (LMCache writes its whole L1 at start; kvsidecar's pages are faulted in by
    the first store into them). Returns the median GB/s of these stores."""
    p = s.pools[("vllm", layers)]
    nbytes = p.chunk_bytes(CHUNK) * 8
    rates = []
    for i in range(-(-l1_bytes // nbytes)):
        rid = f"warm-{i}"
        t0 = time.perf_counter()
        ok = s.store("vllm", layers, tokens(8, salt=10_000_000 + i), rid, 8)
        rates.append(nbytes / (time.perf_counter() - t0) / 1e9)
        s.c.end_session(rid).result(timeout=T)
        assert ok, f"{s.name}: warm-up store {i} answered False"
    return statistics.median(rates)


def block_sessions(s: Server, layers: int, n: int, rep: int) -> dict:
    toks = tokens(8, salt=1 + 8)  # stored by the 8-chunk rtt block
    t0 = time.perf_counter()
    futs = [s.c.lookup(s.key("vllm", layers, toks, f"s-{rep}-{i}", 8, worker=None), 1)
            for i in range(n)]
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


def memcpy_GBps(src, dst) -> float:
    """The machine's reference: one 256 MiB copy between pre-faulted buffers
    (numpy's copyto is a memcpy), best of 3."""
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = max(best, src.nbytes / (time.perf_counter() - t0) / 1e9)
    return best


def idle_cpu(s: Server, seconds: float = 5.0) -> float:
    c0 = proc_cpu_s(s.pid)
    time.sleep(seconds)
    return (proc_cpu_s(s.pid) - c0) / seconds * 100


def med(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    return statistics.median(xs) if xs else None


def parse_shapes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        layers, n = part.lower().split("x")
        out.append((int(layers), int(n)))
    return out


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[0]


def fmt(x) -> str:
    return "n/a" if x is None else f"{x:,.1f}" if x >= 10 else f"{x:,.2f}"


def print_table(res: dict) -> None:
    """The markdown table from a result JSON (as written by --out). Ratios:
    kvsidecar's advantage per repetition (its block and LMCache's ran one
    right after the other), median and range over the repetitions, so load
    that drifts between repetitions cancels out."""
    st = res["setup"]
    rows = []  # (name, per-repetition values of a server, higher is better)
    for n in st["rtt_chunks"]:
        n = str(n)
        for q in ("p50", "p99"):
            rows.append((f"lookup+wait {n} chunk{'s' * (n != '1')} {q} (µs)",
                         lambda r, n=n, q=q: [x[f"{q}_us"] for x in r["rtt"][n]], False))
    rows.append(("server CPU per lookup+wait+end, 8 chunks (µs)",
                 lambda r: [x["cpu_us_per_pair"] for x in r["rtt"]["8"]], False))
    for k in res["kvsidecar"]["copy"]:
        layout, shape = k.split(" ")
        layers, n = shape.split("x")
        for op in ("store", "retrieve"):
            rows.append((f"{op} {layout}, {n} × {layers} MiB chunks (GB/s)",
                         lambda r, k=k, o=op: [x.get(f"{o}_GBps") for x in r["copy"][k]], True))
    rows += [(f"{st['sessions']:,} sessions (sessions/s)",
              lambda r: [x["sessions_per_s"] for x in r["sessions"]], True),
             (f"store into never-written L1, 8 × {st['warm_layers']} MiB chunks (GB/s; warm-up)",
              lambda r: [r["warm_up_store_GBps"]], True),
             ("RSS idle (MiB)", lambda r: [r["idle_rss_MiB"]], False),
             ("RSS peak (MiB)", lambda r: [r["peak_rss_MiB"]], False),
             ("idle CPU (%)", lambda r: [r["idle_cpu_pct"]], False)]
    k, l = res["kvsidecar"], res["lmcache"]
    print("| what | kvsidecar | LMCache 0.5.6 | kvsidecar better by (median of repetitions) "
          "| range over repetitions |")
    print("|---|---:|---:|---:|---:|")
    for name, f, higher_better in rows:
        xs, ys = f(k), f(l)
        ratios = [(x / y if higher_better else y / x) for x, y in zip(xs, ys)
                  if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x and y]
        ratio = f"{med(ratios):.2f}×" if ratios else ""
        spread = f"{min(ratios):.2f}–{max(ratios):.2f}×" if len(ratios) > 1 else ""
        print(f"| {name} | {fmt(med(xs))} | {fmt(med(ys))} | {ratio} | {spread} |")
    m = res["memcpy_GBps"]
    print(f"memcpy reference (one 256 MiB copy, pre-faulted, one per repetition): median "
          f"{med(m):.2f} GB/s (range {min(m):.2f}-{max(m):.2f})")
    print(f"load average (1 min) at the start and after each repetition: "
          f"{' '.join(res['loadavg_1min'])}")
    for s in ("kvsidecar", "lmcache"):
        for what, v in res[s]["registration"].items():
            if not isinstance(v, int):
                print(f"{s}: {what} pools: {v}")
        for what, xs in res[s]["copy"].items():
            errs = sorted({x["error"] for x in xs if "error" in x})
            for e in errs:
                print(f"{s}: {what}: {e} ({sum(x.get('error') == e for x in xs)} of {len(xs)})")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", metavar="JSON", help="only print the table of a saved result")
    ap.add_argument("--a", required=True, help="kvsidecar endpoint")
    ap.add_argument("--a-pid", type=int, required=True)
    ap.add_argument("--b", required=True, help="LMCache endpoint")
    ap.add_argument("--b-pid", type=int, required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rtt-iters", type=int, default=1000)
    ap.add_argument("--rtt-chunks", default="1,8,32", help="prompt lengths in chunks")
    ap.add_argument("--copy", default="32x8,32x1,4x32",
                    help="LAYERSxCHUNKS per request (a chunk is LAYERS MiB)")
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--l1-gb", type=float, default=4.0, help="L1 size of both servers")
    ap.add_argument("--out", required=True)
    only = argparse.ArgumentParser(add_help=False)
    only.add_argument("--table")
    if (t := only.parse_known_args()[0].table) is not None:
        print_table(json.loads(Path(t).read_text()))
        return 0
    a = ap.parse_args()
    copies = parse_shapes(a.copy)
    rtt_chunks = [int(x) for x in a.rtt_chunks.split(",")]
    if 8 not in rtt_chunks:
        rtt_chunks.append(8)  # the sessions block looks up the 8-chunk prompt
    rtt_layers = min(l for l, _ in copies)
    shapes: dict[int, int] = {}
    for layers, n in copies + [(rtt_layers, n) for n in rtt_chunks]:
        shapes[layers] = max(shapes.get(layers, 0), n)

    servers = [Server("kvsidecar", a.a, a.a_pid, shapes),
               Server("lmcache", a.b, a.b_pid, shapes)]
    res = {s.name: {"rtt": {n: [] for n in rtt_chunks},
                    "copy": {f"{lay} {l}x{n}": [] for lay in LAYOUTS for l, n in copies},
                    "sessions": []} for s in servers}
    for s in servers:
        res[s.name]["idle_rss_MiB"] = s.idle_rss_kib / 1024
        res[s.name]["idle_cpu_pct"] = idle_cpu(s)
        res[s.name]["registration"] = {f"{k[0]} l{k[1]}": v for k, v in s.instances.items()}
    for s in servers:
        res[s.name]["warm_up_store_GBps"] = warm_up(s, max(shapes), int(a.l1_gb * 2**30))
    loads = [loadavg()]
    src = np.frombuffer(np.random.default_rng(0).bytes(256 << 20), dtype=np.uint8)
    dst = np.zeros_like(src)
    res["memcpy_GBps"] = []
    for rep in range(a.reps):
        res["memcpy_GBps"].append(memcpy_GBps(src, dst))
        order = servers if rep % 2 == 0 else servers[::-1]
        for s in order:
            time.sleep(0.05)
            r = res[s.name]
            for n in rtt_chunks:
                r["rtt"][n].append(block_rtt(s, rtt_layers, n, a.rtt_iters, rep))
            for layout in LAYOUTS:
                for layers, n in copies:
                    r["copy"][f"{layout} {layers}x{n}"].append(
                        block_copy(s, layout, layers, n, shapes[layers], rep))
            r["sessions"].append(block_sessions(s, rtt_layers, a.sessions, rep))
        loads.append(loadavg())
        print(f"rep {rep + 1}/{a.reps} done, load {loads[-1]}", file=sys.stderr, flush=True)
    for s in servers:
        res[s.name]["peak_rss_MiB"] = proc_mem_kib(s.pid, "VmHWM") / 1024
        s.close()
    res["loadavg_1min"] = loads

    res["setup"] = {"rtt_chunks": rtt_chunks, "copy": a.copy, "sessions": a.sessions,
                    "rtt_layers": rtt_layers, "warm_layers": max(shapes)}
    Path(a.out).write_text(json.dumps(res, indent=1, default=str))
    print_table(json.loads(Path(a.out).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
