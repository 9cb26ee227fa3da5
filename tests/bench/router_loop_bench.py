#!/usr/bin/env python3
"""Routers in the loop (issue #26): each real router fed through kvsidecar,
next to the same router fed by the engine directly.

    python3 tests/bench/router_loop_bench.py --out /tmp/router_loop.json
    python3 tests/bench/router_loop_bench.py --routers dynamo --rates 2000,max \
        --late-blocks 100000 --repeats 3 --out r.json

The engine is vLLM 0.33's own ZmqEventPublisher (loaded from its wheel by
tests/integration/real_engines.py), publishing KVEventBatch objects of
--events BlockStored events, each a chain of --blocks 16-token blocks with
its own tokens (parent None), so every chain is a separate prefix a router
can be asked about. "sidecar": engine PUB -> kvsidecar -> router (the
router's --kv-event-source / /register points at the sidecar's PUB and
replay ROUTER); "direct": the router at the engine's PUB and the engine's
own replay ROUTER (vLLM's buffer_steps ring).

Routers (their released PyPI packages, see tests/integration/requirements.txt):
  dynamo  NVIDIA Dynamo's standalone indexer (python -m dynamo.indexer
          --threads 1). "Holds chain c" = POST /query with c's tokens
          answers all of them matched for the worker.
  vllm    vllm-router 0.1.17, --policy kv_aware, one stub worker, debug log.
          "Applied seq s" = its debug line `kv_index live|replay sequence
          advanced ... seq=s` (it applies a source's batches in seq order and
          replays a gap first, so seq s applied = every batch up to s is in
          its index); a routing decision (`KV prefix decision ...
          credited_prefix_tokens`) checks the end state of each run.
  smg     smg 1.13.0 gateway + the smg-grpc-servicer relay in a stub gRPC
          worker (tests/integration/router_smg_worker.py). "Holds n
          blocks" = its Prometheus gauge smg_kv_index_blocks{worker}. Its
          relay is live-only: late, it subscribes to the sidecar's
          events.join_endpoint (the rank's state first, then live);
          direct, to the engine's PUB, where it can only see what comes
          after it (measured for 10 s, reported as not recovered).

Three measurements, each repeated --repeats times alternating
sidecar/direct (a fresh engine, sidecar and router per run); medians:
  1. throughput: N = rate x --seconds batches published at a fixed offered
     rate ("max": as fast as vLLM's publisher takes them); the time from the
     first publish until the router holds the last batch; router events/s
     and blocks/s = what it indexed / that time; "tail" = how long after the
     last publish it got there (bounded tail = it kept up); "held" = the
     fraction of a sample of the N batches it holds at the end.
  2. lag: --probes single-chain batches, one at a time (optionally over a
     background load of --lag-load batches/s): publish() -> the router
     shows it (dynamo /query, vllm-router's applied seq, smg's block gauge),
     polled every ~1 ms; p50/p99.
  3. late join (dynamo, vllm; smg through the join endpoint): the engine publishes --late-blocks blocks
     before the router starts; the router starts (the engine keeps
     publishing an empty batch every 50 ms, as a live engine does, which is
     what makes both routers notice seq > 0 and replay from 0); recovery =
     router ready (dynamo: /register answered; vllm-router: "Router ready")
     -> it holds the last block, and the sample it holds at the end.
     Sidecar: events.buffer_steps / buffer_bytes sized to hold every batch.
     Direct: vLLM's buffer_steps = --engine-buffer-steps (default: sized the
     same; 10000 is vLLM's default, set it to see what a stock engine keeps).

Prints a table of medians and writes every run and the medians as JSON to --out.
Everything waits on conditions with deadlines; nothing sleeps and hopes.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

import msgspec  # noqa: E402
import zmq  # noqa: E402

import real_engines  # noqa: E402
import router_common as rc  # noqa: E402
from kvsidecar_harness import Sidecar, Subscriber, binary_path, free_port_range, wait_until  # noqa: E402

BS = 16
MODEL = "m"
PROBE_BASE = 20_000_000     # chain ids of lag probes (data chains count from 0)
LOAD_BASE = 25_000_000      # chain ids of the lag phase's background load
WARM_BASE = 30_000_000      # chain ids of warm-up batches
TOKEN_CAP = 2 ** 31         # token ids stay below this (Dynamo hashes u32 tokens)


def now() -> float:
    return time.monotonic()


# --- the workload -------------------------------------------------------------


class Shape:
    def __init__(self, events: int, blocks: int):
        self.events, self.blocks = events, blocks

    def tokens(self, c: int) -> list[int]:
        start = 1000 + (c * self.blocks * BS) % (TOKEN_CAP - 1_000_000)
        return list(range(start, start + self.blocks * BS))

    def event(self, v, c: int):
        return v.BlockStored(block_hashes=list(range(c * self.blocks + 1, (c + 1) * self.blocks + 1)),
                             parent_block_hash=None, token_ids=self.tokens(c), block_size=BS,
                             lora_id=None, medium="GPU", lora_name=None)

    def batch_events(self, v, i: int, base: int = 0) -> list:
        """Batch i: chains base + i*events .. + events - 1."""
        return [self.event(v, base + i * self.events + j) for j in range(self.events)]

    def last_chain(self, i: int, base: int = 0) -> int:
        return base + i * self.events + self.events - 1


# --- the engine -----------------------------------------------------------------


class Engine:
    """vLLM's ZmqEventPublisher on fresh ports. publish() returns (engine
    seq, time of the publish() call); vLLM numbers batches 0, 1, ... in
    publish order, which the lock keeps equal to ours."""

    def __init__(self, v, buffer_steps: int):
        self.v = v
        self.port = free_port_range(1)
        self.replay_port = free_port_range(1)
        self.pub = v.ZmqEventPublisher(0, endpoint=f"tcp://*:{self.port}",
                                       replay_endpoint=f"tcp://*:{self.replay_port}",
                                       buffer_steps=buffer_steps)
        self.seq = 0
        self.lock = threading.Lock()

    def publish(self, events: list) -> tuple[int, float]:
        with self.lock:
            s = self.seq
            self.seq += 1
            t = now()
            self.pub.publish(self.v.KVEventBatch(ts=float(s), events=events))
        return s, t

    def flushed(self) -> bool:
        """Every publish() is on the wire (the publisher thread's queue is empty)."""
        return self.pub._event_queue.unfinished_tasks == 0

    def close(self) -> None:
        self.pub.shutdown()


class Ticker:
    """An empty batch every `period` s on a thread: a live engine's steady
    stream (each a new seq), which is what makes a late router see seq > 0."""

    def __init__(self, engine: Engine, period: float = 0.05):
        self.engine, self.period = engine, period
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.wait(self.period):
            self.engine.publish([])

    def close(self):
        self.stop.set()
        self.thread.join(5)


# --- the path: sidecar or direct ----------------------------------------------------


class Path_:
    """Where the router subscribes: the sidecar's PUB/replay, or the engine's.
    to_router(s): the seq the router sees for engine seq s."""

    def __init__(self, mode: str, engine: Engine, workdir: Path, args, buffer_batches: int,
                 join: bool = False):
        self.mode, self.engine = mode, engine
        self.sidecar: Sidecar | None = None
        self.offset = 0
        self.join_port = 0  # the sidecar's events.join_endpoint (join=True)
        if mode == "direct":
            self.pub_port, self.replay_port = engine.port, engine.replay_port
            return
        self.pub_port, self.replay_port = free_port_range(1), free_port_range(1)
        o = {"cache.enabled": False, "sidecar.stats_interval": "1s",
             "events.ingest_endpoint": f"tcp://127.0.0.1:{engine.port}",
             "events.endpoint": f"tcp://*:{self.pub_port}",
             "events.replay_endpoint": f"tcp://*:{self.replay_port}",
             # vLLM's PUB high-water mark, so the two paths drop alike.
             "events.hwm": args.hwm,
             "events.buffer_steps": max(10000, buffer_batches + 1000),
             "events.buffer_bytes": args.sidecar_buffer_bytes,
             "events.index_max_blocks": max(1_000_000, args.late_blocks_max + 200_000)}
        if join:
            self.join_port = free_port_range(1)
            o["events.join_endpoint"] = f"tcp://*:{self.join_port}"
        self.sidecar = Sidecar(workdir, o, name=f"kvsidecar-{mode}").start()
        # Until the sidecar's SUB has joined the engine's PUB (slow joiner),
        # then the seq it gives engine seq s: read back on our own
        # subscriber by the batch's ts (= engine seq), then closed.
        ctx = zmq.Context.instance()
        sub = Subscriber(ctx, self.pub_port)
        try:
            deadline = now() + 30
            while True:
                s, _ = engine.publish([])
                got = None
                until = now() + 0.2
                while now() < until:
                    m = sub.recv(0, 0.05)
                    if m is not None:
                        body = msgspec.msgpack.decode(m.payload)
                        if body[0] == float(s):
                            got = m.seq
                            break
                if got is not None:
                    self.offset = got - s
                    break
                assert now() < deadline, f"the sidecar never relayed the engine:\n{self.sidecar.tail()}"
        finally:
            sub.close()

    def to_router(self, engine_seq: int) -> int:
        return engine_seq + self.offset

    def sidecar_metric(self, name: str) -> float:
        assert self.sidecar is not None
        return sum(v for (n, _), v in self.sidecar.metrics().items() if n == name)

    def holds_all(self, last_engine_seq: int) -> bool:
        """The path's replay buffer has everything up to last_engine_seq."""
        if self.sidecar is None:
            return self.engine.flushed() and len(self.engine.pub._buffer) and \
                self.engine.pub._buffer[-1][0] >= last_engine_seq
        return self.sidecar_metric("kvsidecar_events_seq") > self.to_router(last_engine_seq)

    def close(self) -> None:
        if self.sidecar is not None:
            if self.sidecar.running():
                self.sidecar.stop(timeout=15, expect=None)
            self.sidecar.kill()


# --- log tailing ------------------------------------------------------------------------


class LogTail:
    """Reads a growing log file incrementally and hands each new line to `on_line`."""

    def __init__(self, path: Path, on_line):
        self.path, self.on_line = path, on_line
        self.pos = 0
        self.rest = b""
        self.lock = threading.Lock()

    def poll(self) -> None:
        with self.lock:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self.pos)
                    data = f.read()
            except FileNotFoundError:
                return
            if not data:
                return
            self.pos += len(data)
            data = self.rest + data
            lines = data.split(b"\n")
            self.rest = lines.pop()
            for line in lines:
                self.on_line(line)


