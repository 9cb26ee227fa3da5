"""One L2 for a mixed fleet (issue #38): LMCache's own MP server and
kvsidecar with l2.format = "lmcache" share one Redis (LMCache's `resp` L2
adapter, a real redis-server) or one folder (LMCache's `fs` adapter), and
each serves the other's chunks byte for byte.

Every step is run by LMCache's own client classes (lmcache_l2_driver.py,
in the engine venv: the same code against either server), with cpu_shm
pools in the vLLM flash-attn layout (the layout LMCache's CPU server
registers), 256-token chunks of 2 MiB:
- LMCache stores a prompt (through its client, into its L1 and its L2);
  a kvsidecar that never saw it, asked by LMCache's client, prefetches it
  from L2 and RETRIEVE lands the very bytes, and announces them
  (BlockStored SHARED from Redis, DISK from the folder);
- kvsidecar stores a salted prompt; LMCache's server, asked for it, finds
  it in L2 and serves the very bytes;
- another salt or another model is a miss on both.
Parametrized over LMCache 0.5.6 and, when unpacked next to the engine venv
(scripts/install-deps.sh --with-python), 0.5.7rc2's server and client.

Needs the engine venv (build-venv-engine, or KVS_ENGINE_VENV); skipped
without it. Run:
  KVSIDECAR_BIN=<build>/kvsidecar python3 -m pytest -q tests/integration/test_cache_l2_lmcache_server.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.register_assert_rewrite("conftest_cache")

import vllm_structs as vs
from kvsidecar_harness import free_port_range, wait_until
from lmcache_l2_fleet import ENGINE_VENV, PYTHON, Fleet, release_env

pytest_plugins = ["conftest_cache"]

CHUNK_BYTES = 2 * 1024 * 1024


@pytest.fixture(params=["0.5.6", "0.5.7"])
def release(request):
    if not PYTHON.is_file():
        pytest.skip(f"no engine venv at {ENGINE_VENV} (scripts/install-deps.sh --with-python)")
    env = release_env(request.param)
    if subprocess.run([str(PYTHON), "-c", "import lmcache.v1.multiprocess.server"], env=env,
                      capture_output=True, timeout=120).returncode != 0:
        pytest.skip(f"LMCache {request.param}'s server does not import in {ENGINE_VENV}")
    return request.param, env


class LMCacheServer:
    """`python -m lmcache.v1.multiprocess.server` with one L2 adapter."""

    def __init__(self, workdir: Path, env: dict, adapter: dict):
        self.port = free_port_range(1)
        self.url = f"tcp://127.0.0.1:{self.port}"
        self.log = workdir / "lmcache-server.log"
        workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [str(PYTHON), "-m", "lmcache.v1.multiprocess.server", "--host", "127.0.0.1",
             "--port", str(self.port), "--chunk-size", "256", "--l1-size-gb", "1",
             "--eviction-policy", "LRU", "--prometheus-port", str(free_port_range(1)),
             "--l2-adapter", json.dumps(adapter)],
            env=env, stdin=subprocess.DEVNULL, stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT)
        wait_until(lambda: self.proc.poll() is not None
                   or "cache server is running" in self.log.read_text(errors="replace"),
                   60, "LMCache's server up")
        assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


def both_directions(env: dict, lmc: LMCacheServer, kvs, model: str, medium: str) -> None:
    fleet = Fleet(env)
    try:
        directions(fleet, lmc, kvs, model, medium)
    finally:
        fleet.close()


def directions(fleet: Fleet, lmc: LMCacheServer, kvs, model: str, medium: str) -> None:
    # LMCache -> kvsidecar: kvsidecar never saw the prompt; L2 has it.
    assert fleet.step("store", lmc.url, model=model, seed=5, prompt=1)["ok"]
    got = fleet.step("fetch", kvs.endpoint, model=model, seed=5, prompt=1, expect=4)
    assert got == {"ok": True, "hit": 4, "equal": True}
    kvs.wait_stats(lambda s: s.get("fetched_disk", 0) + s.get("fetched_redis", 0) == 4, actor="l2",
                   what="4 chunks fetched from L2")
    # LMCache wrote them; kvsidecar announces them with the tier's medium.
    found = [h for e in kvs.events(4, kind=vs.BlockStored) for h in e.block_hashes
             if e.medium == medium]
    assert len(found) == 4
    # kvsidecar -> LMCache, salted: LMCache never saw it either.
    assert fleet.step("store", kvs.endpoint, model=model, salt="tenant-a", seed=6, prompt=2)["ok"]
    kvs.wait_stats(lambda s: s["written"] >= 4, actor="l2", what="written>=4")
    got = fleet.step("fetch", lmc.url, model=model, salt="tenant-a", seed=6, prompt=2, expect=4)
    assert got == {"ok": True, "hit": 4, "equal": True}
    # Another salt, another model: misses on both servers.
    for url in (lmc.url, kvs.endpoint):
        assert fleet.step("fetch", url, model=model, salt="tenant-b", seed=6, prompt=2,
                          expect=4, timeout=0.5)["hit"] == 0
        assert fleet.step("fetch", url, model=model + "-other", seed=5, prompt=1,
                          expect=4, timeout=0.5)["hit"] == 0


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")
def test_one_redis_shared_with_lmcache_server(cache_server, tmp_path, release):
    rel, env = release
    rport = free_port_range(1)
    redis = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lmc = None
    try:
        wait_until(lambda: subprocess.run(["redis-cli", "-p", str(rport), "PING"],
                                          capture_output=True, text=True).stdout.strip() == "PONG",
                   10, "redis up")
        lmc = LMCacheServer(tmp_path / "lmc", env, {"type": "resp", "host": "127.0.0.1",
                                                    "port": rport})
        kvs = cache_server(events=True, overrides={"l2.format": "lmcache", "l2.redis.enabled": True,
                                      "l2.redis.endpoints": [f"127.0.0.1:{rport}"],
                                      "cache.l1_size": "128MiB"})
        model = f"org/shared-{rel}"
        both_directions(env, lmc, kvs, model, "SHARED")
        keys = subprocess.run(["redis-cli", "-p", str(rport), "KEYS", "*"], capture_output=True,
                              text=True).stdout.split()
        # Four chunks each: LMCache's and kvsidecar's, one naming scheme.
        assert len(keys) == 8 and all(k.startswith(f"{model}@01000100@0@") for k in keys), keys
        assert sum(k.endswith("@tenant-a") for k in keys) == 4
        for k in keys:
            assert subprocess.run(["redis-cli", "-p", str(rport), "STRLEN", k], capture_output=True,
                                  text=True).stdout.strip() == str(CHUNK_BYTES)
    finally:
        if lmc:
            lmc.close()
        redis.kill()
        redis.wait(timeout=5)


def test_one_folder_shared_with_lmcache_server(cache_server, tmp_path, release):
    rel, env = release
    shared = tmp_path / "shared"
    shared.mkdir()
    lmc = LMCacheServer(tmp_path / "lmc", env, {"type": "fs", "base_path": str(shared)})
    try:
        kvs = cache_server(events=True, overrides={"l2.format": "lmcache", "l2.disk.enabled": True,
                                      "l2.disk.path": str(shared), "l2.disk.size": "64MiB",
                                      "cache.l1_size": "128MiB"})
        model = f"org/shared-{rel}"
        both_directions(env, lmc, kvs, model, "DISK")
        names = sorted(p.name for p in shared.iterdir())
        assert len(names) == 8, names
        assert all(n.startswith(f"org-SEP-shared-{rel}@0x01000100@0@") and n.endswith(".data")
                   for n in names), names
        assert all((shared / n).stat().st_size == CHUNK_BYTES for n in names)
    finally:
        lmc.close()
