"""l2.format = "lmcache" among kvsidecars (issue #38; LMCache's own server
is in test_cache_l2_lmcache_server.py): L2 objects named, hashed and laid
out as LMCache 0.5.6 names them, so one Redis or one folder can be shared
with LMCache servers.

What is checked, with real components on loopback (a single-node Debian
redis-server, the disk tier in a temporary folder):
- the folder holds exactly LMCache's fs-adapter file names
  (<model with / as -SEP->@0x<kv_rank:08x>@0@<blake3 chain hex>.data) and
  each file is the chunk's KV_2LTD bytes, no header; BlockStored goes out
  with medium DISK as for the default format;
- a restarted sidecar reindexes the folder (and, with another model of
  another chunk size registered beside, still expects this model's size); files it never wrote (put
  there by "another node", before its start and while it runs) are hits
  served byte for byte; a file of another length ends the hit there;
  another model, salt or world size is a miss; the chunks found are
  announced (BlockStored DISK, their tokens, parents chained);
- Redis keys are LMCache's resp keys (<model>@<kv_rank:08x>@0@<hash hex>
  [@salt]) holding the raw chunk; a second sidecar prefetches them; a value
  of another length is a miss; what B found is announced SHARED.

The chunk hash is computed here from its definition (rolling BLAKE3 over
the previous digest and big-endian uint32 tokens); the unit test
test_cache_lmcache_hash checks kvsidecar's against the LMCache wheel's own
TokenHasher, and test_cache_l2_lmcache_server.py against its server.

Run: KVSIDECAR_BIN=<build>/kvsidecar python3 -m pytest -q tests/integration/test_cache_l2_lmcache.py
"""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
from pathlib import Path

import pytest

pytest.register_assert_rewrite("conftest_cache", "lmcache_client")

import vllm_structs as vs
from conftest_cache import CHUNK, pages_equal, tokens
from kvsidecar_harness import free_port_range, wait_until
from lmcache_client import SeedFlow, cache_key

pytest_plugins = ["conftest_cache"]

blake3 = pytest.importorskip("blake3", reason="the blake3 package (tests/integration/requirements.txt)")

MODEL = "test-org/test-model"
PAGE = 16
PAGES_PER_CHUNK = CHUNK // PAGE
CHUNK_BYTES = 64 * 1024

needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None,
                                 reason="redis-server not installed")


# -- LMCache's names, from their definitions ----------------------------------------------

def lmcache_hashes(toks: list[int], cs: int = CHUNK) -> list[bytes]:
    prev = blake3.blake3(bytes(12)).digest()  # hash_func((0, (0,), None))
    out = []
    for i in range(0, len(toks) // cs * cs, cs):
        prev = blake3.blake3(prev + struct.pack(f">{cs}I", *toks[i:i + cs])).digest()
        out.append(prev)
    return out


def kv_rank(world: int = 1, rank: int = 0) -> int:
    return (world << 24) | (rank << 16) | (world << 8) | rank


def file_name(h: bytes, model: str = MODEL, world: int = 1, rank: int = 0, salt: str = "") -> str:
    base = f"{model.replace('/', '-SEP-')}@{kv_rank(world, rank):#010x}@0@{h.hex()}"
    return f"{base}@{salt}.data" if salt else f"{base}.data"


def redis_key(h: bytes, model: str = MODEL, world: int = 1, rank: int = 0, salt: str = "") -> str:
    base = f"{model}@{kv_rank(world, rank):08x}@0@{h.hex()}"
    return f"{base}@{salt}" if salt else base


def chunk_bytes(pools, first_block: int) -> bytes:
    """A chunk as LMCache's L1 holds it: KV_2LTD [2, layers, tokens, heads*dim]."""
    return b"".join(pools.page(kv, layer, first_block + p)
                    for kv in range(2) for layer in range(pools.num_layers)
                    for p in range(PAGES_PER_CHUNK))


def blocks(first: int, n_chunks: int) -> list[int]:
    return list(range(first, first + n_chunks * PAGES_PER_CHUNK))


class SaltedFlow(SeedFlow):
    """SeedFlow whose keys carry a cache_salt."""
    salt = ""

    def key(self, token_ids, start, end, request_id, no_worker_id=False):
        return cache_key(self.model, self.tp_size, None if no_worker_id else self.worker_id,
                         token_ids, start, end, request_id, cache_salt=self.salt)


def flow_for(srv, pools, instance: int, model: str = MODEL, salt: str = "") -> SaltedFlow:
    f = SaltedFlow(srv.client(), pools, model, instance_id=instance, engine="sglang",
                   wrapper_kind="host_shm")
    f.salt = salt
    assert f.register() is None
    return f


def store_prompt(srv, f, toks, rid, n: int) -> None:
    """A prompt's lookup (a miss) and STORE, its session ended, L2 written."""
    assert f.lookup_kv(toks, rid) == 0
    assert f.store_kv(toks, rid, blocks(0, n)) is True
    f.end_session(rid)
    f.drain()
    srv.wait_stats(lambda s: s["written"] >= n, actor="l2", what=f"written>={n}")


def served(f, toks, rid, n: int, dst, dst_block: int, src) -> None:
    """LOOKUP hits n chunks; RETRIEVE lands the source's chunks 0..n byte for byte."""
    assert f.lookup_kv(toks, rid) == n * CHUNK
    assert f.retrieve_kv(rid, blocks(dst_block, n)) == n * CHUNK
    assert not pages_equal(dst, blocks(dst_block, n), src, blocks(0, n))
    f.end_session(rid)
    f.drain()


def found_announced(srv, medium: str, toks, n: int) -> None:
    """n chunks found in L2 that another writer put there were announced as
    BlockStored with `medium`: chunk tokens in order, each parent the chunk
    before."""
    got = []  # (hash, parent, tokens); a later block of one event chains on the one before
    for e in srv.events(n, kind=vs.BlockStored):
        assert e.medium == medium, e
        for i, h in enumerate(e.block_hashes):
            parent = e.parent_block_hash if i == 0 else e.block_hashes[i - 1]
            got.append((h, parent, tuple(e.token_ids[i * CHUNK:(i + 1) * CHUNK])))
    assert [t for _, _, t in got] == [tuple(toks[c * CHUNK:(c + 1) * CHUNK]) for c in range(n)]
    assert [p for _, p, _ in got] == [None] + [h for h, _, _ in got[:-1]]


def lookup_and_end(f, toks, rid) -> int:
    n = f.lookup_kv(toks, rid)
    f.end_session(rid)
    f.drain()
    return n


# -- a single-node Redis and a bare RESP client (binary values) ------------------------------

class Redis:
    def __init__(self, workdir: Path):
        self.port = free_port_range(1)
        workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(workdir)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: self._try_ping(), 10, "redis up")

    def _try_ping(self) -> bool:
        try:
            return self.cmd(b"PING") == b"PONG"
        except OSError:
            return False

    def cmd(self, *args: bytes):
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
            f = s.makefile("rb")
            return self._read(f)

    def _read(self, f):
        line = f.readline()
        kind, rest = line[:1], line[1:-2]
        if kind in (b"+", b"-"):
            return rest
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else f.read(n + 2)[:-2]
        if kind == b"*":
            return [self._read(f) for _ in range(int(rest))]
        raise ValueError(line)

    def keys(self) -> list[str]:
        return sorted(k.decode() for k in self.cmd(b"KEYS", b"*"))

    def close(self):
        self.proc.kill()
        self.proc.wait(timeout=5)


