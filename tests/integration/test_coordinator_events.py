"""kvsidecar reports its L2 objects to LMCache 0.5.6's fleet coordinator
(``lmcache coordinator`` from the engine venv) as LMCache's server does with
``--coordinator-event-reporting``: CacheEventBatch lists on POST /events,
under LMCache's ObjectKey (l2.format = "lmcache": the BLAKE3 chunk hash,
packed kv_rank, group, salt), backend "fs" for the disk tier.

What is checked, with the real coordinator and LMCache's own MP client:
- chunks stored through the client are found by the coordinator's
  /directory/lookup in both its forms (the keys; the request's tokens,
  hashed by the coordinator itself), placed on kvsidecar's registered
  instance, tier l2, backend fs, with their byte size; /directory/keys and
  ``lmcache query coordinator --api directory`` count them; the usage view
  (``--api usage``) has their bytes over the declared l2.disk.size;
- a chunk the coordinator's own call deletes (DELETE /cache/objects with
  LMCache's key) disappears from the directory;
- a fleet quota set at the coordinator evicts that tenant's objects on
  kvsidecar (the coordinator's DELETE /cache/objects), other salts kept;
- Redis objects are reported as LMCache's resp adapter's;
- with the coordinator down, storing costs nothing (the store's reply and
  L2 write come as before) and the events its POSTs carried are counted as
  lost; events past coordinator.event_queue_max are dropped and counted.

Needs the engine venv (build-venv-engine, lmcache 0.5.6) and the blake3
package; skips with the reason without them.
"""

from __future__ import annotations

import time

import pytest

pytest.register_assert_rewrite("conftest_cache", "lmcache_client")

from conftest_cache import tokens
from kvsidecar_harness import free_port_range, wait_until
from lmcache_cli import run_cli
from test_http_control_plane import request
from test_cache_l2_lmcache import (CHUNK_BYTES, MODEL, flow_for, kv_rank, lmcache_hashes,
                                   needs_redis, redis, store_prompt)  # noqa: F401 (fixture)

pytest_plugins = ["conftest_cache", "lmcache_coordinator"]


def overrides(tmp_path, url: str, **more) -> dict:
    o = {"l2.format": "lmcache", "l2.disk.enabled": True, "l2.disk.path": str(tmp_path / "l2"),
         "l2.disk.size": "16MiB", "coordinator.url": url,
         "coordinator.advertise_address": "127.0.0.1",
         "coordinator.heartbeat_interval": "200ms", "coordinator.event_reporting": True,
         "coordinator.event_flush_interval": "100ms"}
    o.update(more)
    return o


def key(h: bytes, salt: str = "") -> dict:
    return {"chunk_hash_hex": h.hex(), "model_name": MODEL, "kv_rank": kv_rank(),
            "object_group_id": 0, "cache_salt": salt}


def metric(srv, name: str) -> float:
    return sum(v for (n, _), v in srv.sidecar.metrics().items() if n == name)


