"""The L2 tiers behind the cache server, with real components on loopback:
a 3-master Redis Cluster made of Debian's redis-server (started here with
`redis-cli --cluster create`), two kvsidecars sharing it, and the disk tier
in a temporary directory.

What is checked: a prompt stored through sidecar A is a prefetch hit on
sidecar B and RETRIEVE lands the same bytes in B's pages; a sidecar
restarted on the same l2.disk.path still hits its chunks; a Redis master
killed mid-run turns its chunks into misses while every engine request is
still answered; a small l2.disk.size evicts LRU files and says so in
BlockRemoved events with medium "DISK"; a hostile or broken Redis (a fake
server answering garbage, an oversize bulk length, closing mid-reply or
never answering) is a miss, the sidecar logs what was wrong and keeps
answering.

Run: KVSIDECAR_BIN=<build>/kvsidecar python3 -m pytest -q tests/integration/test_cache_l2.py
"""

from __future__ import annotations

import random
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

pytest.register_assert_rewrite("conftest_cache", "lmcache_client")

import vllm_structs as vs
from conftest_cache import BASE_OVERRIDES, CHUNK, pages_equal, tokens
from kvsidecar_harness import Sidecar, free_port_range, wait_until
from lmcache_client import SeedFlow

pytest_plugins = ["conftest_cache"]  # the cache_server and kv_pools fixtures

MODEL = "test-org/test-model"
PAGE = 16
PAGES_PER_CHUNK = CHUNK // PAGE
CHUNK_BYTES = 64 * 1024  # kv_pools' default layout: 64 KiB per chunk

needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None
                                 or shutil.which("redis-cli") is None,
                                 reason="redis-server / redis-cli not installed")


def blocks(first: int, n_chunks: int) -> list[int]:
    return list(range(first, first + n_chunks * PAGES_PER_CHUNK))