@pytest.fixture
def redis(tmp_path):
    r = Redis(tmp_path / "redis")
    yield r
    r.close()


def lmcache_overrides(**extra) -> dict:
    o = {"l2.format": "lmcache"}
    o.update(extra)
    return o


# -- the folder ----------------------------------------------------------------------------

def test_disk_files_are_lmcache_objects_and_survive_a_restart(cache_server, kv_pools, tmp_path):
    path = tmp_path / "shared"
    o = lmcache_overrides(**{"l2.disk.enabled": True, "l2.disk.path": str(path),
                             "l2.disk.size": "16MiB"})
    first = cache_server(events=True, overrides=o)
    pools = kv_pools(seed=3)
    f = flow_for(first, pools, 1)
    toks = tokens(3, salt=21)
    store_prompt(first, f, toks, "r-1", 3)
    hs = lmcache_hashes(toks)
    assert sorted(p.name for p in path.iterdir()) == sorted(file_name(h) for h in hs)
    for c, h in enumerate(hs):
        assert (path / file_name(h)).read_bytes() == chunk_bytes(pools, c * PAGES_PER_CHUNK)
    stored = first.events(6, kind=vs.BlockStored)
    media = {}
    for e in stored:
        media.setdefault(e.medium, []).extend(e.block_hashes)
    assert media["DISK"] == media["CPU"] and len(media["CPU"]) == 3
    first.close()
    second = cache_server(overrides=o)
    second.wait_log(r"l2#\d+ started: disk .* in LMCache's fs layout \(16 MiB, 3 objects found\)")
    # Another model of another chunk size on the same sidecar: the prefetch
    # still expects this model's size (LMCache's objects carry no header).
    flow_for(second, kv_pools(seed=5, num_layers=4), 3, model="other/model")
    pools2 = kv_pools(seed=4)
    served(flow_for(second, pools2, 2), toks, "r-2", 3, pools2, 40, pools)
    second.wait_idle()
    assert second.stats("l2")["fetched_disk"] == 3


