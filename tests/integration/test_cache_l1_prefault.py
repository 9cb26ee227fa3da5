"""cache.l1_prefault: when the L1 pool's pages are faulted in.

"background" (the default): the l1_prefault actor faults the whole pool in
after start, at nice 19, logs `L1 faulted in: N MiB in S s`, and the
process's RSS then covers L1 while the cache serves: a prompt stored after
the prefault comes back byte for byte.
"ahead": the l1_prefault actor keeps cache.l1_prefault_ahead bytes past the
highest slot handed out resident — that much right after start, and the
window follows the stores, so RSS grows with use and stays below l1_size
while the cache is not full of it.
"start": the pool is resident before the sidecar says ready. "off": RSS
stays far below l1_size.

Run: KVSIDECAR_BIN=<build>/kvsidecar python3 -m pytest -q tests/integration/test_cache_l1_prefault.py
"""

from __future__ import annotations

import signal

import pytest

pytest.register_assert_rewrite("conftest_cache", "lmcache_client")

from conftest_cache import CHUNK, pages_equal, tokens
from kvsidecar_harness import wait_until
from lmcache_client import SeedFlow

pytest_plugins = ["conftest_cache"]  # the cache_server and kv_pools fixtures

MODEL = "test-org/test-model"
L1_MIB = 256


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def rss_anon_mib(pid: int) -> float:
    """Private memory only: the engine's shared-memory pools the sidecar maps
    (RssShmem) are not L1."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon")


def engine(srv, kv_pools, **pool_kw) -> SeedFlow:
    f = SeedFlow(srv.client(), kv_pools(seed=5, **pool_kw), MODEL, instance_id=1,
                 engine="sglang", wrapper_kind="host_shm")
    assert f.register() is None
    return f


def store_and_fetch(f: SeedFlow, salt: int) -> None:
    """STORE a 2-chunk prompt, then LOOKUP + RETRIEVE it into other pages."""
    toks = tokens(2, salt=salt)
    n = 2 * CHUNK // f.pools.block_size
    blocks = list(range((salt - 1) * 2 * n, (salt - 1) * 2 * n + n))  # salt 1, 2: 4n <= 160 blocks
    back = [b + n for b in blocks]
    assert f.lookup_kv(toks, f"s{salt}") == 0
    assert f.store_kv(toks, f"s{salt}", blocks) is True
    f.end_session(f"s{salt}")
    f.drain()
    assert f.lookup_kv(toks, f"r{salt}") == 2 * CHUNK
    assert f.retrieve_kv(f"r{salt}", back) == 2 * CHUNK
    assert not pages_equal(f.pools, back, f.pools, blocks)
    f.end_session(f"r{salt}")
    f.drain()


def test_ahead_keeps_a_window_resident_that_follows_the_stores(cache_server, kv_pools):
    off = cache_server(overrides={"cache.l1_size": f"{L1_MIB}MiB", "cache.l1_prefault": "off"})
    base = rss_anon_mib(off.sidecar.proc.pid)  # the process without L1
    off.sidecar.stop(signal.SIGTERM, timeout=5.0, expect=0)
    srv = cache_server(overrides={"cache.l1_size": f"{L1_MIB}MiB", "cache.l1_prefault": "ahead",
                                  "cache.l1_prefault_ahead": "64MiB"})
    pid = srv.sidecar.proc.pid
    srv.sidecar.wait_log(r"l1_prefault#\d+ L1 resident ahead of use: 64 MiB in [\d.]+ s",
                         timeout=30)
    first = rss_anon_mib(pid) - base
    assert 56 <= first <= 128, (first, srv.sidecar.tail())
    # 8 layers x 4 heads x 64 x bf16, K and V: 2 MiB a chunk; 6 prompts of
    # 8 chunks from the same pages, each its own tokens: 96 MiB of slots.
    f = engine(srv, kv_pools, num_blocks=256, num_layers=8, heads=4, head_dim=64)
    blocks = list(range(8 * CHUNK // f.pools.block_size))
    for salt in range(1, 7):
        toks = tokens(8, salt=salt)
        assert f.lookup_kv(toks, f"s{salt}") == 0
        assert f.store_kv(toks, f"s{salt}", blocks) is True
        f.end_session(f"s{salt}")
    f.drain()
    # The window moved with the high water (96 MiB): ~160 MiB resident, not
    # all of L1, and the store's pages are the ones it wrote.
    # (nice 19: on a loaded machine it gets little CPU, hence the long deadline)
    wait_until(lambda: rss_anon_mib(pid) - base >= 150, 90, "the window followed the stores")
    assert rss_anon_mib(pid) - base <= 0.85 * L1_MIB, srv.sidecar.tail()
    assert not srv.sidecar.find(r"L1 faulted in")
    toks = tokens(8, salt=3)
    back = list(range(len(blocks), 2 * len(blocks)))
    assert f.lookup_kv(toks, "r3") == 8 * CHUNK
    assert f.retrieve_kv("r3", back) == 8 * CHUNK
    assert not pages_equal(f.pools, back, f.pools, blocks)
    f.end_session("r3")
    f.drain()
    srv.sidecar.stop(signal.SIGTERM, timeout=5.0, expect=0)


def test_background_prefault_makes_l1_resident_while_serving(cache_server, kv_pools):
    srv = cache_server(overrides={"cache.l1_size": f"{L1_MIB}MiB"})  # the default
    pid = srv.sidecar.proc.pid
    f = engine(srv, kv_pools)
    store_and_fetch(f, salt=1)  # served while (or after) the pages fault in
    m = srv.sidecar.wait_log(r"l1_prefault#\d+ L1 faulted in: (\d+) MiB in [\d.]+ s", timeout=30)
    assert int(m.group(1)) == L1_MIB
    assert rss_mib(pid) >= L1_MIB * 0.95, srv.sidecar.tail()
    store_and_fetch(f, salt=2)
    srv.sidecar.stop(signal.SIGTERM, timeout=5.0, expect=0)


def test_start_prefault_is_resident_when_ready_and_off_is_not(cache_server):
    on = cache_server(overrides={"cache.l1_size": f"{L1_MIB}MiB", "cache.l1_prefault": "start"})
    on_rss = rss_mib(on.sidecar.proc.pid)
    assert on_rss >= L1_MIB * 0.95
    off = cache_server(overrides={"cache.l1_size": f"{L1_MIB}MiB", "cache.l1_prefault": "off"})
    # Relative to "start": the rest of the process (much larger under ASan)
    # is the same in both.
    off_rss = rss_mib(off.sidecar.proc.pid)
    assert on_rss - off_rss >= L1_MIB * 0.75, (on_rss, off_rss)
    assert not off.sidecar.find(r"l1_prefault#")