def port_free(p: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", p))
            return True
        except OSError:
            return False


def cluster_ports(n: int) -> list[int]:
    """Ports below 55535 whose cluster bus port (+10000) is free too."""
    out: list[int] = []
    while len(out) < n:
        p = random.randint(20000, 45000)
        if p not in out and port_free(p) and port_free(p + 10000):
            out.append(p)
    return out


class RedisCluster:
    def __init__(self, workdir: Path, masters: int = 3):
        self.procs: dict[int, subprocess.Popen] = {}
        self.ports = cluster_ports(masters)
        for p in self.ports:
            d = workdir / f"redis{p}"
            d.mkdir(parents=True)
            self.procs[p] = subprocess.Popen(
                ["redis-server", "--port", str(p), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", str(d), "--logfile", str(d / "log"),
                 "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                 "--cluster-node-timeout", "1000",
                 # One dead master loses only its own slots (kvsidecar's recommendation).
                 "--cluster-require-full-coverage", "no"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for p in self.ports:
            wait_until(lambda p=p: self.cli(p, "PING") == "PONG", 10, f"redis {p} up")
        subprocess.run(["redis-cli", "--cluster", "create",
                        *[f"127.0.0.1:{p}" for p in self.ports], "--cluster-yes"],
                       check=True, timeout=30, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: all("cluster_state:ok" in self.cli(p, "CLUSTER", "INFO")
                               for p in self.ports), 20, "cluster_state:ok")

    def cli(self, port: int, *args: str) -> str:
        r = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True,
                           text=True, timeout=5)
        return r.stdout.strip()

    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports]

    def dbsize(self, port: int) -> int:
        return int(self.cli(port, "DBSIZE") or 0)

    def kill(self, port: int) -> None:
        proc = self.procs.pop(port)
        proc.kill()
        proc.wait(timeout=5)

    def close(self) -> None:
        for p in list(self.procs):
            self.kill(p)


@pytest.fixture
def redis_cluster(tmp_path):
    cl = RedisCluster(tmp_path / "redis")
    yield cl
    cl.close()


def redis_overrides(cl: RedisCluster) -> dict:
    return {"l2.redis.enabled": True, "l2.redis.cluster": True,
            "l2.redis.endpoints": cl.endpoints()[:1],  # one seed: the rest is discovered
            "l2.redis.timeout": "300ms"}


def flow_for(srv, pools, instance: int) -> SeedFlow:
    f = SeedFlow(srv.client(), pools, MODEL, instance_id=instance, engine="sglang",
                 wrapper_kind="host_shm")
    assert f.register() is None
    return f


def written(srv, n: int, timeout: float = 10.0) -> dict:
    """Waits until the L2 actor has written n chunks in all."""
    return srv.wait_stats(lambda s: s["written"] >= n, actor="l2", timeout=timeout,
                          what=f"written>={n}")


def store_through(srv, f: SeedFlow, toks: list[int], rid: str, first_block: int = 0) -> None:
    """STORE a whole prompt, end its session, wait until L2 has written it."""
    n = len(toks) // CHUNK
    assert f.store_kv(toks, rid, blocks(first_block, n)) is True
    f.end_session(rid)
    f.drain()
    written(srv, n)


@needs_redis
def test_prompt_stored_on_a_is_a_prefetch_hit_on_b(cache_server, kv_pools, redis_cluster):
    a = cache_server(overrides=redis_overrides(redis_cluster))
    b = cache_server(overrides=redis_overrides(redis_cluster))
    pools_a, pools_b = kv_pools(seed=1), kv_pools(seed=2)
    fa, fb = flow_for(a, pools_a, 1), flow_for(b, pools_b, 2)
    toks = tokens(4, salt=11)
    assert fa.lookup_kv(toks, "a-1") == 0
    assert fa.store_kv(toks, "a-1", blocks(0, 4)) is True
    fa.end_session("a-1")
    written(a, 4)
    # The four objects are spread over the cluster's masters.
    assert sum(redis_cluster.dbsize(p) for p in redis_cluster.ports) == 4
    # B has never seen the prompt: L1 misses, L2 hits all four chunks.
    assert fb.lookup_kv(toks, "b-1") == 4 * CHUNK
    b.wait_stats(lambda s: s["chunks"] == 4 and s["locks"] == 4, what="4 loaded, locked")
    assert fb.retrieve_kv("b-1", blocks(80, 4)) == 4 * CHUNK
    assert not pages_equal(pools_b, blocks(80, 4), pools_a, blocks(0, 4))
    fb.end_session("b-1")
    fb.drain()
    fa.drain()
    b.wait_idle()
    # A longer prompt with the same first chunks: B serves those from L1 now,
    # the new tail is a miss everywhere.
    longer = toks + tokens(2, salt=12)
    assert fb.lookup_kv(longer, "b-2") == 4 * CHUNK
    fb.end_session("b-2")
    fb.drain()
    b.wait_stats(lambda s: s["fetched_redis"] == 4, actor="l2", what="fetched_redis=4")


def test_disk_tier_survives_a_restart(cache_server, kv_pools, tmp_path):
    path = tmp_path / "l2disk"
    o = {"l2.disk.enabled": True, "l2.disk.path": str(path), "l2.disk.size": "16MiB"}
    first = cache_server(overrides=o)
    pools = kv_pools(seed=3)
    f = flow_for(first, pools, 1)
    toks = tokens(3, salt=21)
    assert f.lookup_kv(toks, "r-1") == 0
    store_through(first, f, toks, "r-1")
    assert len(list(path.glob("*.kvl2"))) == 3
    first.close()
    # A new process on the same directory: the index is rebuilt from it.
    second = cache_server(overrides=o)
    second.wait_log(r"l2#\d+ started: disk .* \(16 MiB, 3 chunks found\)")
    pools2 = kv_pools(seed=4)
    f2 = flow_for(second, pools2, 2)
    assert f2.lookup_kv(toks, "r-2") == 3 * CHUNK
    assert f2.retrieve_kv("r-2", blocks(40, 3)) == 3 * CHUNK
    assert not pages_equal(pools2, blocks(40, 3), pools, blocks(0, 3))
    f2.end_session("r-2")
    f2.drain()
    second.wait_idle()
    assert second.stats("l2")["fetched_disk"] == 3


def test_small_disk_evicts_lru_and_announces_disk_medium(cache_server, kv_pools, tmp_path):
    path = tmp_path / "l2small"
    # Room for 16 objects (64 KiB + a 64-byte header each), not 17
    # (l2.disk.size is at least 1 MiB).
    size = 16 * (CHUNK_BYTES + 64) + 100
    srv = cache_server(events=True, overrides={"l2.disk.enabled": True,
                                               "l2.disk.path": str(path),
                                               "l2.disk.size": str(size)})
    pools = kv_pools(seed=5, num_blocks=18 * PAGES_PER_CHUNK)
    f = flow_for(srv, pools, 1)
    toks = tokens(18, salt=31)
    store_through(srv, f, toks, "s-1")
    stored = srv.events(36, kind=vs.BlockStored)
    by_medium: dict[str, list[int]] = {}
    for e in stored:
        by_medium.setdefault(e.medium, []).extend(e.block_hashes)
    assert len(by_medium["CPU"]) == 18
    assert by_medium["DISK"] == by_medium["CPU"]  # each chunk once on disk, in order
    removed = srv.events(1, kind=vs.BlockRemoved)
    disk_removed = [h for e in removed if e.medium == "DISK" for h in e.block_hashes]
    assert disk_removed == by_medium["DISK"][:2]  # the two least recently written
    assert len(list(path.glob("*.kvl2"))) == 16
    st = srv.wait_stats(lambda s: "disk_objects" in s, actor="l2", what="the disk's figures")
    assert (st["disk_objects"], st["disk_evictions"]) == (16, 2), st


def stored_by_medium(events) -> dict[str, list[tuple]]:
    """BlockStored events per medium: (hash, parent, tokens) in order."""
    out: dict[str, list[tuple]] = {}
    for e in events:
        if isinstance(e, vs.BlockStored):
            for h in e.block_hashes:
                out.setdefault(e.medium, []).append((h, e.parent_block_hash, tuple(e.token_ids)))
    return out


def all_blocks_cleared(srv) -> list:
    """The engine publishes AllBlocksCleared (reset_prefix_cache); returns
    the clear as the routers got it."""
    srv.engine.send(0, vs.encoder.encode(vs.KVEventBatch(ts=time.time(),
                                                          events=[vs.AllBlocksCleared()])))
    return srv.events(1, kind=vs.AllBlocksCleared)


def test_disk_chunks_are_announced_again_after_an_all_blocks_cleared(cache_server, kv_pools,
                                                                     tmp_path):
    """A router drops every block of the rank on AllBlocksCleared, the
    sidecar's DISK chunks with them, though the disk still serves them: the
    L2 actor announces them again (same hashes, parents, tokens, oldest
    first) beside L1's CPU ones; a chunk the disk evicted is not."""
    size = 16 * (CHUNK_BYTES + 64) + 100  # room for 16 objects (l2.disk.size >= 1 MiB)
    srv = cache_server(events=True, overrides={"l2.disk.enabled": True,
                                               "l2.disk.path": str(tmp_path / "d"),
                                               "l2.disk.size": str(size)})
    pools = kv_pools(seed=41, num_blocks=17 * PAGES_PER_CHUNK)
    f = flow_for(srv, pools, 1)
    toks = tokens(17, salt=41)
    store_through(srv, f, toks, "c-1")
    first = stored_by_medium(srv.events(34, kind=vs.BlockStored))
    assert len(first["CPU"]) == 17 and first["DISK"] == first["CPU"]
    gone = [h for e in srv.events(1, kind=vs.BlockRemoved) if e.medium == "DISK"
            for h in e.block_hashes]
    assert gone == [first["DISK"][0][0]]  # the disk holds the last 16
    srv.events_seen.clear()

    all_blocks_cleared(srv)
    again = stored_by_medium(srv.events(16 + 17, kind=vs.BlockStored))
    assert again["DISK"] == first["DISK"][1:], again
    assert again["CPU"] == first["CPU"]
    st = srv.wait_stats(lambda s: s["reannounced"] == 16, actor="l2", what="reannounced=16")
    assert st["remembered"] == 16 and st["forgotten"] == 0, st
    srv.wait_log(r"l2#\d+ AllBlocksCleared on the events rank: 16 chunks of L2 announced again "
                 r"\(16 DISK\)")
    srv.assert_no_events()


def test_a_flood_of_clears_ends_with_l2_announced_after_the_last(cache_server, kv_pools,
                                                                 tmp_path):
    """An engine resetting in a loop: clears that queue up at the L2 actor
    share one round (one Redis EXISTS round, not one per clear), and the
    routers still end with every chunk the disk holds announced after the
    last AllBlocksCleared."""
    srv = cache_server(events=True, overrides={"l2.disk.enabled": True,
                                               "l2.disk.path": str(tmp_path / "d"),
                                               "l2.disk.size": "16MiB"})
    pools = kv_pools(seed=43)
    f = flow_for(srv, pools, 1)
    store_through(srv, f, tokens(3, salt=43), "f-1")
    disk = stored_by_medium(srv.events(6, kind=vs.BlockStored))["DISK"]
    assert len(disk) == 3
    srv.events_seen.clear()
    clears = 30
    for _ in range(clears):
        srv.engine.send(0, vs.encoder.encode(vs.KVEventBatch(ts=time.time(),
                                                              events=[vs.AllBlocksCleared()])))
    # In stream order: after the last of the clears, the disk's 3 chunks.
    # A round the L2 actor was told of by an earlier run of clears may land
    # after the last clear too (its batch queued behind the later clears at
    # the publisher): every round announces the 3 chunks whole, in one batch,
    # oldest first, so what follows the last clear is the 3 chunks, once per
    # such round.
    evs = srv.events_seen

    def disk_after_last_clear() -> list | None:
        while (m := srv.sub.recv(0, 0.05)) is not None:
            evs.extend(vs.decoder.decode(m.payload).events)
        cleared = [i for i, e in enumerate(evs) if isinstance(e, vs.AllBlocksCleared)]
        if len(cleared) < clears:
            return None
        return stored_by_medium(evs[cleared[-1] + 1:]).get("DISK")
    wait_until(lambda: len(disk_after_last_clear() or []) >= 3, 10,
               "every clear, then the disk's chunks after the last")
    # The publisher tells once per run of batches it publishes together, the
    # L2 actor rounds once per run of clears queued in its mailbox: never
    # more rounds than clears, each one announcing the 3 chunks.
    st = srv.wait_stats(lambda s: s["clears"] >= 1 and s["reannounced"]
                        == 3 * s["reannounce_rounds"], actor="l2", what="every round done")
    assert 1 <= st["reannounce_rounds"] <= st["clears"], st
    after = disk_after_last_clear()
    assert after and len(after) % 3 == 0 and after == disk * (len(after) // 3), after
    assert len(after) // 3 <= st["reannounce_rounds"], (len(after), st)
    srv.events_seen.clear()


@needs_redis
def test_shared_chunks_are_announced_again_only_while_redis_holds_them(cache_server, kv_pools,
                                                                       redis_cluster):
    """SHARED chunks are announced again after AllBlocksCleared only if the
    cluster still holds them: Redis is asked first (its TTL, its maxmemory
    policy or another node may have dropped one since it was written)."""
    srv = cache_server(events=True, overrides=redis_overrides(redis_cluster))
    pools = kv_pools(seed=42)
    f = flow_for(srv, pools, 1)
    toks = tokens(3, salt=42)
    store_through(srv, f, toks, "r-1")
    first = stored_by_medium(srv.events(6, kind=vs.BlockStored))
    assert first["SHARED"] == first["CPU"] and len(first["CPU"]) == 3
    srv.events_seen.clear()
    # The middle chunk leaves the cluster (as by its TTL).
    mid = first["SHARED"][1][0]
    deleted = 0
    for port in redis_cluster.ports:
        for key in redis_cluster.cli(port, "KEYS", f"*{mid:016x}*").split():
            deleted += int(redis_cluster.cli(port, "DEL", key) or 0)
    assert deleted == 1

    all_blocks_cleared(srv)
    again = stored_by_medium(srv.events(3 + 2, kind=vs.BlockStored))
    assert again["SHARED"] == [first["SHARED"][0], first["SHARED"][2]], again
    assert again["CPU"] == first["CPU"]
    srv.wait_stats(lambda s: s["reannounced"] == 2 and s["remembered"] == 2, actor="l2",
                   what="reannounced=2, remembered=2")
    srv.wait_log(r"l2#\d+ AllBlocksCleared on the events rank: 2 chunks of L2 announced again "
                 r"\(2 SHARED\)")
    srv.assert_no_events()


@needs_redis
def test_reused_fetch_buffers_never_leak_an_earlier_prompts_bytes(cache_server, kv_pools,
                                                                   redis_cluster):
    """The L2 actor reads Redis values into buffers the store handed back
    after an earlier prefetch: each prompt must still land its own bytes."""
    a = cache_server(overrides=redis_overrides(redis_cluster))
    b = cache_server(overrides=redis_overrides(redis_cluster))
    pools_a, pools_b = kv_pools(seed=3), kv_pools(seed=4)
    fa, fb = flow_for(a, pools_a, 1), flow_for(b, pools_b, 2)
    p1, p2 = tokens(2, salt=21), tokens(2, salt=22)
    store_through(a, fa, p1, "a-1", first_block=0)
    store_through(a, fa, p2, "a-2", first_block=4)

    def fetch_and_check(toks, rid, dst, src):
        assert fb.lookup_kv(toks, rid) == 2 * CHUNK
        assert fb.retrieve_kv(rid, dst) == 2 * CHUNK
        assert not pages_equal(pools_b, dst, pools_a, src)
        fb.end_session(rid)
        fb.drain()

    fetch_and_check(p1, "b-1", blocks(80, 2), blocks(0, 2))
    b.wait_stats(lambda s: s["fetched_redis"] == 2, actor="l2", what="fetched_redis=2")
    fetch_and_check(p2, "b-2", blocks(90, 2), blocks(4, 2))   # into p1's buffers
    # Drop B's L1 copies: p1 comes from Redis again, into p2's buffers.
    assert fb.c.clear(True) is None
    fetch_and_check(p1, "b-3", blocks(100, 2), blocks(0, 2))
    st = b.wait_stats(lambda s: s["fetched_redis"] == 6, actor="l2", what="fetched_redis=6")
    # The second and third prompts were read into the earlier ones' buffers.
    assert st["buffers_reused"] >= 4, st


@needs_redis
def test_redis_master_killed_mid_run_degrades_to_misses(cache_server, kv_pools, redis_cluster):
    a = cache_server(overrides=redis_overrides(redis_cluster))
    b = cache_server(overrides=redis_overrides(redis_cluster))
    pools_a, pools_b = kv_pools(seed=6), kv_pools(seed=7)
    fa, fb = flow_for(a, pools_a, 1), flow_for(b, pools_b, 2)
    prompts = [tokens(1, salt=100 + i) for i in range(12)]
    for i, t in enumerate(prompts):
        assert fa.store_kv(t, f"a-{i}", blocks(0, 1)) is True
        fa.end_session(f"a-{i}")
    fa.drain()
    written(a, 12)
    sizes = {p: redis_cluster.dbsize(p) for p in redis_cluster.ports}
    assert sum(sizes.values()) == 12
    victim = max(sizes, key=sizes.get)
    redis_cluster.kill(victim)
    # Every LOOKUP is answered (a number, never an error or a timeout): the
    # chunks on the dead master are misses, the others hits.
    hits = 0
    t0 = time.monotonic()
    for i, t in enumerate(prompts):
        n = fb.lookup_kv(t, f"b-{i}")
        assert n in (0, CHUNK)
        hits += n // CHUNK
        fb.end_session(f"b-{i}")
    fb.drain()
    assert hits == 12 - sizes[victim]
    assert time.monotonic() - t0 < 10
    b.wait_log(r"l2#\d+ redis: .*127\.0\.0\.1:" + str(victim))
    b.wait_idle()
    # The store goes on: a new prompt is written through to the live masters.
    t = tokens(1, salt=999)
    assert fb.store_kv(t, "b-new", blocks(0, 1)) is True
    fb.end_session("b-new")
    fb.drain()
    assert b.sidecar.running()


def test_corrupt_disk_object_ends_the_prefix_as_a_miss(cache_server, kv_pools, tmp_path):
    path = tmp_path / "l2corrupt"
    o = {"l2.disk.enabled": True, "l2.disk.path": str(path), "l2.disk.size": "16MiB"}
    first = cache_server(events=True, overrides=o)
    pools = kv_pools(seed=8)
    f = flow_for(first, pools, 1)
    toks = tokens(3, salt=41)
    store_through(first, f, toks, "c-1")
    # L1's events (medium CPU) and the disk tier's (DISK) come from two
    # actors, in either order: read until L1's three blocks are in.
    hashes: list[int] = []
    for _ in range(12):
        if len(hashes) >= 3:
            break
        hashes += [h for e in first.events(1, kind=vs.BlockStored) if e.medium == "CPU"
                   for h in e.block_hashes]
    assert len(hashes) == 3
    first.close()
    # Chunk 1's file: one payload-size byte flipped (the header checksum fails
    # when it is read; the directory scan at start checks it too).
    victim = path / f"00000000@{hashes[1] & (2**64 - 1):016x}.kvl2"
    data = bytearray(victim.read_bytes())
    data[20] ^= 0xFF
    victim.write_bytes(bytes(data))
    second = cache_server(overrides=o)
    second.wait_log(r"l2#\d+ started: disk .* 2 chunks found")
    f2 = flow_for(second, kv_pools(seed=9), 2)
    assert f2.lookup_kv(toks, "c-2") == 1 * CHUNK  # chunk 0 only: the prefix ends at chunk 1
    f2.end_session("c-2")
    f2.drain()
    assert not victim.exists()  # dropped at start
    second.wait_idle()


def test_full_write_queue_skips_and_counts_never_blocks_store(cache_server, kv_pools, tmp_path):
    # 1 MiB of queue holds 16 chunks of 64 KiB; one STORE of 18 commits them
    # all at once, so the last 2 find the queue full.
    srv = cache_server(overrides={"l2.disk.enabled": True, "l2.disk.path": str(tmp_path / "q"),
                                  "l2.queue_bytes": "1MiB"})
    pools = kv_pools(seed=10, num_blocks=18 * PAGES_PER_CHUNK)
    f = flow_for(srv, pools, 1)
    toks = tokens(18, salt=51)
    assert f.store_kv(toks, "q-1", blocks(0, 18)) is True  # answered, not held up
    f.end_session("q-1")
    f.drain()
    srv.wait_stats(lambda s: s["stored"] == 18, what="18 committed in L1")
    written(srv, 16)
    # A stats line printed from now on counts every skip (they happen when
    # the chunks are queued, before 16 could be written); an earlier one,
    # printed before the STORE reached the store, would say 0.
    line = srv.wait_log(r"store#\d+ stats l2: .*write_skipped_queue_full=(\d+) queued=0B",
                        mark=srv.mark())
    assert int(line.group(1)) == 2
    assert len(list((tmp_path / "q").glob("*.kvl2"))) == 16
    assert srv.stats("l2")["written"] == 16


def test_unusable_disk_path_is_a_startup_error(tmp_path):
    o = dict(BASE_OVERRIDES)
    o.update({"cache.endpoint": f"tcp://127.0.0.1:{free_port_range(1)}",
              "l2.disk.enabled": True, "l2.disk.path": "/proc/kvs-l2-not-creatable"})
    sc = Sidecar(tmp_path / "bad", o)
    sc.spawn()
    try:
        assert sc.proc.wait(timeout=10) == 1
        assert 'l2.disk.path = "/proc/kvs-l2-not-creatable": cannot create directory' in sc.log_text()
    finally:
        sc.kill()


def test_tp2_prefetch_loads_only_chunks_every_rank_has(cache_server, kv_pools, tmp_path):
    o = {"l2.disk.enabled": True, "l2.disk.path": str(tmp_path / "tp2"), "l2.disk.size": "16MiB"}
    first = cache_server(overrides=o)
    p0, p1 = kv_pools(seed=12), kv_pools(seed=13)
    w0 = SeedFlow(first.client(), p0, MODEL, 7000, tp_size=2, rank=0)
    w1 = SeedFlow(first.client(), p1, MODEL, 7001, tp_size=2, rank=1)
    assert w0.register() is None and w1.register() is None
    toks = tokens(4, salt=61)
    assert w0.store_kv(toks, "t-1", blocks(0, 4))
    assert w1.store_kv(toks[: 2 * CHUNK], "t-1", blocks(0, 2))
    w0.c.end_session("t-1")
    written(first, 6)
    first.close()
    # L1 is empty after the restart: the scheduler-style lookup of each worker
    # loads the 2 chunks both ranks hold from disk, and each rank gets its shard.
    second = cache_server(overrides=o)
    q0, q1 = kv_pools(seed=14), kv_pools(seed=15)
    v0 = SeedFlow(second.client(), q0, MODEL, 7100, tp_size=2, rank=0)
    v1 = SeedFlow(second.client(), q1, MODEL, 7101, tp_size=2, rank=1)
    assert v0.register() is None and v1.register() is None
    assert v0.lookup_kv(toks, "t-2") == 2 * CHUNK
    assert v1.lookup_kv(toks, "t-2") == 2 * CHUNK
    second.wait_locks(4)
    assert v0.retrieve_kv("t-2", blocks(80, 2)) == 2 * CHUNK
    assert v1.retrieve_kv("t-2", blocks(80, 2)) == 2 * CHUNK
    assert not pages_equal(q0, blocks(80, 2), p0, blocks(0, 2))
    assert not pages_equal(q1, blocks(80, 2), p1, blocks(0, 2))
    v0.end_session("t-2")
    v1.end_session("t-2")
    v0.drain()
    v1.drain()
    second.wait_idle()
    assert second.stats("l2")["fetched_disk"] == 4  # 2 chunks x 2 ranks, loaded once


class HostileRedis:
    """A fake Redis on loopback that answers every request with `reply`
    (and then closes, when `close` is set); an empty reply never answers."""

    def __init__(self, reply: bytes, close: bool = False):
        self.reply, self.close_after = reply, close
        self.stop = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.threads = [threading.Thread(target=self.accept_loop, daemon=True)]
        self.threads[0].start()

    def accept_loop(self) -> None:
        self.sock.settimeout(0.05)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            t = threading.Thread(target=self.serve, args=(conn,), daemon=True)
            self.threads.append(t)
            t.start()

    def serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.05)
        with conn:
            while not self.stop.is_set():
                try:
                    if not conn.recv(1 << 20):
                        return  # the client hung up
                except socket.timeout:
                    continue
                except OSError:
                    return
                if self.reply:
                    conn.sendall(self.reply)
                    if self.close_after:
                        return

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=5)
        self.sock.close()


