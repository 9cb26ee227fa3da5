"""Proof of possession for shared memory (issue 43 item 2).

The sidecar maps a client's /dev/shm objects with its own rights, so without
a check any client of the cache endpoint could register another process's
KV pools (a name that passes cache.shm_allow_prefixes is enough): STORE would
copy the victim's pages into L1 for the attacker to read back, RETRIEVE would
overwrite them with bytes of the attacker's choosing. Before mapping an
object the registry now asks who the client is (ipc://: SO_PEERCRED's pid;
loopback tcp:// and gRPC: the process owning the client's socket, found in
/proc/net/tcp{,6} and /proc/<pid>/fd where the PID namespace is shared) and
refuses an object that process has neither open nor mapped.

The tests run as root, where the owner check alone refuses nothing: the
victim here is a process of the same user (shm_victim.py) whose pools the
attacker never opened. Its pages are checked unchanged (sha256 reported by
the victim itself, so the test never maps them either).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import msgspec
import pytest

pytest.register_assert_rewrite("conftest_cache", "lmcache_client")

from conftest_cache import tokens
from lmcache_client import MPClient, pool_wrappers
from test_cache_server import MODEL, PAGE, STORE_OK, blocks, register, store

pytest_plugins = ["conftest_cache"]

HERE = Path(__file__).resolve().parent
BLOCKS = 160


class Victim:
    def __init__(self, seed: int = 5, layout: str = "sglang"):
        self.p = subprocess.Popen([sys.executable, str(HERE / "shm_victim.py"), str(BLOCKS),
                                   str(seed), layout], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        words = self.p.stdout.readline().split()
        assert words and words[0] == "ready", words
        self.pid, self.names = int(words[1]), words[2:]

    def sha(self) -> str:
        self.p.stdin.write("?\n")
        self.p.stdin.flush()
        words = self.p.stdout.readline().split()
        assert words[0] == "sha", words
        return words[1]

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait(timeout=10)


def aimed_at(own_pools, victim: Victim) -> list:
    """The attacker's register_kv_cache wrappers with every object name
    replaced by the victim's (same geometry, so only the name differs)."""
    assert len(own_pools.objects) == len(victim.names)
    rename = {o.name: v for o, v in zip(own_pools.objects, victim.names)}
    out = []
    for w in pool_wrappers(own_pools):
        d = msgspec.msgpack.decode(w.data)
        d["shm_name"] = rename[d["shm_name"]]
        out.append(msgspec.msgpack.Ext(0x4B, msgspec.msgpack.encode(d)))
    return out


@pytest.mark.parametrize("endpoint", ["tcp", "ipc"])
def test_registering_a_victims_shm_is_refused(cache_server, kv_pools, endpoint):
    overrides = {}
    if endpoint == "ipc":
        sock = Path(tempfile.mkdtemp(prefix="kvs_ipc_")) / "cache.sock"
        overrides["cache.endpoint"] = f"ipc://{sock}"
    srv = cache_server(overrides=overrides)
    victim = Victim()
    try:
        before = victim.sha()
        c = srv.client() if endpoint == "tcp" else MPClient(overrides["cache.endpoint"], srv.ctx)
        if endpoint == "ipc":
            srv.clients.append(c)
        own = kv_pools("sglang", num_blocks=BLOCKS, seed=9)
        mark = srv.mark()
        uid = c.submit("register_kv_cache", 7400, aimed_at(own, victim), MODEL, 1, "sglang",
                       {"tokens_per_block": PAGE}, [])
        why = c.failure(uid)
        assert why.startswith("kvsidecar: register_kv_cache failed: tensor 0"), why
        assert "neither open nor mapped" in why, why
        srv.wait_log(rf"register_kv_cache of instance 7400 failed: tensor 0 \('{victim.names[0]}'\)"
                     rf": the client's process \(pid \d+\) has it neither open nor mapped", mark)
        # Nothing was mapped for the attacker: a store through the id fails ...
        assert store(c, 7400, tokens(1, salt=74), "atk", blocks(0, 1)) != STORE_OK
        # ... and the victim's pages are as it left them.
        assert victim.sha() == before
        # The same client registers the pools it holds itself.
        register(c, own, 7401)
        assert store(c, 7401, tokens(1, salt=75), "own", blocks(0, 1)) == STORE_OK
        c.end_session("own")
        c.end_session("atk")
        srv.wait_idle()
    finally:
        victim.close()


class _Renamed:
    """A KVPools stand-in whose descriptors name the victim's objects."""

    def __init__(self, own, victim: Victim):
        assert len(own.objects) == len(victim.names)
        rename = {o.name: v for o, v in zip(own.objects, victim.names)}
        self._d = [dict(d, shm_name=rename[d["shm_name"]]) for d in own.descriptors()]

    def descriptors(self) -> list[dict]:
        return self._d


def test_grpc_client_registering_a_victims_shm_is_refused(cache_server, kv_pools):
    """The same attack through LMCache 0.5.6's own gRPC client (grpc://: the
    client's process is found from gRPC's peer name)."""
    pytest.importorskip("grpc", reason="needs grpcio")
    import grpc
    from test_cache_grpc import _load_grpc056, grpc_server
    from test_cache_lmcache_client import lmcache_wrappers

    lmc = _load_grpc056()
    srv = grpc_server(cache_server)
    victim = Victim(layout="vllm")
    client = lmc.create_request_client(srv.grpc_url)
    try:
        before = victim.sha()
        own = kv_pools("vllm", num_blocks=BLOCKS, seed=9)
        mark = srv.mark()
        with pytest.raises(grpc.RpcError) as refused:
            client.register_kv_cache(7410, lmcache_wrappers(lmc, _Renamed(own, victim)), MODEL, 1,
                                     lmc.EngineType.VLLM, {"kv_layout": "NHD"},
                                     []).result(timeout=10)
        assert "neither open nor mapped" in str(refused.value)
        srv.wait_log(r"register_kv_cache of instance 7410 failed: tensor 0 .*the client's "
                     r"process \(pid \d+\) has it neither open nor mapped", mark)
        assert victim.sha() == before
        assert client.register_kv_cache(7411, lmcache_wrappers(lmc, own), MODEL, 1,
                                        lmc.EngineType.VLLM, {"kv_layout": "NHD"},
                                        []).result(timeout=10) is None
    finally:
        client.close()
        victim.close()
