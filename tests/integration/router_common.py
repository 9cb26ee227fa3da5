"""Shared pieces of the router interop tests (test_router_vllm_router.py,
test_router_smg.py): vLLM 0.33's own ZmqEventPublisher as the engine, one
kvsidecar per engine, the router as a subprocess of its released PyPI
package, and polls with deadlines.

An EngineSide is what sits behind one worker in production: the engine's
publisher and the kvsidecar relaying it. The router is pointed at the
sidecar's PUB and replay ROUTER exactly where it would be pointed at the
engine's.
"""

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

import msgspec
import zmq

import real_engines
from kvsidecar_harness import EventsRig, free_port_range, parse_metrics, wait_until

BS = 16
# Deadlines are generous: the suite runs on a loaded 2-core CI machine with a
# Rust router, two sidecars and the Python engines side by side.
DEADLINE = 30.0

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def vllm():
    """vllm/distributed/kv_events.py from the vLLM 0.33.0 wheel."""
    return real_engines.vllm_kv_events()


def tokens(first: int, n_blocks: int) -> list[int]:
    return list(range(first, first + n_blocks * BS))


def stored(v, toks: list[int], first_hash: int, parent: int | None = None):
    """One BlockStored of len(toks)/BS blocks with hashes first_hash, +1, ..."""
    n = len(toks) // BS
    return v.BlockStored(block_hashes=list(range(first_hash, first_hash + n)),
                         parent_block_hash=parent, token_ids=list(toks), block_size=BS,
                         lora_id=None, medium="GPU", lora_name=None)


def removed(v, hashes: list[int]):
    return v.BlockRemoved(block_hashes=list(hashes), medium="GPU")


def cleared(v):
    return v.AllBlocksCleared()


class EngineSide:
    """vLLM's publisher -> kvsidecar, for one worker. `rig.sub` is our own
    subscriber on the sidecar's PUB (to learn the seq a batch got)."""

    def __init__(self, rig_factory, overrides: dict[str, Any] | None = None,
                 join: bool = False):
        self.v = vllm()
        self._ts = 0
        o = dict(overrides or {})
        # events.join_endpoint: the rank's state first, then live (for a
        # router that only replays on a gap, smg's relay).
        self.join_port = free_port_range(1) if join else None
        if join:
            o["events.join_endpoint"] = f"tcp://*:{self.join_port}"
        self.rig: EventsRig = rig_factory(engine=False, start=False, overrides=o)
        self.pub = self._new_publisher()
        self.rig.start(sync=False)
        # Until the sidecar's SUB has joined the engine's PUB (slow joiner):
        # then every later batch reaches it.
        self.publish_until(lambda: self._drain_one(0.0), "the sidecar's first batch")

    @property
    def pub_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.rig.pub_port}"

    @property
    def join_endpoint(self) -> str:
        assert self.join_port is not None, "EngineSide(join=True) has a join endpoint"
        return f"tcp://127.0.0.1:{self.join_port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.rig.replay_port}"

    def _new_publisher(self):
        port = self.rig.ingest_port

        def make():
            try:
                return self.v.ZmqEventPublisher(0, endpoint=f"tcp://*:{port}")
            except zmq.ZMQError as e:
                if e.errno != zmq.EADDRINUSE:
                    raise
                return None
        return wait_until(make, DEADLINE, f"port {port} free for the engine", interval=0.05)

    def _drain_one(self, timeout: float):
        return self.rig.sub.recv(0, timeout)

    def publish(self, *events) -> int:
        """Publishes one batch; returns the seq the sidecar gave it (read
        back on our own subscriber by the batch's unique ts)."""
        self.drain()
        self._ts += 1
        ts = float(self._ts)
        self.pub.publish(self.v.KVEventBatch(ts=ts, events=list(events)))
        deadline = time.monotonic() + DEADLINE
        while True:
            m = self._drain_one(0.2)
            if m is not None and msgspec.msgpack.decode(m.payload)[0] == ts:
                return m.seq
            assert time.monotonic() < deadline, \
                f"the sidecar never relayed the engine's batch:\n{self.rig.sidecar.tail()}"

    def publish_raw(self, *events) -> None:
        """Publishes without waiting for the sidecar (bursts)."""
        self.pub.publish(self.v.KVEventBatch(ts=time.time(), events=list(events)))

    def drain(self) -> None:
        while self._drain_one(0.0) is not None:
            pass

    def publish_until(self, cond: Callable[[], Any], what: str, timeout: float = DEADLINE,
                      interval: float = 0.1) -> Any:
        """Publishes empty batches (each one a new seq: a router that missed
        something sees the gap on the next one) until cond() holds."""
        deadline = time.monotonic() + timeout
        while True:
            got = cond()
            if got:
                return got
            assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
            self.publish_raw()
            time.sleep(interval)

    def restart_engine(self) -> None:
        """The engine dies and a new one starts on the same port: seq from 0,
        none of the old cache (no BlockRemoved for it ever comes)."""
        self.pub.shutdown()
        self.pub = self._new_publisher()
        # The sidecar's SUB re-joins the new PUB: until a batch of the new
        # engine comes through (what the old one sent is drained first).
        self.drain()
        self.publish_until(lambda: self._drain_one(0.0), "the sidecar to relay the new engine")

    def metric(self, name: str, **labels) -> float:
        want = {(k, str(v)) for k, v in labels.items()}
        return sum(v for (n, ls), v in self.rig.sidecar.metrics().items()
                   if n == name and want <= set(ls))

    def close(self) -> None:
        try:
            self.pub.shutdown()
        except Exception:  # noqa: BLE001 - already shut down
            pass


