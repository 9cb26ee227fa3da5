"""A mixed fleet under one LMCache 0.5.6 coordinator: LMCache's own MP
server (``lmcache.v1.multiprocess.http_server`` with ``--coordinator-url
--coordinator-advertise-ip --coordinator-event-reporting``, its fs L2
adapter) and kvsidecar (``[coordinator]`` with event reporting, its L2 in
LMCache's format), each with a folder of its own.

What is checked:
- ``lmcache query coordinator --api instances`` (the 0.5.6 wheel's CLI)
  lists both, each at its HTTP address;
- the same prompt stored into both through LMCache's own client: the
  coordinator's directory lookup (the token form, hashed by the
  coordinator) finds every chunk on both instances, in L1 (backend
  "dram") and L2 (backend "fs") -- the same keys, the same byte size;
- a prompt stored only into kvsidecar is found there and nowhere else;
- kvsidecar's L1 cleared: its L1 placements leave the directory; read
  back from its L2, the chunks are reported as LMCache's adapters report a
  load (an ``access`` event, counted per key; the coordinator's fleet
  eviction moves such keys to the young end of its LRU) and are placed in
  its L1 again.

Needs the engine venv (build-venv-engine, lmcache 0.5.6) and the blake3
package; skips with the reason without them.
"""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("conftest_cache")

from kvsidecar_harness import wait_until
from lmcache_cli import run_cli
from lmcache_l2_fleet import Fleet, release_env
from test_cache_l2_quota_lmcache import LMCacheHttpServer
from test_coordinator_events import overrides
from test_http_control_plane import request

pytest_plugins = ["conftest_cache", "lmcache_coordinator"]

MODEL = "org/fleet-056"
CHUNK, CHUNKS, CHUNK_BYTES = 256, 4, 2 * 1024 * 1024


def prompt(p: int) -> list[int]:
    """lmcache_l2_driver.py's prompt p (4 chunks of 256 tokens)."""
    return [(p * 1_000_003 + i * 7919) % 150_000 for i in range(CHUNKS * CHUNK)]


def test_lmcache_server_and_kvsidecar_in_one_directory(cache_server, tmp_path, coordinator):
    co = coordinator()
    lmc = fleet = None
    try:
        lmc = LMCacheHttpServer(
            tmp_path / "lmc", release_env("0.5.6"),
            {"type": "fs", "base_path": str(tmp_path / "lmc-l2")},
            ("--coordinator-url", co.url, "--coordinator-advertise-ip", "127.0.0.1",
             "--coordinator-heartbeat-interval", "0.5", "--coordinator-event-reporting",
             "--coordinator-event-flush-interval", "0.1"))
        (tmp_path / "lmc-l2").mkdir(exist_ok=True)
        kvs = cache_server(overrides=overrides(tmp_path, co.url, **{"cache.l1_size": "128MiB",
                                                                   "l2.disk.size": "64MiB"}))

        lmc_id = co.registered(lmc.http_port, timeout=30)
        kvs_id = co.registered(kvs.sidecar.http_port)
        [q] = run_cli("0.5.6", [["query", "coordinator", "--api", "instances", "--url", co.url]])
        assert q["rc"] == 0, q
        for port, iid in ((lmc.http_port, lmc_id), (kvs.sidecar.http_port, kvs_id)):
            assert f"127.0.0.1:{port}" in q["out"] and iid in q["out"], q["out"]

        fleet = Fleet(release_env("0.5.6"))
        assert fleet.step("store", lmc.url, model=MODEL, seed=5, prompt=1)["ok"]
        assert fleet.step("store", kvs.endpoint, model=MODEL, seed=5, prompt=1)["ok"]
        assert fleet.step("store", kvs.endpoint, model=MODEL, seed=6, prompt=2)["ok"]
        kvs.wait_stats(lambda s: s["written"] >= 2 * CHUNKS, actor="l2", timeout=15,
                       what="both prompts in kvsidecar's L2")

        def lookup(p: int) -> list[dict]:
            st, ans = request(co.port, "POST", "/directory/lookup",
                              {"model_name": MODEL, "token_ids": prompt(p), "world_size": 1})
            assert st == 200, ans
            return ans["results"]

        def placed(p: int):
            return [sorted((pl["instance_id"], pl["tier"], pl["backend"], pl.get("size_bytes"))
                           for pl in r["placements"]) for r in lookup(p)]
        kvs_l1, kvs_l2 = (kvs_id, "l1", "dram", CHUNK_BYTES), (kvs_id, "l2", "fs", CHUNK_BYTES)
        both = sorted([(lmc_id, "l1", "dram", CHUNK_BYTES), (lmc_id, "l2", "fs", CHUNK_BYTES),
                       kvs_l1, kvs_l2])
        wait_until(lambda: placed(1) == [both] * CHUNKS, 15,
                   "prompt 1's chunks on both servers in the directory")
        assert placed(2) == [[kvs_l1, kvs_l2]] * CHUNKS
        st, page = request(co.port, "GET", f"/directory/keys?instance_id={kvs_id}")
        assert st == 200 and page["total"] == 2 * CHUNKS, page
        assert [r["access_count"] for r in lookup(2)] == [0] * CHUNKS

        # Read back from kvsidecar's L2 (L1 cleared first): one access event
        # per key, as LMCache's fs adapter reports each key it loads.
        st, js = request(kvs.sidecar.http_port, "POST", "/cache/clear", {"tier": "l1"})
        assert st == 200, js
        wait_until(lambda: placed(2) == [[kvs_l2]] * CHUNKS, 10, "kvsidecar's L1 placements gone")
        got = fleet.step("fetch", kvs.endpoint, model=MODEL, seed=6, prompt=2, expect=CHUNKS)
        assert got == {"ok": True, "hit": CHUNKS, "equal": True}
        wait_until(lambda: all(r["access_count"] >= 1 for r in lookup(2)), 10,
                   "the loads reported as accesses")
        # Loaded into L1: placed there again under the same keys.
        wait_until(lambda: placed(2) == [[kvs_l1, kvs_l2]] * CHUNKS, 10, "back in kvsidecar's L1")
    finally:
        if fleet:
            fleet.close()
        if lmc:
            lmc.close()