# --- routers ----------------------------------------------------------------------


class DynamoRouter:
    name = "dynamo"
    late_join = True

    def __init__(self, workdir: Path, path: Path_, shape: Shape):
        self.path, self.shape = path, shape
        self.port = free_port_range(1)
        self.proc = rc.Proc(rc.python_module("dynamo.indexer") + ["--port", str(self.port),
                                                                  "--threads", "1"],
                            workdir / f"dynamo-{self.port}.log")
        self.conn: http.client.HTTPConnection | None = None
        wait_until(self._healthy, 60, "dynamo indexer /health", interval=0.05)
        code, body = self._call("/register", {
            "instance_id": 1, "endpoint": f"tcp://127.0.0.1:{path.pub_port}",
            "replay_endpoint": f"tcp://127.0.0.1:{path.replay_port}", "model_name": MODEL,
            "block_size": BS, "dp_rank": 0})
        assert code == 201, body
        self.t_ready = now()

    def _call(self, p: str, body=None):
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                data = None if body is None else json.dumps(body).encode()
                self.conn.request("POST" if data is not None else "GET", p, body=data,
                                  headers={"Content-Type": "application/json"})
                r = self.conn.getresponse()
                raw = r.read()
                try:
                    return r.status, json.loads(raw or b"null")
                except ValueError:
                    return r.status, raw.decode(errors="replace")
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _healthy(self) -> bool:
        assert self.proc.alive(), f"dynamo indexer exited:\n{self.proc.tail()}"
        try:
            return self._call("/health")[0] == 200
        except OSError:
            return False

    def holds_chain(self, c: int) -> bool:
        code, body = self._call("/query", {"token_ids": self.shape.tokens(c), "model_name": MODEL})
        assert code == 200, body
        return body["scores"].get("1", {}).get("0", 0) == self.shape.blocks * BS

    # What every measurement asks: "does it show batch (engine seq) s / chain c".
    def shows(self, engine_seq: int, chain: int) -> bool:
        return self.holds_chain(chain)

    def sample_held(self, chains: list[int]) -> float:
        return sum(self.holds_chain(c) for c in chains) / max(1, len(chains))

    def extra(self) -> dict:
        return {}

    def close(self):
        if self.conn is not None:
            self.conn.close()
        self.proc.close()