@pytest.mark.parametrize("reply,close,says", [
    (b"hello\r\n", False, "unexpected reply type byte 'h' (0x68) in 'hello'"),
    (b"$99999999999\r\n", False, "bulk length 99999999999 over the limit of 536870912 bytes"),
    (b"$1000\r\nabc", True, "server closed the connection after 3 of 1000 bytes of a bulk reply"),
    (b"", False, "no data within 1000 ms waiting for a reply"),
], ids=["garbage", "oversize-bulk", "closes-mid-reply", "never-replies"])
def test_hostile_redis_is_a_miss_with_a_named_error(cache_server, kv_pools, reply, close, says):
    fake = HostileRedis(reply, close)
    try:
        srv = cache_server(overrides={"l2.redis.enabled": True,
                                      "l2.redis.endpoints": [f"127.0.0.1:{fake.port}"],
                                      "l2.redis.timeout": "1s"})
        f = flow_for(srv, kv_pools(seed=16), 1)
        toks = tokens(2, salt=71)
        t0 = time.monotonic()
        assert f.lookup_kv(toks, "h-1") == 0  # answered: a miss, not an error
        assert time.monotonic() - t0 < 5
        srv.wait_log(r"l2#\d+ redis: 127\.0\.0\.1:" + str(fake.port) + ": read: "
                     + re.escape(says))
        # The write-through goes to the same server: the STORE is still answered.
        assert f.store_kv(toks, "h-1", blocks(0, 2)) is True
        f.end_session("h-1")
        f.drain()
        written(srv, 2)
        assert f.lookup_kv(tokens(1, salt=72), "h-2") == 0
        f.end_session("h-2")
        f.drain()
        srv.wait_idle()
        assert srv.sidecar.running()
        assert srv.stats("l2")["fetched_redis"] == 0
    finally:
        fake.close()


