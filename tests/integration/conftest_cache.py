"""Fixtures for the cache-server integration tests (test_cache_*.py import
them by name; pytest picks fixtures up from a test module's namespace).

- ``cache_server(**overrides)``: a started kvsidecar serving the LMCache MP
  protocol on a fresh port, host backend, stats every 100 ms, events off
  unless ``events=True`` (then a fake engine feeds the ingest side and a
  subscriber is synced to the PUB, so nothing the cache publishes is missed).
  Stopped at teardown with SIGTERM; it must exit 0 within 5 s.
- ``kv_pools(layout, ...)``: host shared-memory KV pools (tests/tools/shm_pool.py),
  unlinked at teardown.

Every wait polls a condition with a deadline; stats and log lines are read
only from after a mark (a byte offset into the log), so a line written
before an action can never satisfy a wait for its effect.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import zmq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tools"))

import shm_pool  # noqa: E402
import vllm_structs as vs  # noqa: E402
from kvsidecar_harness import (FakeEngine, Sidecar, Subscriber, free_port_range,  # noqa: E402
                               parse_stats, sync_rank, wait_until)
from lmcache_client import MPClient  # noqa: E402

CHUNK = 256
STATS_RE = re.compile(r"\s(store|engine_bridge|grpc_bridge|session_router|registry|l2|gpu_transfer(?:\[\w+\])?)#\d+ stats: (.*)$")
SLOTS_RE = re.compile(r"store#\d+ chunk slots of (\d+) KiB: (\d+) slots in L1")

BASE_OVERRIDES: dict[str, Any] = {
    "events.enabled": False,
    "cache.l1_size": "64MiB",
    "gpu.backend": "host",
    "sidecar.stats_interval": "100ms",
}


class CacheServer:
    """A running kvsidecar with its cache endpoint, log and stats helpers."""

    def __init__(self, sidecar: Sidecar, port: int, ctx: zmq.Context):
        self.sidecar = sidecar
        self.port = port
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.ctx = ctx
        self.clients: list[MPClient] = []
        self.engine: FakeEngine | None = None
        self.sub: Subscriber | None = None
        self.events_seen: list[Any] = []

    # -- clients ---------------------------------------------------------------------

    def client(self, identity: bytes | None = None) -> MPClient:
        c = MPClient(self.endpoint, self.ctx, identity)
        self.clients.append(c)
        return c

    # -- log ---------------------------------------------------------------------------

    def mark(self) -> int:
        """A position in the log; lines after it were written after this call."""
        try:
            return self.sidecar.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def lines_since(self, mark: int = 0) -> list[str]:
        with open(self.sidecar.log_path, "rb") as f:
            f.seek(mark)
            data = f.read()
        # A line still being written has no newline yet: leave it for later.
        text = data.decode(errors="replace")
        return text.split("\n")[:-1]

    def find(self, pattern: str, mark: int = 0) -> list[re.Match]:
        rx = re.compile(pattern)
        return [m for m in (rx.search(l) for l in self.lines_since(mark)) if m]

    def wait_log(self, pattern: str, mark: int = 0, timeout: float = 5.0) -> re.Match:
        def found():
            ms = self.find(pattern, mark)
            return ms[-1] if ms else None
        try:
            return wait_until(found, timeout, f"log line /{pattern}/")
        except AssertionError as e:
            raise AssertionError(f"{e}\nlog tail:\n{self.tail()}") from None

    def tail(self, n: int = 40) -> str:
        lines = [l for l in self.lines_since(0) if " stats: " not in l]
        return "\n".join(lines[-n:])

    # -- stats ---------------------------------------------------------------------------

    def stats(self, actor: str = "store", mark: int = 0) -> dict[str, Any] | None:
        """The latest stats line of `actor` written after `mark`, parsed."""
        last = None
        for line in self.lines_since(mark):
            m = STATS_RE.search(line)
            if m and m.group(1).split("[")[0] == actor:
                last = m.group(2)
        return parse_stats(last) if last is not None else None

    def wait_stats(self, cond: Callable[[dict], bool], actor: str = "store", mark: int | None = None,
                   timeout: float = 5.0, what: str = "") -> dict[str, Any]:
        """Polls until the latest `actor` stats line after `mark` (default: now)
        satisfies cond; returns it."""
        if mark is None:
            mark = self.mark()

        def ok():
            s = self.stats(actor, mark)
            return s if s is not None and cond(s) else None
        try:
            return wait_until(ok, timeout, f"{actor} stats {what}", interval=0.02)
        except AssertionError as e:
            raise AssertionError(f"{e}; latest: {self.stats(actor, mark)}\n{self.tail()}") from None

    def wait_locks(self, n: int, timeout: float = 5.0, mark: int | None = None) -> dict[str, Any]:
        return self.wait_stats(lambda s: s["locks"] == n, mark=mark, timeout=timeout,
                               what=f"locks={n}")

    def wait_idle(self, timeout: float = 5.0, mark: int | None = None) -> None:
        """No read lock, no ledger session, no session actor left."""
        self.wait_stats(lambda s: s["locks"] == 0 and s["locked_chunks"] == 0
                        and s["sessions"] == 0 and s["reserved"] == 0,
                        mark=mark, timeout=timeout, what="locks=0 sessions=0 reserved=0")
        self.wait_stats(lambda s: s["sessions"] == 0, actor="session_router", mark=mark,
                        timeout=timeout, what="sessions=0")

    def slot_count(self) -> int:
        m = self.wait_log(SLOTS_RE.pattern)
        return int(m.group(2))

    # -- events --------------------------------------------------------------------------

    def events(self, n: int, timeout: float = 5.0, kind: type | None = None) -> list[Any]:
        """Receives until at least n events (of `kind`, if given) were seen
        since the last call; returns them (others are kept for later)."""
        assert self.sub is not None, "cache_server(events=True) needed"

        def have():
            return [e for e in self.events_seen if kind is None or isinstance(e, kind)]
        deadline = time.monotonic() + timeout
        while len(have()) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{len(have())} of {n} events within {timeout}s: {have()}")
            m = self.sub.recv(0, min(left, 0.1))
            if m is not None:
                self.events_seen.extend(vs.decoder.decode(m.payload).events)
        got = have()
        self.events_seen = [e for e in self.events_seen if e not in got]
        return got

    def assert_no_events(self, for_s: float = 0.3) -> None:
        assert self.sub is not None
        m = self.sub.recv(0, for_s)
        assert m is None, f"unexpected events {vs.decoder.decode(m.payload).events}"
        assert not self.events_seen, f"unexpected events {self.events_seen}"

    # -- teardown ------------------------------------------------------------------------

    def close(self) -> None:
        for c in self.clients:
            c.close()
        try:
            if self.sidecar.running():
                self.sidecar.stop(timeout=5.0)
        finally:
            self.sidecar.kill()
            if self.sub is not None:
                self.sub.close()
            if self.engine is not None:
                self.engine.close()


@pytest.fixture
def cache_server(tmp_path):
    """Factory: cache_server(events=False, **{"cache.x": v}) -> a started
    CacheServer. Overrides are `--set` keys (dotted)."""
    made: list[CacheServer] = []
    ctx = zmq.Context()

    def make(events: bool = False, overrides: dict[str, Any] | None = None) -> CacheServer:
        port = free_port_range(1)
        o = dict(BASE_OVERRIDES)
        o["cache.endpoint"] = f"tcp://127.0.0.1:{port}"
        ingest = pub = None
        if events:
            ingest, pub = free_port_range(1), free_port_range(1)
            o.update({
                "events.enabled": True,
                "events.ingest_endpoint": f"tcp://127.0.0.1:{ingest}",
                "events.endpoint": f"tcp://*:{pub}",  # bound (a host name would connect)
                "events.replay_endpoint": "",
            })
        o.update(overrides or {})
        sc = Sidecar(tmp_path / f"cache{len(made)}", o, name=f"kvsidecar{len(made)}")
        srv = CacheServer(sc, port, ctx)
        made.append(srv)
        if events:
            srv.engine = FakeEngine(ctx, ingest)
        sc.start()
        if o.get("cache.enabled", True) and o.get("cache.l1_prefault", "background") in ("ahead", "background"):
            # The start-up fault-in (all of a test's small L1, or the first
            # window) is over before a test measures memory or threads.
            sc.wait_l1_resident()
        if events:
            srv.sub = Subscriber(ctx, pub)
            sync_rank(srv.engine, srv.sub, 0)
        return srv

    yield make
    errors = []
    for srv in made:
        try:
            srv.close()
        except AssertionError as e:
            errors.append(str(e))
    ctx.destroy(linger=0)
    assert not errors, "\n".join(errors)


@pytest.fixture
def kv_pools():
    """Factory: kv_pools("sglang"|"vllm", num_blocks=160, seed=None) -> filled
    KVPools (2 layers, 16-token pages, 2 heads x 16 dims, bfloat16: 64 KiB
    per 256-token chunk)."""
    made = []

    def make(layout: str = "sglang", num_blocks: int = 160, seed: int | None = 1,
             num_layers: int = 2, block_size: int = 16, heads: int = 2, head_dim: int = 16):
        if layout == "sglang":
            p = shm_pool.sglang_mha_pools(num_layers, num_blocks, block_size, heads, head_dim,
                                          prefix="kvs_ct")
        elif layout == "vllm":
            p = shm_pool.vllm_flash_attn_pools(num_layers, num_blocks, block_size, heads, head_dim,
                                               prefix="kvs_ct")
        else:
            raise ValueError(layout)
        made.append(p)
        if seed is not None:
            p.fill(seed)
        return p

    yield make
    for p in made:
        p.close()


# --- data helpers ----------------------------------------------------------------------


def tokens(n_chunks: int, salt: int = 0, chunk: int = CHUNK) -> list[int]:
    """Deterministic token ids, distinct per salt from the first token on."""
    return [(salt * 1_000_003 + i * 7919) % 150_000 for i in range(n_chunks * chunk)]


def pages_equal(dst_pools, dst_blocks: list[int], src_pools, src_blocks: list[int]) -> list[str]:
    """Mismatches (kv, layer, page) between destination and source pages."""
    bad = []
    for kv in range(2):
        for layer in range(src_pools.num_layers):
            for d, s in zip(dst_blocks, src_blocks):
                if dst_pools.page(kv, layer, d) != src_pools.page(kv, layer, s):
                    bad.append(f"kv={kv} layer={layer} dst={d} src={s}")
    return bad


def snapshot_pages(pools, blocks: list[int]) -> dict:
    return {(kv, l, b): pools.page(kv, l, b) for kv in range(2)
            for l in range(pools.num_layers) for b in blocks}


def changed_pages(pools, snap: dict) -> list:
    return [k for k, v in snap.items() if pools.page(*k) != v]