def test_the_directory_finds_kvsidecar_chunks_and_loses_the_deleted(cache_server, kv_pools,
                                                                     tmp_path, coordinator):
    co = coordinator()
    srv = cache_server(overrides=overrides(tmp_path, co.url))
    port = srv.sidecar.http_port
    me = co.registered(port)
    pools = kv_pools(seed=5)
    f = flow_for(srv, pools, 1)
    toks = tokens(3, salt=45)
    store_prompt(srv, f, toks, "r1", 3)
    hashes = lmcache_hashes(toks)
    assert len(hashes) == 3

    def placed(body):
        st, ans = request(co.port, "POST", "/directory/lookup", body)
        assert st == 200, ans
        return [sorted((p["instance_id"], p["tier"], p["backend"], p.get("size_bytes"))
                       for p in r["placements"]) for r in ans["results"]]
    # In L1 (LMCache's medium name "dram") and in the disk tier ("fs").
    l1 = (me, "l1", "dram", CHUNK_BYTES)
    where = [l1, (me, "l2", "fs", CHUNK_BYTES)]
    wait_until(lambda: placed({"keys": [key(h) for h in hashes]}) == [where] * 3, 10,
               "the three chunks in the coordinator's directory")
    # The token form: the coordinator hashes the request itself.
    assert placed({"model_name": MODEL, "token_ids": toks, "world_size": 1}) == [where] * 3
    st, page = request(co.port, "GET", f"/directory/keys?instance_id={me}")
    assert st == 200 and page["total"] == 3, page
    assert sorted(k["key"]["chunk_hash_hex"] for k in page["keys"]) \
        == sorted(h.hex() for h in hashes)
    [q] = run_cli("0.5.6", [["query", "coordinator", "--api", "directory", "--url", co.url]])
    assert q["rc"] == 0 and "Keys:" in q["out"], q
    assert [ln.split()[-1] for ln in q["out"].splitlines() if ln.startswith("Keys:")] == ["3"]
    # The usage view: the bytes over the capacity kvsidecar declared (l2.disk.size).
    st, usage = request(co.port, "GET", f"/instances/{me}/usage")
    assert st == 200, usage
    [fs] = [m for m in usage["modules"] if m["tier"] == "l2"]
    assert (fs["backend"], fs["used_bytes"], fs["capacity_bytes"]) \
        == ("fs", 3 * CHUNK_BYTES, 16 << 20), usage
    [dram] = [m for m in usage["modules"] if m["tier"] == "l1"]
    assert (dram["backend"], dram["used_bytes"], dram["capacity_bytes"]) \
        == ("dram", 3 * CHUNK_BYTES, 64 << 20), usage  # cache.l1_size
    [q] = run_cli("0.5.6", [["query", "coordinator", "--api", "usage", "--url", co.url]])
    assert q["rc"] == 0 and me in q["out"], q
    st, stats = request(co.port, "GET", "/directory/stats")
    assert st == 200 and stats["num_keys"] == 3 and stats["l2_count"] == 3, stats
    assert stats["l1_count"] == 3 and stats["l1_size_bytes"] == 3 * CHUNK_BYTES, stats
    assert stats["l2_size_bytes"] == 3 * CHUNK_BYTES, stats

    # The coordinator's delete call (DELETE /cache/objects, LMCache's key,
    # L2 by default): the chunk leaves kvsidecar's folder and the
    # directory's L2; "tier": "l1" then takes it out of L1 too.
    assert request(port, "DELETE", "/cache/objects", {"keys": [key(hashes[1])]}) \
        == (200, {"deleted": 1, "skipped": 0, "ok": True})
    wait_until(lambda: placed({"keys": [key(h) for h in hashes]}) == [where, [l1], where], 10,
               "the deleted chunk gone from the directory's L2")
    # An L1 eviction of any kind (here /cache/clear) is a delete on tier l1.
    assert request(port, "POST", "/cache/clear", {"tier": "l1"})[0] == 200
    wait_until(lambda: placed({"keys": [key(h) for h in hashes]}) == [[where[1]], [], [where[1]]],
               10, "the L1 placements gone from the directory")
    assert metric(srv, "kvsidecar_coordinator_events_dropped_total") == 0
    assert metric(srv, "kvsidecar_coordinator_events_lost_total") == 0
    # 3 L1 stores, 3 L2 stores, 1 L2 delete, 3 L1 deletes.
    assert metric(srv, "kvsidecar_coordinator_events_posted_total") == 10

    # The coordinator goes away: storing goes on as before; what the
    # failed POSTs carried is counted as lost.
    co.stop()
    toks2 = tokens(2, salt=46)
    t0 = time.monotonic()
    store_prompt(srv, f, toks2, "r2", 2)
    took = time.monotonic() - t0
    assert took < 2.0, f"a store took {took:.2f}s with the coordinator down"
    srv.wait_stats(lambda s: s.get("coord_lost", 0) >= 2, actor="l2", what="coord_lost>=2")
    assert metric(srv, "kvsidecar_coordinator_event_posts_failed_total") >= 1
    assert "POST /events failed" in srv.sidecar.log_text()
    assert srv.sidecar.http_get("/readyz")[0] == 200


