#!/usr/bin/env python3
"""kvsidecar and LMCache 0.5.6's own MP server, side by side, driven by
LMCache 0.5.6's own client classes (run by run_lmcache_side_by_side.sh, in a
virtual environment where lmcache==0.5.6 and its torch are installed; with
0.5.7rc2 on PYTHONPATH, 0.5.7rc2's client and server instead).

Transports (--transport): ZeroMQ (`tcp://`: kvsidecar's cache.endpoint,
LMCache's default transport), gRPC (`grpc://`: kvsidecar's
cache.grpc_endpoint, LMCache's `--transport grpc`), or both. With both, one
kvsidecar process serves both endpoints (one client each, their own instance
ids and model names) and two LMCache servers run, one per transport; all four
run one block per repetition, in the order kvsidecar-ZeroMQ, LMCache-ZeroMQ,
kvsidecar-gRPC, LMCache-gRPC, reversed every other repetition, so the two
servers of one transport always run back to back. Tables: kvsidecar vs LMCache
per transport, and kvsidecar's gRPC vs its ZeroMQ endpoint.

Every server gets the very same requests from the same code: the client made by
`RequestClientFactory.create(url)` (as the adapters make it: the ZeroMQ or the
gRPC client by the URL's scheme), `cpu_shm` KV pools
(0.5.6's CpuShmTensorWrapper, POSIX shared memory from tests/tools/shm_pool.py)
registered with the layout hints LMCache's own adapters send, one PING per
instance every 10 s from a heartbeat thread (as the vLLM adapter's
HeartbeatThread). Every repetition runs one block per server, the order
alternating (A B, B A, ...); medians over the repetitions. A block that fails
(an exception, a timeout, a wrong answer) is recorded with its error and
reported under the table, not retried.

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
  noop      NOOP round trips, one at a time (--rtt-iters): p50 and server CPU
            per NOOP, the transport's floor under the rtt rows.
  sessions  --sessions request ids: all LOOKUPs, all WAITs, all END_SESSIONs.
  cpu       server CPU (user+sys from /proc) per lookup+wait+end (rtt, 8 chunks),
            and this client process's (all its threads: the transport's too).
  warm-up   before any block: fresh 8-chunk stores until L1's size went in
            (every L1 page written once); their median GB/s is reported.
  memory    server RSS at idle (before the first request) and its peak (VmHWM).
  idle      server CPU while nothing is asked, over 5 s.
  memcpy    the machine's reference for the GB/s rows: one 256 MiB copy
            between pre-faulted buffers, once per repetition.
"""

from __future__ import annotations

import argparse
import inspect
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
from lmcache.v1.multiprocess.transport.factory import RequestClientFactory  # noqa: E402
from lmcache.v1.platform.base.ipc_wire import CpuShmIPCData, TensorMetadata  # noqa: E402
from lmcache.v1.platform.devices.cpu.shm import CpuShmTensorWrapper  # noqa: E402

CHUNK = 256
PAGE = 16
BPC = CHUNK // PAGE  # pages per chunk
HEADS, HEAD_DIM = 8, 128
EVENT = bytes(64)
T = 120.0
LAYOUTS = ("vllm", "sglang")
# 0.5.7 keys carry the prompt as packed bytes (token_bytes), 0.5.6 keys as ids.
PACKED_TOKENS = "token_bytes" in inspect.signature(Key).parameters
if PACKED_TOKENS:
    from lmcache.v1.multiprocess.token_codec import pack_token_ids  # noqa: E402
TRANSPORT_LABEL = {"zmq": "ZeroMQ", "grpc": "gRPC"}