def test_files_another_node_wrote_are_hits_and_mismatches_are_misses(cache_server, kv_pools,
                                                                      tmp_path):
    path = tmp_path / "shared"
    path.mkdir()
    src = kv_pools(seed=7)
    toks = tokens(4, salt=33)
    hs = lmcache_hashes(toks)
    # "Another node" wrote chunks 0-1 before this sidecar started ...
    for c in range(2):
        (path / file_name(hs[c])).write_bytes(chunk_bytes(src, c * PAGES_PER_CHUNK))
    # ... and salted copies, plus a too-short chunk 0 under another model.
    for c in range(4):
        (path / file_name(hs[c], salt="tenant-a")).write_bytes(chunk_bytes(src, c * PAGES_PER_CHUNK))
    (path / file_name(hs[0], model="other/model")).write_bytes(b"x" * 100)
    srv = cache_server(events=True, overrides=lmcache_overrides(**{
        "l2.disk.enabled": True, "l2.disk.path": str(path), "l2.disk.size": "16MiB"}))
    srv.wait_log(r"l2#\d+ started: disk .* \(16 MiB, 7 objects found\)")
    # Chunk 2 arrives while it runs; chunk 3 has the wrong length.
    (path / file_name(hs[2])).write_bytes(chunk_bytes(src, 2 * PAGES_PER_CHUNK))
    (path / file_name(hs[3])).write_bytes(chunk_bytes(src, 3 * PAGES_PER_CHUNK)[:-1])
    dst = kv_pools(seed=8)
    served(flow_for(srv, dst, 1), toks, "h-1", 3, dst, 0, src)  # chunk 3: a miss, not short
    # Nobody announced these chunks (another node wrote them): this sidecar does, DISK.
    found_announced(srv, "DISK", toks, 3)
    # The salted objects are the salted key's, all four of them.
    salted = flow_for(srv, kv_pools(seed=9), 2, salt="tenant-a")
    assert lookup_and_end(salted, toks, "s-1") == 4 * CHUNK
    # Another salt, another model, another world size: misses.
    assert lookup_and_end(flow_for(srv, kv_pools(seed=10), 3, salt="tenant-b"), toks, "s-2") == 0
    assert lookup_and_end(flow_for(srv, kv_pools(seed=11), 4, model="other/model"), toks, "m-1") == 0
    st = srv.wait_stats(lambda s: s.get("disk_adopted", 0) >= 1 and s.get("disk_wrong_size", 0) >= 1,
                        actor="l2", what="a file adopted and one of the wrong size")
    # Nothing was removed: the wrong-length file may be another writer's.
    assert (path / file_name(hs[3])).stat().st_size == CHUNK_BYTES - 1
    assert (path / file_name(hs[0], model="other/model")).exists()


# -- Redis ---------------------------------------------------------------------------------

@needs_redis
def test_redis_keys_are_lmcache_keys_and_a_second_sidecar_hits(cache_server, kv_pools, redis):
    o = lmcache_overrides(**{"l2.redis.enabled": True,
                             "l2.redis.endpoints": [f"127.0.0.1:{redis.port}"],
                             "l2.redis.timeout": "300ms"})
    a = cache_server(events=True, overrides=o)
    b = cache_server(events=True, overrides=o)
    pools_a, pools_b = kv_pools(seed=1), kv_pools(seed=2)
    fa, fb = flow_for(a, pools_a, 1, salt="t1"), flow_for(b, pools_b, 2, salt="t1")
    toks = tokens(4, salt=11)
    store_prompt(a, fa, toks, "a-1", 4)
    hs = lmcache_hashes(toks)
    assert redis.keys() == sorted(redis_key(h, salt="t1") for h in hs)
    for c, h in enumerate(hs):
        assert redis.cmd(b"GET", redis_key(h, salt="t1").encode()) == \
            chunk_bytes(pools_a, c * PAGES_PER_CHUNK)
    shared = [h for e in a.events(8, kind=vs.BlockStored) if e.medium == "SHARED"
              for h in e.block_hashes]
    assert len(shared) == 4
    # A value of another length under chunk 2's name: B's hit ends before it.
    redis.cmd(b"SET", redis_key(hs[2], salt="t1").encode(), b"\0" * 10)
    served(fb, toks, "b-1", 2, pools_b, 80, pools_a)
    found_announced(b, "SHARED", toks, 2)  # A's chunks, found in the shared Redis
    b.wait_stats(lambda s: s["fetched_redis"] == 2, actor="l2", what="fetched_redis=2")
    # The unsalted key names other objects.
    assert lookup_and_end(flow_for(b, kv_pools(seed=3), 3), toks, "b-2") == 0


@needs_redis
def test_redis_cluster_routes_lmcache_keys(cache_server, kv_pools, tmp_path):
    """kvsidecar-only fleets may keep a Redis Cluster in this format (LMCache's
    resp adapter cannot follow MOVED, so a Cluster is not shared with it)."""
    from test_cache_l2 import RedisCluster, redis_overrides
    cl = RedisCluster(tmp_path / "cluster")
    try:
        o = lmcache_overrides(**redis_overrides(cl))
        a, b = cache_server(overrides=o), cache_server(overrides=o)
        pools_a, pools_b = kv_pools(seed=21), kv_pools(seed=22)
        toks = tokens(4, salt=41)
        store_prompt(a, flow_for(a, pools_a, 1), toks, "c-1", 4)
        keys = sorted(k for p in cl.ports for k in cl.cli(p, "KEYS", "*").split())
        assert keys == sorted(redis_key(h) for h in lmcache_hashes(toks))
        assert sum(cl.dbsize(p) > 0 for p in cl.ports) > 1  # spread over the masters
        served(flow_for(b, pools_b, 2), toks, "c-2", 4, pools_b, 80, pools_a)
    finally:
        cl.close()
