"""A warm prefetch routed through LMCache 0.5.6's fleet coordinator lands
in kvsidecar's L1, as it lands in an LMCache server's.

The coordinator's ``POST /cache/prefetches {"instance_id", "model_name",
"world_size", "token_ids", "cache_salt"}`` forwards the body (less the
instance) to that instance's ``POST /cache/prefetches`` and relays its
``request_id``; ``GET /cache/prefetches/{instance_id}/{request_id}`` on the
coordinator proxies ``GET /cache/prefetches/{request_id}`` on the server
(lmcache.v1.mp_coordinator.controllers.prefetch_manager). What is checked,
with the real coordinator and LMCache's MP client protocol:
- chunks stored to the disk tier, then dropped from L1 (POST /cache/clear
  {"tier": "l1"}), are back in L1 after the coordinator's prefetch: the
  store's stats line counts them, GET /cache/objects?tier=l1 lists them,
  and the proxied status says completed with every key found;
- a LOOKUP + RETRIEVE then hits them all, served from L1 (no further L2
  read), byte for byte;
- an unregistered instance is the coordinator's 404; a sub-chunk sequence
  its "noop".

Needs the engine venv (build-venv-engine, lmcache 0.5.6) and the blake3
package; skips with the reason without them.
"""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("conftest_cache", "lmcache_client")

from conftest_cache import tokens
from kvsidecar_harness import wait_until
from test_coordinator_events import overrides
from test_http_control_plane import request
from conftest_cache import CHUNK, pages_equal
from test_cache_l2_lmcache import CHUNK_BYTES, MODEL, blocks, flow_for, store_prompt

pytest_plugins = ["conftest_cache", "lmcache_coordinator"]


def test_a_coordinator_routed_prefetch_lands_in_l1(cache_server, kv_pools, tmp_path,
                                                   coordinator):
    co = coordinator()
    srv = cache_server(overrides=overrides(tmp_path, co.url))
    port = srv.sidecar.http_port
    me = co.registered(port)
    pools = kv_pools(seed=11)
    f = flow_for(srv, pools, 1, salt="tenant-w")
    toks = tokens(3, salt=51)
    store_prompt(srv, f, toks, "r1", 3)
    st, js = request(port, "POST", "/cache/clear", {"tier": "l1"})
    assert st == 200 and js["chunks"] == 3, js
    cleared = srv.wait_stats(lambda s: s["chunks"] == 0, what="L1 empty")
    assert cleared["chunks"] == 0
    l2_before = srv.wait_stats(lambda s: True, actor="l2")

    body = {"instance_id": me, "model_name": MODEL, "world_size": 1,
            "token_ids": toks + [5] * 7, "cache_salt": "tenant-w"}
    st, sub = request(co.port, "POST", "/cache/prefetches", body)
    assert st == 200, sub
    assert sub["instance_id"] == me and sub["chunks"] == 3 \
        and sub["status"] == "submitted" and sub["request_id"], sub

    def completed():
        st, s = request(co.port, "GET", f"/cache/prefetches/{me}/{sub['request_id']}")
        assert st == 200 and s["status"] in ("pending", "completed"), (st, s)
        return s if s["status"] == "completed" else None
    done = wait_until(completed, 10, "the proxied prefetch completed", interval=0.05)
    assert (done["found_keys"], done["total_keys"]) == (3, 3), done
    # Reported once, as LMCache's server: the coordinator relays the 404.
    assert request(co.port, "GET", f"/cache/prefetches/{me}/{sub['request_id']}")[0] == 404

    srv.wait_stats(lambda s: s["chunks"] == 3 and s["locks"] == 0, what="3 chunks in L1")
    st, objs = request(port, "GET", "/cache/objects?tier=l1")
    assert st == 200 and len(objs["entries"]) == 3, objs
    assert {(o["tier"], o["key"]["cache_salt"], o["size_bytes"]) for o in objs["entries"]} \
        == {("l1", "tenant-w", CHUNK_BYTES)}, objs
    fetched = srv.wait_stats(lambda s: s["fetched_disk"] >= l2_before["fetched_disk"] + 3,
                             actor="l2", what="3 chunks fetched from L2")

    # The engine's LOOKUP + RETRIEVE hit all three from L1, byte for byte.
    assert f.lookup_kv(toks, "r2") == 3 * CHUNK
    assert f.retrieve_kv("r2", blocks(64, 3)) == 3 * CHUNK
    f.end_session("r2")
    f.drain()
    assert not pages_equal(pools, blocks(64, 3), pools, blocks(0, 3))
    after = srv.wait_stats(lambda s: True, actor="l2")
    assert after["fetched_disk"] == fetched["fetched_disk"], "the retrieve read L2 again"

    st, nf = request(co.port, "POST", "/cache/prefetches", dict(body, instance_id="nobody"))
    assert st == 404 and "nobody" in nf["detail"], nf
    st, noop = request(co.port, "POST", "/cache/prefetches", dict(body, token_ids=[1, 2]))
    assert st == 200 and noop == {"instance_id": me, "request_id": "", "chunks": 0,
                                  "status": "noop"}, noop