def lmcache_version() -> str:
    import lmcache
    v = getattr(lmcache, "__version__", None)
    if not v:
        from importlib.metadata import version
        v = version("lmcache")
    return v
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
    def __init__(self, name: str, endpoint: str, pid: int, shapes: dict[int, int],
                 first_instance: int = 9000):
        """shapes: layers -> the most chunks one request moves. Two Servers on
        one process (kvsidecar's two endpoints) need their own first_instance
        and names (the model names include the name)."""
        self.name, self.pid, self.endpoint = name, pid, endpoint
        self.c = RequestClientFactory.create(endpoint)
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
                inst = first_instance + n
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
                    self.instances[(layout, layers)] = f"registration failed: {err_text(e)}"
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

    def model(self, layout, layers):
        return f"bench/{self.name}/{layout}-l{layers}"

    def key(self, layout, layers, toks, rid, n, worker=0):
        prompt = ({"token_bytes": pack_token_ids(toks)} if PACKED_TOKENS
                  else {"token_ids": toks})
        return Key(model_name=self.model(layout, layers), world_size=1, worker_id=worker,
                   start=0, end=n * CHUNK, request_id=rid, num_kv_readers=1, **prompt)

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
    lat, cpu0, client0 = [], proc_cpu_s(s.pid), time.process_time()
    for i in range(iters):
        rid = f"rtt-{n}-{rep}-{i}"
        t0 = time.perf_counter()
        hit = s.lookup_wait("vllm", layers, toks, rid, n)
        lat.append(time.perf_counter() - t0)
        assert hit == n, f"{s.name}: lookup hit {hit} of {n}"
        s.c.end_session(rid).result(timeout=T)
    cpu = proc_cpu_s(s.pid) - cpu0
    client = time.process_time() - client0
    lat.sort()
    return {"p50_us": lat[len(lat) // 2] * 1e6, "p99_us": lat[int(len(lat) * 0.99)] * 1e6,
            "cpu_us_per_pair": cpu / iters * 1e6,  # includes the END_SESSIONs
            "client_cpu_us_per_pair": client / iters * 1e6}


def block_noop(s: Server, iters: int) -> dict:
    """NOOP round trips, one at a time: the transport's (and client's) floor
    under the lookup rows."""
    lat, cpu0 = [], proc_cpu_s(s.pid)
    for _ in range(iters):
        t0 = time.perf_counter()
        assert s.c.noop().result(timeout=T) == "OK", f"{s.name}: NOOP"
        lat.append(time.perf_counter() - t0)
    cpu = proc_cpu_s(s.pid) - cpu0
    lat.sort()
    return {"p50_us": lat[len(lat) // 2] * 1e6, "cpu_us": cpu / iters * 1e6}


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


def _vals(xs, key):
    """A key's values over the repetitions; a failed block (no such key) is None."""
    return [x.get(key) for x in xs]


def table_rows(res: dict, name: str, traffic_only: bool = False) -> list:
    """(row name, f(server result) -> per-repetition values, higher is better)."""
    st = res["setup"]
    rows = []
    if res[name].get("noop"):
        rows += [("NOOP round trip p50 (µs; transport floor)",
                  lambda r: _vals(r["noop"], "p50_us"), False),
                 ("server CPU per NOOP (µs)", lambda r: _vals(r["noop"], "cpu_us"), False)]
    for n in st["rtt_chunks"]:
        n = str(n)
        for q in ("p50", "p99"):
            rows.append((f"lookup+wait {n} chunk{'s' * (n != '1')} {q} (µs)",
                         lambda r, n=n, q=q: _vals(r["rtt"][n], f"{q}_us"), False))
    rows.append(("server CPU per lookup+wait+end, 8 chunks (µs)",
                 lambda r: _vals(r["rtt"]["8"], "cpu_us_per_pair"), False))
    if any("client_cpu_us_per_pair" in x for x in res[name]["rtt"]["8"]):
        rows.append(("client CPU per lookup+wait+end, 8 chunks (µs; same client code)",
                     lambda r: _vals(r["rtt"]["8"], "client_cpu_us_per_pair"), False))
    for k in res[name]["copy"]:
        layout, shape = k.split(" ")
        layers, n = shape.split("x")
        for op in ("store", "retrieve"):
            rows.append((f"{op} {layout}, {n} × {layers} MiB chunks (GB/s)",
                         lambda r, k=k, o=op: _vals(r["copy"][k], f"{o}_GBps"), True))
    rows.append((f"{st['sessions']:,} sessions (sessions/s)",
                 lambda r: _vals(r["sessions"], "sessions_per_s"), True))
    if traffic_only:
        return rows
    return rows + [
        (f"store into never-written L1, 8 × {st['warm_layers']} MiB chunks (GB/s; warm-up)",
         lambda r: [r.get("warm_up_store_GBps")], True),
        ("RSS idle (MiB)", lambda r: [r["idle_rss_MiB"]], False),
        ("RSS peak (MiB)", lambda r: [r["peak_rss_MiB"]], False),
        ("idle CPU (%)", lambda r: [r["idle_cpu_pct"]], False)]


def ratios_of(xs, ys, higher_better) -> list:
    """Per repetition: how much better xs is than ys."""
    return [(x / y if higher_better else y / x) for x, y in zip(xs, ys)
            if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x and y]


def cell(xs) -> str:
    """The median; failed repetitions (None) are counted, not hidden."""
    fails = sum(x is None for x in xs)
    return fmt(med(xs)) + (f" ({fails} of {len(xs)} failed)" if fails else "")


def one_table(res: dict, a: str, b: str, a_label: str, b_label: str, ratio_label: str,
              traffic_only: bool = False) -> dict:
    """Prints one markdown table, a's advantage over b; returns the median ratios."""
    print(f"| what | {a_label} | {b_label} | {ratio_label} (median of repetitions) "
          "| range over repetitions |")
    print("|---|---:|---:|---:|---:|")
    out = {}
    for name, f, higher_better in table_rows(res, a, traffic_only):
        xs, ys = f(res[a]), f(res[b])
        ratios = ratios_of(xs, ys, higher_better)
        out[name] = med(ratios)
        ratio = f"{med(ratios):.2f}×" if ratios else ""
        spread = f"{min(ratios):.2f}–{max(ratios):.2f}×" if len(ratios) > 1 else ""
        print(f"| {name} | {cell(xs)} | {cell(ys)} | {ratio} | {spread} |")
    return out


def print_errors(res: dict, s: str) -> None:
    if "warm_up_error" in res[s]:
        print(f"{s}: warm-up: {res[s]['warm_up_error']}")
    for what, v in res[s]["registration"].items():
        if not isinstance(v, int):
            print(f"{s}: {what} pools: {v}")
    groups = [(f"copy {k}", xs) for k, xs in res[s]["copy"].items()]
    groups += [(f"lookup+wait {n} chunks", xs) for n, xs in res[s]["rtt"].items()]
    groups.append(("sessions", res[s]["sessions"]))
    groups.append(("noop", res[s].get("noop", [])))
    for what, xs in groups:
        for e in sorted({x["error"] for x in xs if "error" in x}):
            print(f"{s}: {what}: {e} ({sum(x.get('error') == e for x in xs)} of {len(xs)})")


def print_table(res: dict) -> None:
    """The markdown tables from a result JSON (as written by --out). Ratios:
    kvsidecar's advantage per repetition (its block and LMCache's ran one
    right after the other), median and range over the repetitions, so load
    that drifts between repetitions cancels out. With both transports, a
    table of kvsidecar's ZeroMQ endpoint against its gRPC endpoint follows
    (its ratio column: gRPC's latency / ZeroMQ's, ZeroMQ's GB/s / gRPC's)."""
    st = res["setup"]
    lmc = f"LMCache {st.get('lmcache_version', '0.5.6')}"
    # Results from before the transport knob: one pair, ZeroMQ.
    pairs = st.get("pairs", [["kvsidecar", "lmcache", "zmq"]])
    medians = {}
    for a, b, transport in pairs:
        label = TRANSPORT_LABEL[transport]
        print(f"\n{label} ({'grpc://' if transport == 'grpc' else 'tcp://'}), "
              f"client: {lmc}'s {label} client\n")
        medians[transport] = one_table(res, a, b, f"kvsidecar {label}", f"{lmc} {label}",
                                       "kvsidecar better by")
    names = {t: a for a, _, t in pairs}
    grpc_vs_zmq = None
    if "zmq" in names and "grpc" in names:
        print(f"\nkvsidecar, one process: its ZeroMQ endpoint vs its gRPC endpoint "
              f"({lmc}'s clients)\n")
        grpc_vs_zmq = one_table(res, names["zmq"], names["grpc"], "kvsidecar ZeroMQ",
                                "kvsidecar gRPC", "gRPC ÷ ZeroMQ (ZeroMQ better by)",
                                traffic_only=True)
    m = res["memcpy_GBps"]
    print(f"\nmemcpy reference (one 256 MiB copy, pre-faulted, one per repetition): median "
          f"{med(m):.2f} GB/s (range {min(m):.2f}-{max(m):.2f})")
    print(f"load average (1 min) at the start and after each repetition: "
          f"{' '.join(res['loadavg_1min'])}")
    print("order of the blocks in even repetitions (reversed in odd ones): "
          + ", ".join(st.get("order", ["kvsidecar", "lmcache"])))
    # The targets, on the medians of the per-repetition ratios.
    checks = []
    for t, r in medians.items():
        for name, v in r.items():
            if ("lookup+wait" in name and "p50" in name) or name.startswith(
                    "server CPU per lookup"):
                checks.append((f"{TRANSPORT_LABEL[t]}: {name}", v, 3.0, True))
            elif name.startswith(("store ", "retrieve ")) and "warm-up" not in name:
                checks.append((f"{TRANSPORT_LABEL[t]}: {name}", v, 2.0, True))
    if grpc_vs_zmq:
        for name, v in grpc_vs_zmq.items():
            if name.startswith("lookup+wait") and "p50" in name:
                checks.append((f"kvsidecar gRPC ÷ ZeroMQ: {name}", v, 1.3, False))
    if checks:
        print("targets (kvsidecar ≥ 3× LMCache on lookup p50 and CPU, ≥ 2× on store/retrieve; "
              "kvsidecar gRPC ≤ 1.3× its ZeroMQ lookup p50):")
        for what, v, want, at_least in checks:
            if v is None:
                verdict = "n/a"
            else:
                verdict = "ok" if (v >= want if at_least else v <= want) else "MISSED"
            print(f"  {verdict:6} {what}: {'n/a' if v is None else f'{v:.2f}×'} "
                  f"(want {'≥' if at_least else '≤'} {want}×)")
    for s in st.get("order", ["kvsidecar", "lmcache"]):
        print_errors(res, s)


def err_text(e: BaseException) -> str:
    """One line: a gRPC error by its status and details."""
    if callable(getattr(e, "code", None)) and callable(getattr(e, "details", None)):
        text = f"gRPC {e.code().name}: {e.details()}"
    else:
        text = f"{type(e).__name__}: {e}"
    return " ".join(text.split())[:200]


def guarded(s: "Server", f, *args) -> dict:
    """One block; a failure is its result (reported, not retried)."""
    try:
        return f(s, *args)
    except Exception as e:  # noqa: BLE001 - reported under the table
        return {"error": err_text(e)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", metavar="JSON", help="only print the tables of a saved result")
    ap.add_argument("--transport", choices=("zmq", "grpc", "both"), default="zmq")
    ap.add_argument("--a", help="kvsidecar's ZeroMQ endpoint (tcp://)")
    ap.add_argument("--a-grpc", help="kvsidecar's gRPC endpoint (grpc://)")
    ap.add_argument("--a-pid", type=int, required=True)
    ap.add_argument("--b", help="LMCache's ZeroMQ endpoint (tcp://)")
    ap.add_argument("--b-pid", type=int, help="pid of LMCache's ZeroMQ server")
    ap.add_argument("--b-grpc", help="LMCache's gRPC endpoint (grpc://)")
    ap.add_argument("--b-grpc-pid", type=int, help="pid of LMCache's gRPC server")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rtt-iters", type=int, default=1000)
    ap.add_argument("--rtt-chunks", default="1,8,32", help="prompt lengths in chunks")
    ap.add_argument("--copy", default="32x8,32x1,4x32",
                    help="LAYERSxCHUNKS per request (a chunk is LAYERS MiB)")
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--l1-gb", type=float, default=4.0, help="L1 size of every server")
    ap.add_argument("--out", required=True)
    only = argparse.ArgumentParser(add_help=False)
    only.add_argument("--table")
    if (t := only.parse_known_args()[0].table) is not None:
        print_table(json.loads(Path(t).read_text()))
        return 0
    a = ap.parse_args()
    transports = ["zmq", "grpc"] if a.transport == "both" else [a.transport]
    for t, need in (("zmq", ("a", "b", "b_pid")), ("grpc", ("a_grpc", "b_grpc", "b_grpc_pid"))):
        if t in transports:
            for k in need:
                if getattr(a, k) is None:
                    ap.error(f"--transport {a.transport} needs --{k.replace('_', '-')}")
    copies = parse_shapes(a.copy)
    rtt_chunks = [int(x) for x in a.rtt_chunks.split(",")]
    if 8 not in rtt_chunks:
        rtt_chunks.append(8)  # the sessions block looks up the 8-chunk prompt
    rtt_layers = min(l for l, _ in copies)
    shapes: dict[int, int] = {}
    for layers, n in copies + [(rtt_layers, n) for n in rtt_chunks]:
        shapes[layers] = max(shapes.get(layers, 0), n)

    # ZeroMQ keeps the names results had before the transport knob.
    suffix = {"zmq": "", "grpc": "-grpc"}
    servers, pairs = [], []
    for i, t in enumerate(transports):
        ka = Server(f"kvsidecar{suffix[t]}", a.a if t == "zmq" else a.a_grpc, a.a_pid,
                    shapes, first_instance=9000 + 100 * i)
        lb = Server(f"lmcache{suffix[t]}", a.b if t == "zmq" else a.b_grpc,
                    a.b_pid if t == "zmq" else a.b_grpc_pid, shapes)
        servers += [ka, lb]
        pairs.append([ka.name, lb.name, t])
    res = {s.name: {"rtt": {n: [] for n in rtt_chunks},
                    "copy": {f"{lay} {l}x{n}": [] for lay in LAYOUTS for l, n in copies},
                    "sessions": [], "noop": [], "endpoint": s.endpoint} for s in servers}
    for s in servers:
        res[s.name]["idle_rss_MiB"] = s.idle_rss_kib / 1024
        res[s.name]["idle_cpu_pct"] = idle_cpu(s)
        res[s.name]["registration"] = {f"{k[0]} l{k[1]}": v for k, v in s.instances.items()}
    for s in servers:
        try:
            res[s.name]["warm_up_store_GBps"] = warm_up(s, max(shapes), int(a.l1_gb * 2**30))
        except Exception as e:  # noqa: BLE001 - reported under the table
            res[s.name]["warm_up_error"] = err_text(e)
            print(f"{s.name}: warm-up failed: {res[s.name]['warm_up_error']}", file=sys.stderr)
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
            r["noop"].append(guarded(s, block_noop, a.rtt_iters))
            for n in rtt_chunks:
                r["rtt"][n].append(guarded(s, block_rtt, rtt_layers, n, a.rtt_iters, rep))
            for layout in LAYOUTS:
                for layers, n in copies:
                    r["copy"][f"{layout} {layers}x{n}"].append(
                        guarded(s, block_copy, layout, layers, n, shapes[layers], rep))
            r["sessions"].append(guarded(s, block_sessions, rtt_layers, a.sessions, rep))
        loads.append(loadavg())
        print(f"rep {rep + 1}/{a.reps} done, load {loads[-1]}", file=sys.stderr, flush=True)
    for s in servers:
        res[s.name]["peak_rss_MiB"] = proc_mem_kib(s.pid, "VmHWM") / 1024
        s.close()
    res["loadavg_1min"] = loads

    res["setup"] = {"rtt_chunks": rtt_chunks, "copy": a.copy, "sessions": a.sessions,
                    "rtt_layers": rtt_layers, "warm_layers": max(shapes), "pairs": pairs,
                    "order": [s.name for s in servers], "lmcache_version": lmcache_version(),
                    "rtt_iters": a.rtt_iters, "reps": a.reps, "l1_gb": a.l1_gb}
    Path(a.out).write_text(json.dumps(res, indent=1, default=str))
    print_table(json.loads(Path(a.out).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
