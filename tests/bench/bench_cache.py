#!/usr/bin/env python3
"""KV cache server benchmark driver (run by tests/bench/run_cache_bench.sh).

Talks the LMCache 0.5.6 MP protocol (tests/integration/lmcache_client.py)
to a running kvsidecar (host backend) and to bench_cache_echo's raw ROUTER,
and measures:

  rtt       LOOKUP + WAIT_PREFETCH_STATUS round trip, one DEALER, one pair at
            a time (not pipelined), on a warm cache: the 8-chunk (2048-token)
            prompt was stored first, so every lookup hits and locks 8 chunks.
            Every iteration is a new request id (as in an engine) and is
            followed, outside the timed span, by its END_SESSION, so each
            timed pair starts on an idle server. The echo server gets the
            very same frames from the same code; the frames are encoded
            before the clock starts, so what is timed is send, server, receive.
            Each repetition runs a block on each server (order alternating,
            50 ms pause before each block); `--reps` repetitions, medians.
            Also the CPU (user+sys) each server process used per pair, and a
            breakdown by request kind (see bench_breakdown).
  copy      STORE then RETRIEVE of 8 chunks of 256 tokens of a Llama-3-8B
            shaped KV cache (32 layers, 8 KV heads, head_dim 128, bf16: 32 MiB
            per chunk, 256 MiB per request) from/to host shared-memory pools,
            SGLang MHA layout (and vLLM flash-attn), page size 16 (32 KiB
            pages). The host backend copies before it answers, so GB/s = bytes
            / request round trip. Fresh tokens every repetition (a store of
            chunks L1 already holds copies nothing). Warm-up stores first
            write every L1 slot once (L1 is mapped at start, its pages are
            faulted in by the first write; that first store is reported
            separately). Interleaved with
            `bench_cache_echo memcpy` (the same pages gathered/scattered by a
            plain loop of memcpy, and one single memcpy), once per repetition.
  sessions  1,000 request ids at once over 4 DEALERs (a small 2-layer model,
            2-chunk prompts, 8 distinct prompts stored first): all LOOKUPs, then all
            WAIT_PREFETCH_STATUS (1,000 sessions holding 2,000 read locks),
            all RETRIEVEs (2 chunks each), all END_SESSIONs; then the store's
            stats must come back to locks=0, sessions=0.

    bench_cache.py run --server tcp://127.0.0.1:P --echo tcp://127.0.0.1:Q \
        --log kvsidecar.stderr.log --memcpy-bin build-bench/tests/bench_cache_echo --out r.json
    bench_cache.py report --server-json r.json --index-json idx.json [--loadavg "..."]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
sys.path.insert(0, str(HERE.parent / "tools"))

import msgspec  # noqa: E402
import zmq  # noqa: E402

import shm_pool  # noqa: E402
from lmcache_client import EVENT_HANDLE, MPClient, cache_key, pool_wrappers  # noqa: E402

CHUNK = 256
LLAMA = dict(num_layers=32, heads=8, head_dim=128, block_size=16)  # bf16
COPY_CHUNKS = 8  # chunks per STORE / RETRIEVE request
RTT_CHUNKS = 8
GB = 1e9

STATS_RE = re.compile(r"\s(store|engine_bridge|session_router)#\d+ stats: (.*)$")


def tokens(n_chunks: int, salt: int) -> list[int]:
    """Deterministic token ids, distinct per salt from the first token on."""
    return [(salt * 1_000_003 + i * 7919) % 150_000 for i in range(n_chunks * CHUNK)]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def fast_fill(pools: shm_pool.KVPools, seed: int) -> None:
    """Distinct bytes in every page, quickly (shm_pool.fill hashes every page:
    far too slow for 1 GiB). Also faults every page in before timing."""
    rnd = os.urandom(1 << 20)
    for i, o in enumerate(pools.objects):
        # Rotate the random block per object so planes differ.
        k = (seed * 7919 + i * 4099) % len(rnd)
        block = rnd[k:] + rnd[:k]
        n = o.nbytes
        reps = n // len(block) + 1
        o.map[:] = (block * reps)[:n]


# --- the log's stats lines -----------------------------------------------------------------


def parse_stats(text: str) -> dict:
    out = {}
    for part in text.split():
        k, _, v = part.partition("=")
        out[k] = int(v) if v.lstrip("-").isdigit() else v
    return out


class Log:
    def __init__(self, path: str | None):
        self.path = Path(path) if path else None

    def mark(self) -> int:
        return self.path.stat().st_size if self.path else 0

    def stats(self, actor: str, mark: int) -> dict | None:
        if not self.path:
            return None
        with open(self.path, "rb") as f:
            f.seek(mark)
            lines = f.read().decode(errors="replace").split("\n")[:-1]
        last = None
        for line in lines:
            m = STATS_RE.search(line)
            if m and m.group(1) == actor:
                last = m.group(2)
        return parse_stats(last) if last else None

    def slot_count(self) -> int | None:
        """L1 slots of the latest registered chunk size (how many such chunks
        fill L1), from the store's registration line."""
        if not self.path:
            return None
        m = re.findall(r"chunk slots of \d+ KiB: (\d+) slots in L1", self.path.read_text(errors="replace"))
        return int(m[-1]) if m else None

    def wait(self, actor: str, cond, timeout: float = 10.0) -> dict | None:
        """The first stats line of `actor` written after now that satisfies cond."""
        if not self.path:
            return None
        mark = self.mark()
        deadline = time.monotonic() + timeout
        s = None
        while time.monotonic() < deadline:
            s = self.stats(actor, mark)
            if s is not None and cond(s):
                return s
            time.sleep(0.02)
        raise AssertionError(f"{actor} stats never satisfied the condition; last: {s}")