_ANSI_B = re.compile(rb"\x1b\[[0-9;]*m")
_ADV = re.compile(rb"kv_index (live|replay) sequence advanced source=\S+ rank=0 seq=(\d+)")
_DECISION = re.compile(r'KV prefix decision .*?worker="([^"]+)".*?credited_prefix_tokens=(\d+)')


class VllmRouterR:
    name = "vllm"
    late_join = True

    def __init__(self, workdir: Path, path: Path_, shape: Shape):
        import test_router_vllm_router as tv
        self.path, self.shape = path, shape
        self.stub = tv.StubWorker("A")
        self.port = free_port_range(1)
        self.metrics_port = free_port_range(1)
        self.max_seq = -1
        self.live = 0
        self.replayed = 0
        self.replay_timeouts = 0
        self.decisions: list[tuple[str, int]] = []
        argv = rc.python_module("vllm_router.launch_router") + [
            "--host", "127.0.0.1", "--port", str(self.port), "--worker-urls", self.stub.url,
            "--policy", "kv_aware", "--kv-event-block-size", str(BS), "--kv-event-model", MODEL,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
            "--health-check-interval-secs", "3600", "--log-level", "debug",
            "--kv-event-source", f"{self.stub.url}=tcp://127.0.0.1:{path.pub_port}",
            "--kv-event-replay-source", f"{self.stub.url}=tcp://127.0.0.1:{path.replay_port}"]
        logp = workdir / f"vllm-router-{self.port}.log"
        self.ready = False
        self.tail = LogTail(logp, self._line)
        self.proc = rc.Proc(argv, logp)
        wait_until(self._ready, 60, "vllm-router ready", interval=0.05)
        self.t_ready = now()

    def _line(self, line: bytes) -> None:
        if b"\x1b" in line:
            line = _ANSI_B.sub(b"", line)
        m = _ADV.search(line)
        if m:
            s = int(m.group(2))
            if s > self.max_seq:
                self.max_seq = s
            if m.group(1) == b"live":
                self.live += 1
            else:
                self.replayed += 1
            return
        if b"replay" in line and b"timed out" in line:
            self.replay_timeouts += 1
        elif b"Router ready" in line:
            self.ready = True
        elif b"KV prefix decision" in line:
            d = _DECISION.search(line.decode(errors="replace"))
            if d:
                self.decisions.append((d.group(1), int(d.group(2))))

    def _ready(self):
        assert self.proc.alive(), f"vllm-router exited:\n{self.proc.tail()}"
        self.tail.poll()
        return self.ready and rc.scrape(self.metrics_port) is not None

    def applied(self) -> int:
        self.tail.poll()
        return self.max_seq

    def shows(self, engine_seq: int, chain: int) -> bool:
        return self.applied() >= self.path.to_router(engine_seq)

    def credited(self, chain: int) -> int:
        """A routing decision for chain's tokens + 1: the tokens it credited."""
        n = len(self.decisions)
        code, body = rc.http_json(f"http://127.0.0.1:{self.port}/v1/completions",
                                  json.dumps({"model": MODEL, "prompt": self.shape.tokens(chain) + [7],
                                              "max_tokens": 1}).encode())
        assert code == 200, f"vllm-router answered {code}: {body[:300]!r}"

        def got():
            self.tail.poll()
            return len(self.decisions) > n
        wait_until(got, 30, "vllm-router's decision line")
        return self.decisions[n][1]

    def sample_held(self, chains: list[int]) -> float:
        # A routing request per chain costs ~ms each: a short sample.
        few = chains[:3] + chains[-3:] if len(chains) > 6 else chains
        return sum(self.credited(c) == self.shape.blocks * BS for c in few) / max(1, len(few))

    def extra(self) -> dict:
        self.tail.poll()
        return {"live_seqs": self.live, "replayed_seqs": self.replayed,
                "replay_timeouts": self.replay_timeouts}

    def close(self):
        self.proc.close()
        self.stub.close()