@needs_redis
def test_metrics_scrape_with_every_tier_on_waits_for_no_actor(cache_server, redis_cluster,
                                                               tmp_path):
    """Issue #35: with an L2 tier on, every scrape waited its whole 200 ms
    for the L2 actor, which had no metrics handler, and counted a timeout
    labelled with an actor id. With every tier and endpoint on (disk, a
    Redis Cluster, replay, join, gRPC), each scrape hears from every actor
    at once, and the L2 actor's figures are there."""
    o = redis_overrides(redis_cluster)
    o.update({"l2.disk.enabled": True, "l2.disk.path": str(tmp_path / "disk"),
              "events.replay_endpoint": f"tcp://*:{free_port_range(1)}",
              "events.join_endpoint": f"tcp://*:{free_port_range(1)}",
              "cache.grpc_endpoint": f"grpc://127.0.0.1:{free_port_range(1)}"})
    srv = cache_server(events=True, overrides=o)
    for _ in range(5):
        t0 = time.monotonic()
        m = srv.sidecar.metrics()
        took = time.monotonic() - t0
        assert took < 0.15, f"a scrape took {took * 1000:.0f} ms: an actor did not answer"
    timeouts = {k: v for k, v in m.items() if k[0] == "kvsidecar_scrape_timeouts_total"}
    assert not timeouts, timeouts
    assert ("kvsidecar_l2_written_chunks_total", frozenset()) in m
    assert ("kvsidecar_l2_objects", frozenset({("tier", "disk")})) in m