class Proc:
    """A router or worker subprocess with its output in a log file."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None):
        self.log_path = log_path
        self._log = open(log_path, "ab")
        e = dict(os.environ)
        e.update(env or {})
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, env=e)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def text(self) -> str:
        return _ANSI.sub("", self.log_path.read_text(errors="replace"))

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.text().splitlines()[-n:])

    def stop_process(self) -> None:
        """SIGSTOP: the process (all its threads, its sockets' readers)
        freezes; the kernel buffers what it can, then the sidecar's PUB
        drops for it."""
        self.proc.send_signal(signal.SIGSTOP)

    def cont(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def http_json(url: str, body: bytes | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def scrape(port: int) -> dict[tuple[str, frozenset], float] | None:
    """A router's Prometheus endpoint, parsed; None while it is not up."""
    try:
        code, body = http_json(f"http://127.0.0.1:{port}/metrics", timeout=5)
    except OSError:
        return None
    if code != 200:
        return None
    return parse_metrics(body.decode())


def metric(samples: dict[tuple[str, frozenset], float] | None, name: str, **labels) -> float:
    """Sum of the samples of `name` whose labels include `labels` (0 when none)."""
    if samples is None:
        return 0.0
    want = {(k, str(v)) for k, v in labels.items()}
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def python_module(module: str) -> list[str]:
    """argv running an installed package's entry module with this interpreter."""
    return [sys.executable, "-m", module]


def churn_batch(v, k: int, n_blocks: int = 256):
    """A big batch that leaves the engine's state unchanged (stores a chain
    of n_blocks and removes it again): ~20 KB, used to overrun what a
    stalled router's kernel buffers can hold."""
    first_hash = 10_000_000 + k * n_blocks
    toks = [100_000 + (k * 7 + i) % 1_000_000 for i in range(n_blocks * BS)]
    ev = stored(v, toks, first_hash)
    return [ev, removed(v, list(range(first_hash, first_hash + n_blocks)))]


def overrun_stalled_router(side: EngineSide, what: str, max_batches: int = 3000) -> int:
    """Publishes state-neutral big batches until the sidecar counts a
    high-water-mark drop for the stalled router (its PUB could not hand it
    the batches: the router will see a gap). Returns the batches sent.

    The sidecar counts drops per PUB, not per subscriber: our own
    subscriber (rig.sub) unsubscribes for the burst, so that the stalled
    router is the only peer the sidecar sends to and the drop is its."""
    sock = side.rig.sub.socks[0]
    sock.setsockopt(zmq.UNSUBSCRIBE, b"")
    side.drain()
    try:
        base = side.metric("kvsidecar_events_dropped_total", reason="subscriber_hwm")
        dropped = lambda: side.metric("kvsidecar_events_dropped_total",  # noqa: E731
                                      reason="subscriber_hwm") > base
        sent = max_batches
        for k in range(max_batches):
            side.publish_raw(*churn_batch(side.v, k))
            if k % 20 == 19:
                # The sidecar relays asynchronously: let it catch up before reading its counter.
                time.sleep(0.02)
                if dropped():
                    sent = k + 1
                    break
        wait_until(dropped, DEADLINE, f"the sidecar to drop batches for {what}")
        return sent
    finally:
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        side.drain()
        # Until our subscription is back in force at the sidecar's PUB.
        side.publish_until(lambda: side._drain_one(0.0), "our subscriber to rejoin the sidecar")


def stall_until_gap(side: EngineSide, proc, what: str, converged: Callable[[int, int], None],
                    gapped: Callable[[], bool], first: int = 5000, attempts: int = 3) -> list[int]:
    """A stalled router misses the changes that matter and must repair them
    from the sidecar's replay. Each attempt k: freeze `proc` (SIGSTOP),
    overrun it (overrun_stalled_router), publish "A's chain gone, a new one
    stored" while it is frozen (k == 0 removes hashes 1..4 and stores
    tokens(first, 3) at 201; attempt k removes what k-1 stored and stores
    tokens(first, 3 + k) at 201 + 100k, so each attempt's end state differs
    in its block count), resume it, `converged(k, last_seq)` waits until it
    applied the attempt's last batch; stops once `gapped()` says it replayed.
    Returns the hashes the router's worker holds at the end.

    Why attempts: the sidecar counts high-water-mark drops per PUB, not per
    subscriber, so on a loaded machine the drop that ends a burst can be a
    transient one of another pipe (our own subscriber's, before its
    UNSUBSCRIBE reaches the sidecar) while the frozen router's buffers still
    held everything. Then the router sees no gap: the attempt proved
    nothing, and another, longer stall is made. A sidecar that failed to
    repair a gap fails `converged` (the router ends with the wrong state)."""
    held = [1, 2, 3, 4]
    for k in range(attempts):
        n = 3 + k
        new = list(range(201 + 100 * k, 201 + 100 * k + n))
        proc.stop_process()
        try:
            overrun_stalled_router(side, what, max_batches=3000 * (k + 1))
            side.publish_raw(removed(side.v, held))
            side.publish_raw(stored(side.v, tokens(first, n), new[0]))
            last = side.publish()
        finally:
            proc.cont()
        held = new
        converged(k, last)
        if gapped():
            return held
    raise AssertionError(f"{what}: {attempts} stalls, and the router caught up without "
                         "replaying each time: no stall made a gap")