class SmgRouter:
    name = "smg"
    # smg-grpc-servicer 0.14.1's relay is live-only: late, it recovers only
    # through the sidecar's join endpoint (the rank's state as its first
    # batches). Direct, it never does; that run waits this long, not
    # --late-timeout, and reports what it held.
    late_join = True
    join_endpoint = True
    direct_late_timeout = 10.0

    def __init__(self, workdir: Path, path: Path_, shape: Shape):
        from router_smg_worker import write_tokenizer
        import test_router_smg as ts
        self.path, self.shape = path, shape
        pub = path.join_port or path.pub_port

        class Side:
            pub_endpoint = f"tcp://127.0.0.1:{pub}"
            replay_endpoint = f"tcp://127.0.0.1:{path.replay_port}"
        tok = write_tokenizer(workdir / "tokenizer")
        self.worker = ts.Worker(workdir, "A", Side(), tok)
        self.gw = ts.Smg(workdir, [self.worker])
        self.t_ready = now()
        self.expected = 0  # blocks smg should hold once it shows everything sent

    @property
    def proc(self):
        """The gateway's process (what the late-join run reports the RSS of)."""
        return self.gw.proc

    def blocks(self) -> float:
        return self.gw.blocks(self.worker)

    def shows(self, engine_seq: int, chain: int) -> bool:
        return self.blocks() >= self.expected

    def sample_held(self, chains: list[int]) -> float:
        return min(1.0, self.blocks() / max(1, self.expected))

    def extra(self) -> dict:
        return {"index_blocks": self.blocks()}

    def close(self):
        self.gw.close()
        self.worker.close()