# --- round trip ------------------------------------------------------------------------------


class RawPair:
    """LOOKUP + WAIT_PREFETCH_STATUS on one DEALER, frames encoded up front."""

    def __init__(self, endpoint: str, ctx: zmq.Context, model: str, toks: list[int]):
        self.c = MPClient(endpoint, ctx)
        self.sock = self.c.sock
        self.model = model
        self.toks = toks
        self.uid = 0

    def frames(self, rid: str) -> tuple[list[bytes], list[bytes], list[bytes]]:
        enc = msgspec.msgpack.encode
        key = cache_key(self.model, 1, None, self.toks, 0, len(self.toks), rid)
        u = self.uid
        self.uid += 3
        lookup = [enc(u), enc(8), enc(key), enc(1)]
        wait = [enc(u + 1), enc(10), enc(rid), enc(5.0)]
        end = [enc(u + 2), enc(13), enc(rid)]
        return lookup, wait, end

    def step(self, rid: str, want_hits: int) -> float:
        """One timed LOOKUP + WAIT pair, then (untimed) its END_SESSION; µs."""
        sock = self.sock
        lookup, wait, end = self.frames(rid)
        t0 = time.perf_counter_ns()
        sock.send_multipart(lookup)
        r1 = sock.recv_multipart()
        sock.send_multipart(wait)
        r2 = sock.recv_multipart()
        t1 = time.perf_counter_ns()
        # Checked outside the timed span.
        assert r1 == lookup[:2], r1
        assert r2[:2] == wait[:2] and len(r2) == 3, r2
        assert msgspec.msgpack.decode(r2[2]) == want_hits, r2
        sock.send_multipart(end)
        r3 = sock.recv_multipart()
        assert r3 == end[:2], r3
        return (t1 - t0) / 1000.0


def cpu_seconds(pid: int | None) -> float:
    """user + system CPU time a process has used so far (0 when unknown)."""
    if not pid:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def blocks(n: int, r: int, a_step, b_step, a_pid=None, b_pid=None) -> tuple[list[float], list[float], dict]:
    """n iterations of a, then n of b (b first on odd r), with a 50 ms pause
    before each block so the other server is idle again (the sidecar's CAF
    workers keep polling for a while after each message, and on 2 cores
    that CPU would be taken from the other block). Also returns the CPU
    each server process used per iteration in its own block."""
    out: dict[str, list[float]] = {}
    cpu: dict[str, float] = {}
    order = [("a", a_step, a_pid), ("b", b_step, b_pid)]
    if r % 2:
        order.reverse()
    gc.disable()
    try:
        for name, step, pid in order:
            time.sleep(0.05)
            c0 = cpu_seconds(pid)
            out[name] = [step(i) for i in range(n)]
            cpu[name] = (cpu_seconds(pid) - c0) / n * 1e6
    finally:
        gc.enable()
    return out["a"], out["b"], cpu