def test_events_past_the_queue_are_dropped_and_counted(cache_server, kv_pools, tmp_path):
    # Nobody at the URL: never registered, so the events wait in the queue,
    # which holds two; the other six of four chunks' L1 and L2 stores are
    # dropped.
    url = f"http://127.0.0.1:{free_port_range(1)}"
    srv = cache_server(overrides=overrides(tmp_path, url, **{"coordinator.event_queue_max": 2}))
    pools = kv_pools(seed=6)
    f = flow_for(srv, pools, 1)
    store_prompt(srv, f, tokens(4, salt=47), "r1", 4)
    srv.wait_stats(lambda s: s.get("coord_dropped", 0) == 6 and s.get("coord_queued", 0) == 2,
                   actor="l2", what="two queued, six dropped")
    assert metric(srv, "kvsidecar_coordinator_events_dropped_total") == 6
    assert srv.sidecar.http_get("/readyz")[0] == 200


def test_a_fleet_quota_at_the_coordinator_evicts_a_tenant_on_kvsidecar(cache_server, kv_pools,
                                                                      tmp_path, coordinator):
    # LMCache's coordinator sums each salt's L2 bytes from the reported
    # events; a salt over its quota gets DELETE /cache/objects (LMCache's
    # keys) sent to a registered server: here kvsidecar, which deletes the
    # files and reports the deletes back.
    co = coordinator("--eviction-check-interval", "0.2")
    srv = cache_server(overrides=overrides(tmp_path, co.url))
    port = srv.sidecar.http_port
    co.registered(port)
    pools = kv_pools(seed=7)
    plain, tenant = flow_for(srv, pools, 1), flow_for(srv, pools, 2, salt="tenant-a")
    toks_p, toks_t = tokens(2, salt=48), tokens(2, salt=49)
    store_prompt(srv, plain, toks_p, "p1", 2)
    store_prompt(srv, tenant, toks_t, "t1", 4)  # written counts both prompts' chunks
    keys_p = [key(h) for h in lmcache_hashes(toks_p)]
    keys_t = [key(h, "tenant-a") for h in lmcache_hashes(toks_t)]

    def placements(keys):  # in L2 (the fleet quota's tier)
        st, ans = request(co.port, "POST", "/directory/lookup", {"keys": keys})
        assert st == 200, ans
        return [sum(p["tier"] == "l2" for p in r["placements"]) for r in ans["results"]]
    wait_until(lambda: placements(keys_p + keys_t) == [1] * 4, 10, "four chunks reported")
    st, q = request(co.port, "PUT", "/quota/tenant-a", {"limit_gb": 0})
    assert st == 200, q
    folder = tmp_path / "l2"
    wait_until(lambda: placements(keys_t) == [0, 0], 15,
               "tenant-a's chunks evicted from the directory")
    left = sorted(p.name for p in folder.iterdir() if p.name.endswith(".data"))
    assert len(left) == 2 and not any("tenant-a" in n for n in left), left
    assert placements(keys_p) == [1, 1]  # a salt without a quota is exempt
    assert "Eviction dispatched" in co.log.read_text()
    # Shutdown: the last events, then the deregistration. As for an
    # LMCache server, the coordinator keeps L2 placements (the files
    # outlive the process; only delete events remove them).
    srv.sidecar.stop()
    assert co.instances() == []
    assert placements(keys_p + keys_t) == [1, 1, 0, 0]


@needs_redis
def test_redis_objects_are_reported_as_lmcache_resp(cache_server, kv_pools, redis, tmp_path,
                                                   coordinator):
    co = coordinator()
    srv = cache_server(overrides=overrides(
        tmp_path, co.url, **{"l2.disk.enabled": False, "l2.redis.enabled": True,
                             "l2.redis.endpoints": [f"127.0.0.1:{redis.port}"]}))
    port = srv.sidecar.http_port
    me = co.registered(port)
    f = flow_for(srv, kv_pools(seed=8), 1)
    toks = tokens(2, salt=50)
    store_prompt(srv, f, toks, "r1", 2)
    keys = [key(h) for h in lmcache_hashes(toks)]

    def placed():
        st, ans = request(co.port, "POST", "/directory/lookup", {"keys": keys})
        assert st == 200, ans
        return [sorted((p["instance_id"], p["tier"], p["backend"]) for p in r["placements"])
                for r in ans["results"]]
    wait_until(lambda: placed() == [[(me, "l1", "dram"), (me, "l2", "resp")]] * 2, 10,
               "two chunks in L1 and Redis")
    assert len(redis.keys()) == 2