ROUTERS = {"dynamo": DynamoRouter, "vllm": VllmRouterR, "smg": SmgRouter}


# --- measurements -----------------------------------------------------------------


def poll(cond, timeout: float, what: str, interval: float = 0.001):
    return wait_until(cond, timeout, what, interval=interval)


def warm(engine: Engine, router, shape: Shape, k: int) -> None:
    """Until the router shows a warm-up batch published now (its SUB joined):
    re-published (a new chain each time) until one shows."""
    deadline = now() + 60
    i = 0
    while True:
        c = WARM_BASE + k * 1000 + i
        if isinstance(router, SmgRouter):
            router.expected += shape.blocks
        s, _ = engine.publish([shape.event(engine.v, c)])
        until = now() + 0.5
        while now() < until:
            if router.shows(s, c):
                return
            time.sleep(0.005)
        if isinstance(router, SmgRouter):
            router.expected = router.blocks()
        i += 1
        assert now() < deadline, "the router never showed a warm-up batch"


def throughput(engine: Engine, router, shape: Shape, batches: list, base: int,
               rate: float | None, deadline_s: float) -> dict:
    n = len(batches)
    if isinstance(router, SmgRouter):
        router.expected += n * shape.events * shape.blocks
    t0 = now()
    t_first = None
    s = -1
    for i, evs in enumerate(batches):
        if rate:
            target = t0 + i / rate
            while True:
                d = target - now()
                if d <= 0:
                    break
                if d > 0.002:
                    time.sleep(d - 0.001)
        s, t = engine.publish(evs)
        if t_first is None:
            t_first = t
    t_last = now()
    last_chain = shape.last_chain(n - 1, base)
    # The engine's own wire rate: when vLLM's publisher thread has sent the
    # last one (at "max" it, not publish(), is the engine's limit).
    flushed = [None]

    def done():
        if flushed[0] is None and engine.flushed():
            flushed[0] = now()
        return router.shows(s, last_chain)
    poll(done, deadline_s, f"{router.name} to show batch {n - 1}", interval=0.002)
    t_done = now()
    if flushed[0] is None:
        poll(engine.flushed, 30, "the engine's queue to drain")
        flushed[0] = now()
    rnd = random.Random(n)
    sample = sorted(base + c for c in rnd.sample(range(n * shape.events), min(50, n * shape.events)))
    held = router.sample_held(sample + [last_chain])
    dt = t_done - t_first
    return {"batches": n, "offered_batches_s": n / max(1e-9, t_last - t_first),
            "events_s": n * shape.events / dt, "blocks_s": n * shape.events * shape.blocks / dt,
            "engine_wire_batches_s": n / max(1e-9, flushed[0] - t_first),
            "tail_s": t_done - t_last, "held": held, **router.extra()}