def bench_rtt(a, ctx, log: Log) -> dict:
    model = "bench/rtt-model"
    toks = tokens(RTT_CHUNKS, salt=7)
    # Warm the cache: a small-layout instance stores the 8 chunks the lookups hit.
    pools = shm_pool.sglang_mha_pools(2, RTT_CHUNKS * CHUNK // 16 + 1, 16, 2, 16, prefix="kvs_cb")
    try:
        fast_fill(pools, 1)
        c = MPClient(a.server, ctx)
        c.register_kv_cache(90, pool_wrappers(pools, "cpu_shm"), model, 1, "sglang",
                            {"tokens_per_block": 16}, [], timeout=10)
        handle, ok = c.store(cache_key(model, 1, 0, toks, 0, len(toks), "rtt-warm"), 90,
                             [list(range(RTT_CHUNKS * CHUNK // 16))], timeout=10)
        assert ok, "warm-up store failed"
        c.end_session("rtt-warm", timeout=5)
        server = RawPair(a.server, ctx, model, toks)
        echo = RawPair(a.echo, ctx, model, toks)
        blocks(a.rtt_warmup, 0, lambda i: server.step(f"w-s{i}", RTT_CHUNKS),
               lambda i: echo.step(f"w-e{i}", RTT_CHUNKS))
        reps = []
        for r in range(a.reps):
            s, e, cpu = blocks(a.rtt_iters, r, lambda i: server.step(f"s{r}-{i}", RTT_CHUNKS),
                               lambda i: echo.step(f"e{r}-{i}", RTT_CHUNKS), a.server_pid, a.echo_pid)
            rep = {"server": summarize(s), "echo": summarize(e)}
            rep["server"]["cpu_us"] = cpu["a"]
            rep["echo"]["cpu_us"] = cpu["b"]
            reps.append(rep)
            print(f"  rtt rep {r}: sidecar p50 {rep['server']['p50']:.1f} p99 {rep['server']['p99']:.1f} "
                  f"cpu {cpu['a']:.0f} | echo p50 {rep['echo']['p50']:.1f} p99 {rep['echo']['p99']:.1f} "
                  f"cpu {cpu['b']:.0f} us", flush=True)
        breakdown = None
        if a.breakdown_iters > 0:
            breakdown = bench_breakdown(a, ctx, model, toks)
        # Nothing may be left behind by all those sessions.
        idle = log.wait("store", lambda st: st["locks"] == 0 and st["sessions"] == 0)
        c.unregister_kv_cache(90, timeout=10)
        for x in (server, echo, ):
            x.c.close()
        c.close()
    finally:
        pools.close()
    return {"reps": reps, "iters": a.rtt_iters, "chunks": RTT_CHUNKS, "idle_after": idle,
            "breakdown": breakdown,
            "median": {k: {m: statistics.median(r[k][m] for r in reps) for m in ("p50", "p99", "mean", "cpu_us")}
                       for k in ("server", "echo")}}


BREAKDOWN_OPS = ("noop", "wait_unknown", "lookup_2048", "wait", "end", "lookup_256")


def bench_breakdown(a, ctx, model: str, toks: list[int]) -> dict:
    """Where the round trip goes: single requests, one at a time, p50 per
    kind, sidecar and echo in alternating blocks. noop and a WAIT for an unknown
    request are answered by the engine bridge itself (no actor hop); a
    LOOKUP starts a session actor and is acked by it; WAIT and END_SESSION
    go to an existing session. LOOKUPs of 2048 and of 256 tokens show the
    per-token cost. Then the CPU cost of decoding each request's frames,
    in one thread without sockets (bench_cache_echo decode)."""
    enc = msgspec.msgpack.encode

    def one(sock, frames) -> float:
        t0 = time.perf_counter_ns()
        sock.send_multipart(frames)
        r = sock.recv_multipart()
        t1 = time.perf_counter_ns()
        assert r[:2] == frames[:2], r
        return (t1 - t0) / 1000.0

    def step(sock, i: int, tag: str, res: dict) -> None:
        u = 10 * i
        rid, rid2 = f"{tag}-{i}", f"{tag}-x{i}"
        res["noop"].append(one(sock, [enc(u), enc(24)]))
        res["wait_unknown"].append(one(sock, [enc(u + 1), enc(10), enc(f"none-{tag}-{i}"), enc(5.0)]))
        res["lookup_2048"].append(one(sock, [enc(u + 2), enc(8),
                                             enc(cache_key(model, 1, None, toks, 0, len(toks), rid)), enc(1)]))
        res["wait"].append(one(sock, [enc(u + 3), enc(10), enc(rid), enc(5.0)]))
        res["end"].append(one(sock, [enc(u + 4), enc(13), enc(rid)]))
        res["lookup_256"].append(one(sock, [enc(u + 5), enc(8),
                                            enc(cache_key(model, 1, None, toks[:256], 0, 256, rid2)), enc(1)]))
        one(sock, [enc(u + 6), enc(10), enc(rid2), enc(5.0)])
        one(sock, [enc(u + 7), enc(13), enc(rid2)])

    reps = []
    cs, ce = MPClient(a.server, ctx), MPClient(a.echo, ctx)
    try:
        for r in range(3):
            rs: dict[str, list[float]] = {k: [] for k in BREAKDOWN_OPS}
            re_: dict[str, list[float]] = {k: [] for k in BREAKDOWN_OPS}
            blocks(a.breakdown_iters, r, lambda i: step(cs.sock, i, f"bs{r}", rs) or 0.0,
                   lambda i: step(ce.sock, i, f"be{r}", re_) or 0.0)
            reps.append({"server": {k: pct(v, 0.5) for k, v in rs.items()},
                         "echo": {k: pct(v, 0.5) for k, v in re_.items()}})
    finally:
        cs.close()
        ce.close()
    out = {"iters": a.breakdown_iters,
           "p50": {k: {op: statistics.median(x[k][op] for x in reps) for op in BREAKDOWN_OPS}
                   for k in ("server", "echo")}}
    for k in ("server", "echo"):
        print(f"  breakdown p50 {k}: " + ", ".join(f"{op} {v:.0f}" for op, v in out["p50"][k].items()) + " us",
              flush=True)
    if a.memcpy_bin and a.workdir:
        dec = {}
        frames = {
            "lookup_2048": [enc(1), enc(8), enc(cache_key(model, 1, None, toks, 0, len(toks), "r-1")), enc(1)],
            "lookup_256": [enc(1), enc(8), enc(cache_key(model, 1, None, toks[:256], 0, 256, "r-1")), enc(1)],
            "wait": [enc(1), enc(10), enc("r-1"), enc(5.0)],
        }
        for name, fr in frames.items():
            path = Path(a.workdir) / f"frames_{name}.bin"
            path.write_bytes(b"".join(len(f).to_bytes(4, "little") + f for f in fr))
            p = subprocess.run([a.memcpy_bin, "decode", str(path), "--iters", "5000"],
                               capture_output=True, text=True, check=True)
            line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")][-1]
            dec[name] = {k: float(v) for k, v in (kv.split("=") for kv in line.split()[1:])}
        out["decode"] = dec
        print("  decode (CPU, no sockets): " + ", ".join(
            f"{n} {d['decode_ns'] / 1000:.1f} us (+hash {d['hash_ns'] / 1000:.1f})" for n, d in dec.items()), flush=True)
    return out


def summarize(xs: list[float]) -> dict:
    return {"p50": pct(xs, 0.5), "p99": pct(xs, 0.99), "mean": statistics.fmean(xs), "n": len(xs)}


# --- store / retrieve throughput -------------------------------------------------------------


def memcpy_once(binary: str) -> dict:
    p = subprocess.run([binary, "memcpy", "--layers", str(LLAMA["num_layers"]),
                        "--page-bytes", str(LLAMA["block_size"] * LLAMA["heads"] * LLAMA["head_dim"] * 2),
                        "--pages-per-chunk", str(CHUNK // LLAMA["block_size"]),
                        "--chunks", str(COPY_CHUNKS), "--reps", "1"],
                       capture_output=True, text=True, check=True)
    line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return {k: float(v) for k, v in (kv.split("=") for kv in line.split()[1:])}


def bench_copy(a, ctx, log: Log) -> dict:
    layouts = [x for x in a.layouts.split(",") if x]
    pages_per_req = COPY_CHUNKS * CHUNK // LLAMA["block_size"]  # 128
    nbytes = None
    out: dict = {"layouts": {}, "memcpy": []}
    pools_by = {}
    c = MPClient(a.server, ctx)
    try:
        for i, lay in enumerate(layouts):
            kw = dict(num_layers=LLAMA["num_layers"], heads=LLAMA["heads"],
                      head_dim=LLAMA["head_dim"], prefix="kvs_cb")
            if lay == "sglang":
                p = shm_pool.sglang_mha_pools(num_pages=2 * pages_per_req, page_size=LLAMA["block_size"], **kw)
                hints = {"tokens_per_block": LLAMA["block_size"]}
            else:
                p = shm_pool.vllm_flash_attn_pools(num_blocks=2 * pages_per_req,
                                                   block_size=LLAMA["block_size"], **kw)
                hints = p.layout_hints()
            pools_by[lay] = p
            fast_fill(p, 11 + i)
            c.register_kv_cache(100 + i, pool_wrappers(p, "cpu_shm"), f"bench/llama-8b-{lay}", 1,
                                lay, hints, [], timeout=30)
            nbytes = COPY_CHUNKS * p.chunk_bytes(CHUNK)
            out["layouts"][lay] = {"store": [], "retrieve": []}
        src = list(range(pages_per_req))
        dst = list(range(pages_per_req, 2 * pages_per_req))
        # L1 is mapped at start but its pages are faulted in by the first
        # store into each slot; measure that once ("cold"), then store until
        # every slot has been written at least once, and measure after that.
        slots = log.slot_count() or 32
        n_warm = -(-slots // COPY_CHUNKS) + 1
        out["l1_slots"] = slots
        out["warmup_stores"] = n_warm
        seq = 0

        def one(lay: str, i: int, rep: str) -> tuple[float, float]:
            nonlocal seq
            seq += 1
            model = f"bench/llama-8b-{lay}"
            toks = tokens(COPY_CHUNKS, salt=1000 + seq)
            rid = f"copy-{lay}-{rep}"
            key = cache_key(model, 1, 0, toks, 0, len(toks), rid)
            t0 = time.perf_counter()
            handle, ok = c.store(key, 100 + i, [src], EVENT_HANDLE, timeout=60)
            t1 = time.perf_counter()
            assert ok, f"store {rid} failed"
            # A RETRIEVE reads what a LOOKUP of the same request found (as in
            # LMCache 0.5.6): not timed, an engine's scheduler does it first.
            c.lookup(cache_key(model, 1, None, toks, 0, len(toks), rid), 1, timeout=60)
            hit = c.wait_prefetch_status(rid, 30.0, timeout=60)
            assert hit == COPY_CHUNKS, f"lookup {rid} found {hit} of {COPY_CHUNKS} chunks"
            t2 = time.perf_counter()
            handle, ok = c.retrieve(key, 100 + i, [dst], EVENT_HANDLE, 0, timeout=60)
            t3 = time.perf_counter()
            assert ok, f"retrieve {rid} failed"
            c.end_session(rid, timeout=10)
            return t1 - t0, t3 - t2

        for w in range(n_warm):
            i = w % len(layouts)
            lay = layouts[i]
            ts, tr = one(lay, i, f"warm{w}")
            print(f"  copy warm-up {w} {lay}: store {nbytes / ts / GB:.2f} GB/s, "
                  f"retrieve {nbytes / tr / GB:.2f} GB/s", flush=True)
            if w == 0:
                out["cold_store"] = {"layout": lay, "s": ts, "gbps": nbytes / ts / GB}
            if w < len(layouts):  # bit-exact, once per layout: pages at both ends and inside
                p = pools_by[lay]
                for kv, layer, page in ((0, 0, 0), (1, 31, 127), (0, 17, 64), (1, 3, 5)):
                    assert p.page(kv, layer, dst[page]) == p.page(kv, layer, src[page]), \
                        f"{lay}: retrieved page kv={kv} layer={layer} page={page} differs"
        for r in range(a.reps):
            for i, lay in enumerate(layouts):
                ts, tr = one(lay, i, str(r))
                st = {"s": ts, "gbps": nbytes / ts / GB}
                rt = {"s": tr, "gbps": nbytes / tr / GB}
                out["layouts"][lay]["store"].append(st)
                out["layouts"][lay]["retrieve"].append(rt)
                print(f"  copy rep {r} {lay}: store {st['gbps']:.2f} GB/s ({st['s'] * 1e3:.1f} ms), "
                      f"retrieve {rt['gbps']:.2f} GB/s ({rt['s'] * 1e3:.1f} ms)", flush=True)
            if a.memcpy_bin:
                m = memcpy_once(a.memcpy_bin)
                out["memcpy"].append(m)
                print(f"  copy rep {r} memcpy: gather {m['gather_gbps']:.2f} scatter {m['scatter_gbps']:.2f} "
                      f"single {m['single_gbps']:.2f} GB/s", flush=True)
        for i, lay in enumerate(layouts):
            c.unregister_kv_cache(100 + i, timeout=10)
    finally:
        c.close()
        for p in pools_by.values():
            p.close()
    out["bytes"] = nbytes
    for lay, d in out["layouts"].items():
        d["median"] = {k: statistics.median(x["gbps"] for x in d[k]) for k in ("store", "retrieve")}
    if out["memcpy"]:
        out["memcpy_median"] = {k: statistics.median(m[k] for m in out["memcpy"])
                                for k in ("gather_gbps", "scatter_gbps", "single_gbps")}
    return out


# --- 1,000 concurrent sessions ---------------------------------------------------------------


def bench_sessions(a, ctx, log: Log) -> dict:
    n = a.sessions
    prompts = 8
    chunks = 2
    model = "bench/sessions-model"
    pools = shm_pool.sglang_mha_pools(2, prompts * chunks * CHUNK // 16 + 64, 16, 2, 16, prefix="kvs_cb")
    clients = [MPClient(a.server, ctx) for _ in range(4)]
    try:
        fast_fill(pools, 3)
        c0 = clients[0]
        c0.register_kv_cache(200, pool_wrappers(pools, "cpu_shm"), model, 1, "sglang",
                             {"tokens_per_block": 16}, [], timeout=10)
        ppp = chunks * CHUNK // 16  # pages per prompt
        toks = [tokens(chunks, salt=5000 + p) for p in range(prompts)]
        for p in range(prompts):
            _, ok = c0.store(cache_key(model, 1, 0, toks[p], 0, len(toks[p]), f"seed-{p}"), 200,
                             [list(range(p * ppp, (p + 1) * ppp))], timeout=10)
            assert ok
            c0.end_session(f"seed-{p}", timeout=5)
        dst = list(range(prompts * ppp, prompts * ppp + ppp))
        rids = [f"sess-{i}" for i in range(n)]

        def phase(make, owner_only: bool = False) -> float:
            # STORE/RETRIEVE name the instance: only the connection that
            # registered it may use it (README, "Security and tenants"), as
            # a worker does; lookups and waits come from every connection.
            uids = []
            t0 = time.perf_counter()
            for i in range(n):
                cl = c0 if owner_only else clients[i % len(clients)]
                uids.append((cl, cl.submit(*make(i))))
            vals = [cl.result(u, timeout=60) for cl, u in uids]
            return time.perf_counter() - t0, vals

        gc.disable()
        try:
            t_lookup, vals = phase(lambda i: ("lookup", cache_key(model, 1, None, toks[i % prompts], 0,
                                                                  chunks * CHUNK, rids[i]), 1))
            assert all(v is None for v in vals)
            t_wait, vals = phase(lambda i: ("wait_prefetch_status", rids[i], 10.0))
            assert all(v == chunks for v in vals), set(map(repr, vals))
        finally:
            gc.enable()
        # Untimed: every session is alive and holds its lookup's locks.
        peak = log.wait("store", lambda s: s["sessions"] == n and s["locks"] == n * chunks)
        # Sessions are the session router's (the engine bridge only owns the socket).
        peak_bridge = log.wait("session_router", lambda s: s["sessions"] == n)
        gc.disable()
        try:
            t_retrieve, vals = phase(lambda i: ("retrieve", cache_key(model, 1, 0, toks[i % prompts], 0,
                                                                      chunks * CHUNK, rids[i]),
                                                200, [dst], EVENT_HANDLE, 0), owner_only=True)
            assert all(v[1] is True for v in vals)
            t_end, vals = phase(lambda i: ("end_session", rids[i]))
            assert all(v is None for v in vals)
        finally:
            gc.enable()
        idle = log.wait("store", lambda s: s["locks"] == 0 and s["sessions"] == 0
                        and s["locked_chunks"] == 0)
        idle_bridge = log.wait("session_router", lambda s: s["sessions"] == 0)
        c0.unregister_kv_cache(200, timeout=10)
    finally:
        for cl in clients:
            cl.close()
        pools.close()
    total = t_lookup + t_wait + t_retrieve + t_end
    res = {"sessions": n, "chunks_per_session": chunks, "dealers": len(clients),
           "t_lookup": t_lookup, "t_wait": t_wait, "t_retrieve": t_retrieve, "t_end": t_end,
           "total": total, "sessions_per_s": n / total, "peak_store": peak, "peak_bridge": peak_bridge,
           "idle_store": idle, "idle_bridge": idle_bridge}
    print(f"  sessions: {n} in {total * 1e3:.0f} ms (lookup {t_lookup * 1e3:.0f}, wait {t_wait * 1e3:.0f}, "
          f"retrieve {t_retrieve * 1e3:.0f}, end {t_end * 1e3:.0f} ms); peak sessions={peak and peak['sessions']} "
          f"locks={peak and peak['locks']}; after: locks={idle and idle['locks']} "
          f"sessions={idle and idle['sessions']}", flush=True)
    return res


# --- report ------------------------------------------------------------------------------------


def report(a) -> None:
    r = json.loads(Path(a.server_json).read_text())
    idx = json.loads(Path(a.index_json).read_text()) if a.index_json else None
    rows: list[tuple[str, str, str, str]] = []  # what, measured, reference, vs target

    def verdict(ok: bool) -> str:
        return "MET" if ok else "MISSED"

    if "rtt" in r:
        m = r["rtt"]["median"]
        for q in ("p50", "p99", "mean"):
            ratio = m["server"][q] / m["echo"][q]
            tgt = f"{ratio:.2f}x echo (target <= 1.5x): {verdict(ratio <= 1.5)}" if q != "mean" else f"{ratio:.2f}x echo"
            rows.append((f"lookup+wait RTT {q}", f"{m['server'][q]:.1f} us", f"echo {m['echo'][q]:.1f} us", tgt))
        if m["server"].get("cpu_us"):
            rows.append(("  server CPU per lookup+wait pair", f"{m['server']['cpu_us']:.0f} us",
                         f"echo {m['echo']['cpu_us']:.0f} us", "user+sys, all threads"))
    bd = r.get("rtt", {}).get("breakdown")
    if bd:
        for op in BREAKDOWN_OPS:
            sv, ev = bd["p50"]["server"][op], bd["p50"]["echo"][op]
            rows.append((f"  diag: {op.replace('_', ' ')} alone, p50", f"{sv:.0f} us", f"echo {ev:.0f} us",
                         f"+{sv - ev:.0f} us"))
        for name, d in bd.get("decode", {}).items():
            rows.append((f"  diag: decode {name.replace('_', ' ')} (1 thread, no I/O)",
                         f"{d['decode_ns'] / 1000:.1f} us", f"chunk hashes {d['hash_ns'] / 1000:.1f} us", ""))
    if "copy" in r:
        cp = r["copy"]
        mm = cp.get("memcpy_median", {})
        for lay, d in cp["layouts"].items():
            for op, ref in (("store", "gather_gbps"), ("retrieve", "scatter_gbps")):
                g = d["median"][op]
                refv = mm.get(ref)
                single = mm.get("single_gbps")
                if refv:
                    ratio = g / refv
                    ratio1 = g / single
                    rows.append((f"{op} 8x256 tok, Llama-8B, {lay}", f"{g:.2f} GB/s",
                                 f"memcpy pages {refv:.2f} / single {single:.2f} GB/s",
                                 f"{ratio:.2f}x page memcpy, {ratio1:.2f}x single (target >= 0.7x): "
                                 f"{verdict(min(ratio, ratio1) >= 0.7)}"))
                else:
                    rows.append((f"{op} {lay}", f"{g:.2f} GB/s", "-", "-"))
        if "cold_store" in cp:
            cs = cp["cold_store"]
            rows.append((f"first store into untouched L1 ({cs['layout']})", f"{cs['gbps']:.2f} GB/s",
                         f"{cp['l1_slots']} slots, {cp['warmup_stores']} warm-up stores", "not a target"))
    if "sessions" in r:
        s = r["sessions"]
        rows.append((f"{s['sessions']} concurrent sessions (lookup, wait, retrieve {s['chunks_per_session']} "
                     f"chunks, end)", f"{s['total'] * 1e3:.0f} ms, {s['sessions_per_s']:.0f} sessions/s",
                     f"peak sessions={s['peak_store']['sessions']} locks={s['peak_store']['locks']}",
                     f"after: locks={s['idle_store']['locks']} sessions={s['idle_store']['sessions']} "
                     f"session_router sessions={s['idle_bridge']['sessions']}: "
                     f"{verdict(s['idle_store']['locks'] == 0 and s['idle_store']['sessions'] == 0)}"))
    if idx:
        what = {
            "BM_LookupPrefix32/1": ("32-chunk prefix, all hit", 32, "1,000,000 chunks x 1 rank"),
            "BM_LookupPrefix32/4": ("32-chunk prefix x 4 ranks, all hit", 128, "250,000 chunks x 4 ranks"),
            "BM_LookupPrefix32/8": ("32-chunk prefix x 8 ranks, all hit", 256, "125,000 chunks x 8 ranks"),
            "BM_LookupMiss": ("32-chunk prefix, first chunk misses", 1, "1,000,000 chunks"),
            "BM_LedgerLookupEnd": ("lookup-and-lock 32 chunks x 4 ranks + end_session", 128,
                                   "250,000 chunks x 4 ranks"),
        }
        for b in idx.get("benchmarks", []):
            name = b["name"]
            if name not in what:
                continue
            ns = b["real_time"] if b.get("time_unit", "ns") == "ns" else b["real_time"] * 1000
            desc, n, entries = what[name]
            rows.append((f"index: {desc}", f"{ns / 1000:.2f} us", f"{entries} indexed ({name})",
                         f"{ns / n:.0f} ns per chunk looked up" if n > 1 else "one hash probe"))
    w = [max(len(x[i]) for x in rows + [("what", "measured", "reference", "vs target")]) for i in range(4)]
    hdr = ("what", "measured", "reference", "vs target")
    print("| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(hdr)) + " |")
    print("|" + "|".join("-" * (w[i] + 2) for i in range(4)) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(row)) + " |")
    if a.loadavg:
        print(f"load average: {a.loadavg}")


# --- main ----------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run")
    run.add_argument("--server", required=True)
    run.add_argument("--echo", required=True)
    run.add_argument("--log", help="kvsidecar's stderr (stats lines: locks/sessions)")
    run.add_argument("--server-pid", type=int, help="kvsidecar's pid (CPU per request)")
    run.add_argument("--echo-pid", type=int, help="bench_cache_echo's pid (CPU per request)")
    run.add_argument("--memcpy-bin")
    run.add_argument("--out", required=True)
    run.add_argument("--reps", type=int, default=5)
    run.add_argument("--rtt-iters", type=int, default=2000)
    run.add_argument("--rtt-warmup", type=int, default=200)
    run.add_argument("--sessions", type=int, default=1000)
    run.add_argument("--layouts", default="sglang,vllm")
    run.add_argument("--breakdown-iters", type=int, default=500)
    run.add_argument("--workdir", help="where to write scratch files (frames for the decode timing)")
    run.add_argument("--only", default="rtt,copy,sessions")
    rep = sub.add_parser("report")
    rep.add_argument("--server-json", required=True)
    rep.add_argument("--index-json")
    rep.add_argument("--loadavg")
    a = ap.parse_args()
    if a.cmd == "report":
        report(a)
        return
    ctx = zmq.Context()
    log = Log(a.log)
    res: dict = {}
    only = set(a.only.split(","))
    try:
        if "copy" in only:  # first: its warm-up writes all of L1 with its large chunks
            print("store/retrieve throughput ...", flush=True)
            res["copy"] = bench_copy(a, ctx, log)
        if "rtt" in only:
            print("lookup+wait round trip ...", flush=True)
            res["rtt"] = bench_rtt(a, ctx, log)
        if "sessions" in only:
            print("concurrent sessions ...", flush=True)
            res["sessions"] = bench_sessions(a, ctx, log)
    finally:
        Path(a.out).write_text(json.dumps(res, indent=1))
        ctx.destroy(linger=0)


if __name__ == "__main__":
    main()