def lag(engine: Engine, router, shape: Shape, probes: int, load: float) -> dict:
    stop = threading.Event()
    loader = None
    if load > 0:
        def run():
            i = 0
            t0 = now()
            while not stop.is_set():
                target = t0 + i / load
                d = target - now()
                if d > 0:
                    stop.wait(d)
                engine.publish(shape.batch_events(engine.v, i, LOAD_BASE))
                if isinstance(router, SmgRouter):
                    router.expected += shape.events * shape.blocks
                i += 1
        loader = threading.Thread(target=run, daemon=True)
        loader.start()
    out = []
    try:
        for k in range(probes):
            c = PROBE_BASE + k
            if isinstance(router, SmgRouter):
                router.expected = router.blocks() + shape.blocks if load == 0 else 0
            s, t = engine.publish([shape.event(engine.v, c)])
            poll(lambda: router.shows(s, c), 30, f"{router.name} to show probe {k}")
            out.append(now() - t)
    finally:
        stop.set()
        if loader is not None:
            loader.join(5)
    out.sort()
    return {"probes": probes, "p50_ms": 1000 * pct(out, 50), "p99_ms": 1000 * pct(out, 99),
            "max_ms": 1000 * out[-1]}


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def late_join(v, mode: str, router_cls, shape: Shape, blocks: int, workdir: Path, args) -> dict:
    n = -(-blocks // (shape.events * shape.blocks))
    steps = args.engine_buffer_steps or (n + 1000)
    engine = Engine(v, steps)
    path = None
    router = None
    ticker = None
    try:
        path = Path_(mode, engine, workdir, args, n + 100,
                     join=getattr(router_cls, "join_endpoint", False))
        t0 = now()
        first = None
        last = -1
        for i in range(n):
            s, _ = engine.publish(shape.batch_events(v, i))
            if first is None:
                first = s
            last = s
        poll(lambda: path.holds_all(last), 600, f"{mode} to hold all {n} batches", interval=0.05)
        t_pub = now() - t0
        last_chain = shape.last_chain(n - 1)
        t_spawn = now()
        ticker = Ticker(engine)
        router = router_cls(workdir, path, shape)
        if hasattr(router, "expected"):  # smg: a count of blocks, not a chain
            router.expected = n * shape.events * shape.blocks
        t_ready = router.t_ready
        timeout = args.late_timeout
        if mode == "direct" and hasattr(router_cls, "direct_late_timeout"):
            timeout = router_cls.direct_late_timeout
        ok = True
        try:
            poll(lambda: router.shows(last, last_chain), timeout,
                 f"{router.name} to recover {n} batches ({mode})", interval=0.01)
        except AssertionError:
            ok = False
        t_done = now()
        rnd = random.Random(7)
        sample = sorted(rnd.sample(range(n * shape.events), min(100, n * shape.events)))
        held = router.sample_held([0] + sample + [last_chain])
        extra = router.extra()
        # Reaching the last seq is not enough: vllm-router gives a replay up
        # after its own timeout (~5 s) and goes on live without the blocks.
        ok = ok and held == 1.0
        res = {"blocks": n * shape.events * shape.blocks, "batches": n, "engine_buffer_steps": steps,
               "publish_s": t_pub, "recovered": ok,
               "recovery_s": (t_done - t_ready) if ok else None,
               "reached_last_s": t_done - t_ready,
               "start_s": t_ready - t_spawn, "held": held, **extra}
        if path.sidecar is not None:
            res["sidecar_rss_mib"] = rss_mib(path.sidecar.proc.pid)
        res["router_rss_mib"] = rss_mib(router.proc.proc.pid if hasattr(router.proc, "proc") else 0)
        return res
    finally:
        if ticker is not None:
            ticker.close()
        if router is not None:
            router.close()
        if path is not None:
            path.close()
        engine.close()


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def live_run(v, mode: str, router_cls, shape: Shape, workdir: Path, args, rates, pre_built) -> dict:
    """One fresh engine (+ sidecar) + router: every throughput rate, then lag."""
    max_batches = max((len(b) for b, _ in pre_built.values()), default=0)
    engine = Engine(v, 10_000)
    path = router = None
    try:
        path = Path_(mode, engine, workdir, args, 0)
        router = router_cls(workdir, path, shape)
        warm(engine, router, shape, 0)
        res = {"throughput": {}, "lag": None}
        for k, rate in enumerate(rates):
            key = "max" if rate is None else str(int(rate))
            try:
                batches, base = pre_built[key]
                res["throughput"][key] = throughput(engine, router, shape, batches, base, rate,
                                                    args.tail_timeout + max_batches / 500)
            except AssertionError as e:
                res["throughput"][key] = {"error": str(e).splitlines()[0]}
                break  # the router is behind: later rates would measure its backlog
            warm(engine, router, shape, k + 1)
        if args.probes:
            res["lag"] = lag(engine, router, shape, args.probes, args.lag_load)
        if path.sidecar is not None:
            m = path.sidecar.metrics()
            res["sidecar_hwm_drops"] = sum(x for (n, ls), x in m.items()
                                           if n == "kvsidecar_events_dropped_total"
                                           and ("reason", "subscriber_hwm") in ls)
            res["sidecar_replay_batches"] = sum(x for (n, _), x in m.items()
                                                if n == "kvsidecar_events_replay_batches_total")
        return res
    finally:
        if router is not None:
            router.close()
        if path is not None:
            path.close()
        engine.close()


# --- summary ------------------------------------------------------------------


def med(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    return statistics.median(xs) if xs else None


def summarize(runs: dict) -> list[dict]:
    """Rows of medians: (router, measurement, metric) x {sidecar, direct, ratio}."""
    rows = []

    def add(router, what, metric, get, unit):
        vals = {}
        for mode in ("sidecar", "direct"):
            got = []
            for r in runs.get(router, {}).get(mode, []):
                try:
                    got.append(get(r))
                except (KeyError, TypeError):
                    pass
            vals[mode] = med(got)
            vals[mode + "_n"] = len([g for g in got if isinstance(g, (int, float))])
        ratio = (vals["sidecar"] / vals["direct"]) if vals["sidecar"] is not None and vals["direct"] else None
        rows.append({"router": router, "what": what, "metric": metric, "unit": unit, **vals,
                     "ratio": ratio})

    for router, by_mode in runs.items():
        some = next((r for rs in by_mode.values() for r in rs), None)
        if some is None:
            continue
        for key in some.get("live", {}).get("throughput", {}):
            what = f"throughput @ {key} batches/s offered"
            for metric, unit in (("engine_wire_batches_s", "batches/s the engine sent"),
                                 ("events_s", "events/s"), ("blocks_s", "blocks/s"),
                                 ("tail_s", "s"), ("held", "fraction")):
                add(router, what, metric,
                    lambda r, k=key, m=metric: r["live"]["throughput"][k][m], unit)
        if some.get("live", {}).get("lag"):
            for metric in ("p50_ms", "p99_ms"):
                add(router, "index lag", metric, lambda r, m=metric: r["live"]["lag"][m], "ms")
        for key in some.get("late", {}):
            add(router, f"late join, {key} blocks", "recovery_s",
                lambda r, k=key: r["late"][k]["recovery_s"], "s")
            add(router, f"late join, {key} blocks", "held",
                lambda r, k=key: r["late"][k]["held"], "fraction")
    return rows


def fmt(x) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        if abs(x) >= 10:
            return f"{x:.1f}"
        return f"{x:.3f}"
    return str(x)


def table(rows: list[dict]) -> str:
    out = ["| router | measurement | metric | via sidecar | direct | sidecar/direct |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['router']} | {r['what']} | {r['metric']} ({r['unit']}) | "
                   f"{fmt(r['sidecar'])} | {fmt(r['direct'])} | {fmt(r['ratio'])} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--routers", default="dynamo,vllm",
                    help="comma list of dynamo, vllm, smg (default dynamo,vllm)")
    ap.add_argument("--events", type=int, default=16, help="BlockStored events per batch")
    ap.add_argument("--blocks", type=int, default=4, help="16-token blocks per event (one chain)")
    ap.add_argument("--rates", default="1000,4000,max",
                    help="offered batches/s for the throughput runs; max = as fast as vLLM's publisher takes them")
    ap.add_argument("--seconds", type=float, default=3.0, help="publishing time per rate (max: rate 4000 assumed)")
    ap.add_argument("--probes", type=int, default=200, help="lag probes per run (0: no lag measurement)")
    ap.add_argument("--lag-load", type=float, default=0.0,
                    help="background batches/s during the lag probes (default none)")
    ap.add_argument("--late-blocks", default="100000,1000000",
                    help="late-join sizes in blocks (comma list; empty: none)")
    ap.add_argument("--engine-buffer-steps", type=int, default=0,
                    help="vLLM's buffer_steps in the late-join runs (0: sized to hold every batch, as the sidecar's)")
    ap.add_argument("--hwm", type=int, default=100_000,
                    help="events.hwm of the sidecar (default vLLM's PUB hwm, 100000)")
    ap.add_argument("--sidecar-buffer-bytes", default="2GiB")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tail-timeout", type=float, default=60.0)
    ap.add_argument("--late-timeout", type=float, default=300.0)
    ap.add_argument("--workdir", default=None, help="logs go here (default a temp dir, kept)")
    ap.add_argument("--out", required=True, help="JSON results")
    args = ap.parse_args()

    routers = [r for r in args.routers.split(",") if r]
    for r in routers:
        assert r in ROUTERS, f"unknown router {r}"
    rates = [None if x == "max" else float(x) for x in args.rates.split(",") if x]
    lates = [int(x) for x in args.late_blocks.split(",") if x]
    args.late_blocks_max = max(lates, default=0)
    shape = Shape(args.events, args.blocks)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="router-loop-"))
    workdir.mkdir(parents=True, exist_ok=True)
    assert binary_path().exists(), f"no kvsidecar at {binary_path()}"
    v = real_engines.vllm_kv_events()

    # Each rate's batches store chains of their own (base: 2 M chains per
    # rate, above the late-join runs' 0..), so a router cannot show a batch
    # of one rate because it holds another's.
    pre_built = {}
    for k, rate in enumerate(rates):
        key = "max" if rate is None else str(int(rate))
        n = int((rate or 4000) * args.seconds)
        base = (k + 1) * 2_000_000
        pre_built[key] = ([shape.batch_events(v, i, base) for i in range(n)], base)

    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "argv": sys.argv, "binary": str(binary_path()), "events_per_batch": args.events,
            "blocks_per_event": args.blocks, "block_size": BS, "cpus": os.cpu_count(),
            "loadavg_start": Path("/proc/loadavg").read_text().split()[:3]}
    runs: dict = {}
    print(f"workdir {workdir}", file=sys.stderr)
    for name in routers:
        cls = ROUTERS[name]
        runs[name] = {"sidecar": [], "direct": []}
        for rep in range(args.repeats):
            order = ("sidecar", "direct") if rep % 2 == 0 else ("direct", "sidecar")
            for mode in order:
                d = workdir / f"{name}-{mode}-{rep}"
                d.mkdir(exist_ok=True)
                r: dict = {"rep": rep}
                t = now()
                try:
                    if rates or args.probes:
                        r["live"] = live_run(v, mode, cls, shape, d, args, rates, pre_built)
                except AssertionError as e:
                    r["live_error"] = str(e)[:2000]
                r["late"] = {}
                if cls.late_join:
                    for b in lates:
                        try:
                            r["late"][str(b)] = late_join(v, mode, cls, shape, b, d, args)
                        except AssertionError as e:
                            r["late"][str(b)] = {"error": str(e)[:2000]}
                r["wall_s"] = now() - t
                runs[name][mode].append(r)
                print(f"{name} {mode} rep {rep}: {json.dumps(r, default=str)[:1500]}", file=sys.stderr)
                Path(args.out).write_text(json.dumps({"meta": meta, "runs": runs}, indent=1, default=str))
    rows = summarize(runs)
    meta["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    Path(args.out).write_text(json.dumps({"meta": meta, "medians": rows, "runs": runs}, indent=1,
                                         default=str))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
