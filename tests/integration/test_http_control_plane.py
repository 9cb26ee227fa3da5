"""LMCache's HTTP control plane on kvsidecar's HTTP port, driven by
LMCache's own `lmcache` CLI (0.5.6 and 0.5.7rc2: tests/integration/
lmcache_cli.py), with chunks stored by LMCache 0.5.6's own client classes
(as test_cache_lmcache_client.py drives them).

What an operator sees is asserted: `lmcache ping kvcache`, `describe
kvcache`, `kvcache clear` (and the BlockRemoved events routers get), `quota
set/get/list/delete` with the usage the store accounts per cache_salt. The
same CLI commands run against LMCache's own http_server
(``python -m lmcache.v1.multiprocess.http_server`` from the engine venv)
where installed, and every field both should agree on is compared, so a
difference shows as a failing comparison. Per-salt quota eviction is tested
with two salts filling L1, and the bearer token off loopback.

Needs the engine venv (build-venv-engine: lmcache 0.5.6 with torch) for
the CLI and LMCache's server, build-wheels for 0.5.7rc2's CLI and 0.5.6's
client classes; each missing piece skips its tests with the reason.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

pytest.register_assert_rewrite("conftest_cache", "lmcache_client")

from conftest_cache import CHUNK, tokens
from kvsidecar_harness import Sidecar, free_port_range, wait_until
from lmcache_cli import REPO_ROOT, VENV, WHEELS, fields, release_env, run_cli
from lmcache_client import EVENT_HANDLE

pytest_plugins = ["conftest_cache"]

RELEASES = ["0.5.6", "0.5.7rc2"]
MODEL = "test-org/test-model"
PAGE = 16
CHUNK_BYTES = 64 * 1024  # kv_pools' default layout: 2 layers x 256 tokens x 2 x 2 x 16 x bf16
GIB = 1 << 30


@pytest.fixture(scope="module")
def lmc():
    wheels = sorted(WHEELS.glob("lmcache-0.5.6-*.whl"))
    if wheels:
        os.environ.setdefault("LMCACHE_WHEEL", str(wheels[0]))
    from test_cache_lmcache_client import _load_lmcache
    return _load_lmcache()


def cli(release: str, url: str, *commands: list[str]) -> list[dict]:
    env, why = release_env(release)
    if env is None:
        pytest.skip(why)
    return run_cli(release, [[*c, "--url", url] for c in commands])


def request(port: int, method: str, path: str, body: dict | None = None,
            token: str | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, path, json.dumps(body) if body is not None else None, headers)
        r = conn.getresponse()
        return r.status, json.loads(r.read().decode() or "null")
    finally:
        conn.close()


class Engine:
    """One registered instance of LMCache 0.5.6's client: stores and looks up."""

    def __init__(self, lmc, srv, pools, instance: int = 4900):
        from test_cache_lmcache_client import lmcache_wrappers
        self.lmc, self.srv, self.instance = lmc, srv, instance
        self.client = lmc.create_request_client(srv.endpoint, context=srv.ctx)
        assert self.client.register_kv_cache(instance, lmcache_wrappers(lmc, pools), MODEL, 1,
                                             lmc.EngineType.VLLM, {"kv_layout": "NHD"},
                                             []).result(timeout=5) is None
        self.n = 0

    def key(self, toks, salt: str, worker_id: int | None, rid: str):
        return self.lmc.IPCCacheServerKey(model_name=MODEL, world_size=1, worker_id=worker_id,
                                          token_ids=tuple(toks), start=0, end=len(toks),
                                          request_id=rid, cache_salt=salt,
                                          num_kv_readers=1 if worker_id is None else 0)

    def store(self, toks, salt: str) -> None:
        self.n += 1
        n_chunks = len(toks) // CHUNK
        _, ok = self.client.store(self.key(toks, salt, 0, f"s{self.n}"), self.instance,
                                  [list(range(n_chunks * CHUNK // PAGE))],
                                  EVENT_HANDLE).result(timeout=5)
        assert ok is True

    def hits(self, toks, salt: str) -> int:
        self.n += 1
        rid = f"l{self.n}"
        k = self.key(toks, salt, None, rid)
        assert self.client.lookup(k, 1).result(timeout=5) is None
        hit = self.client.wait_prefetch_status(rid, 30.0).result(timeout=5)
        assert self.client.free_lookup_locks(k, 1).result(timeout=5) is None
        assert self.client.end_session(rid).result(timeout=5) is None
        return hit

    def close(self) -> None:
        self.client.close()


@pytest.mark.parametrize("release", RELEASES)
def test_lmcache_cli_against_sidecar(release, lmc, cache_server, kv_pools):
    import vllm_structs as vs
    srv = cache_server(events=True)
    port = srv.sidecar.http_port
    url = f"http://127.0.0.1:{port}"
    eng = Engine(lmc, srv, kv_pools("vllm", num_blocks=160))
    try:
        eng.store(tokens(4, salt=71), "tenant-a")
        eng.store(tokens(2, salt=72), "")
        srv.events(6, kind=vs.BlockStored)
        srv.wait_stats(lambda s: s["chunks"] == 6)
        # Exact per-salt accounting, in LMCache's JSON.
        assert request(port, "GET", "/quota/tenant-a")[1]["current_usage_gb"] * GIB \
            == 4 * CHUNK_BYTES
        assert request(port, "GET", "/quota/_default")[1]["current_usage_gb"] * GIB \
            == 2 * CHUNK_BYTES
        r = cli(release, url, ["ping", "kvcache"], ["describe", "kvcache"],
                ["quota", "set", "tenant-a", "--limit-gb", "2"], ["quota", "get", "tenant-a"],
                ["quota", "list"], ["quota", "get", "_default"], ["kvcache", "clear"],
                ["describe", "kvcache"], ["quota", "delete", "tenant-a"],
                ["quota", "delete", "tenant-a"], ["quota", "set", "a@b", "--limit-gb", "1"],
                ["quota", "set", "t", "--limit-gb", "-1"])
        ping, desc, qset, qget, qlist, qdef, clear, desc2, qdel, qdel2, badsalt, badlimit = r
        assert ping["rc"] == 0 and fields(ping["out"])["Status"] == "OK", ping
        d = fields(desc["out"])
        assert desc["rc"] == 0, desc
        assert d["Health"] == "OK"
        assert d["Engine type"] == "kvsidecar"
        assert d["Chunk size"] == str(CHUNK)
        assert d["Cached objects"] == "6"
        assert d["L1 capacity (GB)"] == "0.06"  # cache.l1_size = 64MiB
        assert d["Eviction policy"] == "LRU"
        assert d["Active sessions"] == "0"
        assert fields(qset["out"]) == {"Cache salt": "tenant-a", "Limit (GB)": "2.00",
                                       "Status": "ok"}, qset
        assert fields(qget["out"]) == {"Cache salt": "tenant-a", "Limit (GB)": "2.00",
                                       "Current usage (GB)": "0.00", "Exists": "True"}, qget
        assert "Salt: tenant-a" in qlist["out"] and "_default" not in qlist["out"], qlist
        assert fields(qdef["out"])["Exists"] == "False"
        assert clear["rc"] == 0 and fields(clear["out"])["Status"] == "OK", clear
        removed = srv.events(6, kind=vs.BlockRemoved)
        assert len({e.block_hashes[0] for e in removed}) == 6
        assert fields(desc2["out"])["Cached objects"] == "0"
        assert fields(qdel["out"])["Status"] == "removed"
        assert fields(qdel2["out"])["Status"] == "not_found"
        assert badsalt["rc"] == 1 and "must not contain '@'" in badsalt["err"], badsalt
        assert badlimit["rc"] == 1 and "non-negative" in badlimit["err"], badlimit
        assert request(port, "GET", "/quota")[1] == {"users": {}}
        # The probes the kubelet uses are unchanged.
        assert srv.sidecar.http_get("/healthz") == (200, "ok\n")
        assert srv.sidecar.http_get("/readyz") == (200, "ready\n")
    finally:
        eng.close()


# -- the same commands against LMCache's own http_server -------------------------------


@pytest.fixture(scope="module")
def lmcache_server(tmp_path_factory):
    py = VENV / "bin" / "python"
    if not py.exists():
        pytest.skip(f"no engine venv at {VENV} (LMCache's own http_server)")
    zmq_port, http_port = free_port_range(1), free_port_range(1)
    log = tmp_path_factory.mktemp("lmcache-server") / "server.log"
    env = dict(os.environ, LMCACHE_DISABLE_BANNER="1")
    env.pop("PYTHONPATH", None)
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(py), "-m", "lmcache.v1.multiprocess.http_server", "--chunk-size", str(CHUNK),
             "--port", str(zmq_port), "--http-port", str(http_port), "--l1-size-gb", "0.0625",
             "--eviction-policy", "LRU"], stdout=out, stderr=subprocess.STDOUT, env=env)

    def up():
        if proc.poll() is not None:
            raise AssertionError(f"LMCache's server exited:\n{log.read_text()[-3000:]}")
        try:
            return request(http_port, "GET", "/healthcheck")[0] == 200
        except OSError:
            return False
    try:
        wait_until(up, 60, "LMCache's http_server up", interval=0.2)
        yield f"http://127.0.0.1:{http_port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


# Fields LMCache's server and kvsidecar show differently by design.
DIFFERENT_BY_DESIGN = {
    "URL",              # two servers
    "Engine type",      # MPCacheServer / kvsidecar
    "Eviction policy",  # LMCache 0.5.6's /status has no storage_manager.eviction_controller:
                        # its own describe shows "N/A"; kvsidecar serves it ("LRU")
    "Round trip time (ms)",
}


def test_cache_objects_calls_answer_as_on_lmcache_server(lmcache_server, tmp_path):
    """The /cache/objects and /cache/checksums calls whose answers compare:
    a key-addressed L1 delete (LMCache's body) answers the same on both; the
    rest differ by design (README), and both sides' statuses are pinned here
    so a change on either shows."""
    sc = Sidecar(tmp_path, {"events.enabled": False, "cache.l1_size": "64MiB",
                            "gpu.backend": "host",
                            "cache.endpoint": f"tcp://127.0.0.1:{free_port_range(1)}"}).start()
    theirs_port = int(lmcache_server.rsplit(":", 1)[1])
    try:
        key = {"chunk_hash_hex": "00000000000000ff", "model_name": MODEL, "kv_rank": 0,
               "object_group_id": 0, "cache_salt": "tenant-a"}
        for body in ({"keys": [key], "tier": "l1"}, {"keys": [], "tier": "l1"},
                     {"keys": [key], "tier": "l1", "force": False}):
            theirs = request(theirs_port, "DELETE", "/cache/objects", body)
            ours = request(sc.http_port, "DELETE", "/cache/objects", body)
            assert theirs == ours == (200, {"deleted": 0, "skipped": 0, "ok": True}), \
                (body, theirs, ours)
        # Listing: both list L2 by default (none configured: 503 on both);
        # a delete of L2 keys without L2 is a 503 on both. tier=l1: LMCache
        # 400, kvsidecar lists its L1 (by design).
        l2key = dict(key, chunk_hash_hex="ab" * 32)
        for path in ("/cache/objects", "/cache/objects?tier=l2"):
            assert request(theirs_port, "GET", path)[0] == request(sc.http_port, "GET", path)[0] \
                == 503, path
        assert request(theirs_port, "DELETE", "/cache/objects", {"keys": [l2key]})[0] \
            == request(sc.http_port, "DELETE", "/cache/objects", {"keys": [l2key]})[0] == 503
        assert request(theirs_port, "GET", "/cache/objects?tier=l1")[0] == 400
        assert request(sc.http_port, "GET", "/cache/objects?tier=l1") \
            == (200, {"adapter": "l1", "shared": False, "entries": [], "next_page_token": None})
        # Checksums by block ids need a registered instance: 404 from both
        # (test_cache_lmcache_bench.py compares the digests themselves).
        blocks = {"block_ids": [0, 1], "chunk_size": 16}
        theirs = request(theirs_port, "POST", "/cache/checksums", blocks)
        ours = request(sc.http_port, "POST", "/cache/checksums", blocks)
        assert theirs[0] == ours[0] == 404, (theirs, ours)
        assert theirs[1]["detail"] == ours[1]["detail"] == "instance_id 0 not registered"
    finally:
        sc.stop()


@pytest.mark.parametrize("release", RELEASES)
def test_cli_sees_the_same_as_on_lmcache_server(release, lmcache_server, tmp_path):
    sc = Sidecar(tmp_path, {"events.enabled": False, "cache.l1_size": "64MiB",
                            "gpu.backend": "host",
                            "cache.endpoint": f"tcp://127.0.0.1:{free_port_range(1)}"}).start()
    try:
        commands = [["ping", "kvcache"], ["describe", "kvcache"],
                    ["quota", "set", "tenant-a", "--limit-gb", "1.5"],
                    ["quota", "set", "_default", "--limit-gb", "0.25"],
                    ["quota", "get", "tenant-a"], ["quota", "get", "nobody"], ["quota", "list"],
                    ["kvcache", "clear"], ["quota", "delete", "tenant-a"],
                    ["quota", "delete", "tenant-a"], ["quota", "delete", "_default"],
                    ["quota", "list"], ["quota", "set", "t", "--limit-gb", "-1"]]
        theirs = cli(release, lmcache_server, *commands)
        ours = cli(release, f"http://127.0.0.1:{sc.http_port}", *commands)
        for cmd, t, o in zip(commands, theirs, ours):
            assert t["rc"] == o["rc"], (cmd, t, o)
            ft = {k: v for k, v in fields(t["out"]).items() if k not in DIFFERENT_BY_DESIGN}
            fo = {k: v for k, v in fields(o["out"]).items() if k not in DIFFERENT_BY_DESIGN}
            assert ft == fo, (cmd, t["out"], o["out"])
            if t["rc"] != 0:  # the same reason reaches the operator
                assert "limit_gb must be non-negative" in t["err"]
                assert "limit_gb must be non-negative" in o["err"]
    finally:
        sc.stop()


# -- quotas: two salts filling L1 ------------------------------------------------------


def _fill(lmc, cache_server, kv_pools, isolated: bool):
    o = {"cache.l1_size": "2MiB", "cache.evict_high": 0.9, "cache.evict_low": 0.8,
         "cache.quota_mode": "isolated" if isolated else "off"}
    srv = cache_server(overrides=o)
    port = srv.sidecar.http_port
    eng = Engine(lmc, srv, kv_pools("vllm", num_blocks=300))
    try:
        assert srv.slot_count() == 32  # 2 MiB of 64 KiB chunks
        # tenant-b: 16 chunks (1 MiB) allowed; tenant-a: 4 chunks.
        assert request(port, "PUT", "/quota/tenant-b", {"limit_gb": 16 * CHUNK_BYTES / GIB})[0] == 200
        assert request(port, "PUT", "/quota/tenant-a", {"limit_gb": 4 * CHUNK_BYTES / GIB})[0] == 200
        b = tokens(16, salt=80)
        eng.store(b, "tenant-b")
        srv.wait_stats(lambda s: s["stored"] == 16)
        a_runs = [tokens(4, salt=81 + i) for i in range(5)]
        for i, a in enumerate(a_runs):  # 20 chunks of tenant-a, 4 at a time: 36 in all
            eng.store(a, "tenant-a")
            srv.wait_stats(lambda s, n=16 + 4 * (i + 1): s["stored"] == n)
        return srv, port, eng, b, a_runs
    except BaseException:
        eng.close()
        raise


def test_quota_keeps_a_tenant_within_its_limit_and_off_the_others(lmc, cache_server, kv_pools):
    srv, port, eng, b, a_runs = _fill(lmc, cache_server, kv_pools, isolated=True)
    try:
        # tenant-a lost its own oldest chunks, exactly down to its limit ...
        qa = request(port, "GET", "/quota/tenant-a")[1]
        assert qa["current_usage_gb"] * GIB == 4 * CHUNK_BYTES and qa["exists"] is True
        assert eng.hits(a_runs[-1], "tenant-a") == 4
        assert all(eng.hits(a, "tenant-a") == 0 for a in a_runs[:-1])
        # ... and tenant-b, stored before all of it, lost nothing.
        assert request(port, "GET", "/quota/tenant-b")[1]["current_usage_gb"] * GIB \
            == 16 * CHUNK_BYTES
        assert eng.hits(b, "tenant-b") == 16
        status = request(port, "GET", "/status")[1]
        assert status["storage_manager"]["l1_manager"]["total_object_count"] == 20
        assert status["storage_manager"]["eviction_controller"]["eviction_policy"] == "IsolatedLRU"
        assert status["kvsidecar"]["quota_evicted_chunks_total"] == 16
        assert "l2" not in status["kvsidecar"]  # no L2 tier configured
        body = srv.sidecar.http_get("/metrics")[1]
        assert "(undocumented)" not in body
        m = srv.sidecar.metrics()
        assert m[("kvsidecar_cache_quota_evictions_total", frozenset())] == 16
        assert m[("kvsidecar_cache_salt_bytes", frozenset({("salt", "tenant-b")}))] \
            == 16 * CHUNK_BYTES
        assert m[("kvsidecar_cache_salt_limit_bytes", frozenset({("salt", "tenant-a")}))] \
            == 4 * CHUNK_BYTES
        # Allowlist: un-salted traffic has no quota, so it is not kept.
        eng.store(tokens(2, salt=90), "")
        srv.wait_stats(lambda s: s["stored"] == 38)
        assert request(port, "GET", "/quota/_default")[1]["current_usage_gb"] == 0
        # Lowering a limit trims at once.
        assert request(port, "PUT", "/quota/tenant-b", {"limit_gb": 8 * CHUNK_BYTES / GIB}) \
            == (200, {"cache_salt": "tenant-b", "limit_gb": 8 * CHUNK_BYTES / GIB,
                      "status": "ok", "evicted_chunks": 8})
        assert eng.hits(b, "tenant-b") == 0  # its oldest (the prefix's start) went first
    finally:
        eng.close()


def test_without_quotas_the_same_stores_evict_the_other_tenant(lmc, cache_server, kv_pools):
    """The control: quota_mode "off" records the limits but L1's one LRU
    list evicts tenant-b's older chunks for tenant-a's."""
    srv, port, eng, b, a_runs = _fill(lmc, cache_server, kv_pools, isolated=False)
    try:
        assert eng.hits(a_runs[-1], "tenant-a") == 4
        assert eng.hits(b, "tenant-b") < 16
        assert request(port, "GET", "/quota/tenant-a")[1]["current_usage_gb"] * GIB \
            > 4 * CHUNK_BYTES
    finally:
        eng.close()


# -- off loopback: the token -------------------------------------------------------------


def test_off_loopback_state_changes_need_the_token(tmp_path):
    token = "s3cret-token-0123456789"
    port = free_port_range(1)
    sc = Sidecar(tmp_path, {"events.enabled": False, "cache.l1_size": "64MiB",
                            "gpu.backend": "host", "http.listen": f"0.0.0.0:{port}",
                            "http.admin_token": token,
                            "cache.endpoint": f"tcp://127.0.0.1:{free_port_range(1)}"}).start()
    try:
        # Reads stay open.
        assert request(port, "GET", "/status")[0] == 200
        assert request(port, "GET", "/quota")[0] == 200
        assert sc.http_get("/healthz")[0] == 200
        # State changes: 401 with the reason, unless the bearer token is right.
        for method, path, body in (("POST", "/cache/clear", {"tier": "l1"}),
                                   ("PUT", "/quota/t", {"limit_gb": 1}),
                                   ("DELETE", "/quota/t", None)):
            st, js = request(port, method, path, body)
            assert st == 401 and "Authorization: Bearer" in js["error"], (path, js)
            assert request(port, method, path, body, token="wrong-token-0123456")[0] == 401
            assert request(port, method, path, body, token=token)[0] == 200, path
        env, why = release_env("0.5.6")
        if env is not None:  # LMCache's CLI sends no token: its clear is refused, visibly
            (ping, clear), = [run_cli("0.5.6", [["ping", "kvcache", "--url", f"http://127.0.0.1:{port}"],
                                                ["kvcache", "clear", "--url", f"http://127.0.0.1:{port}"]])]
            assert fields(ping["out"])["Status"] == "OK"
            assert clear["rc"] == 1 and "Bearer" in clear["err"], clear
        m = sc.metrics()
        assert m[("kvsidecar_http_requests_total", frozenset({("code", "401")}))] >= 6
    finally:
        sc.stop()


def test_quotas_from_the_config_are_served(tmp_path):
    """[cache.quotas] (here by --set) is what GET /quota lists at start,
    "_default" being the empty salt; GET /config shows it, secrets redacted."""
    sc = Sidecar(tmp_path, {"events.enabled": False, "cache.l1_size": "64MiB",
                            "gpu.backend": "host", "cache.quota_mode": "isolated",
                            "cache.quotas.tenant-x": "1GiB", "cache.quotas._default": "512MiB",
                            "cache.endpoint": f"tcp://127.0.0.1:{free_port_range(1)}"}).start()
    try:
        st, js = request(sc.http_port, "GET", "/quota")
        assert st == 200
        assert js == {"users": {"tenant-x": {"limit_gb": 1.0, "current_usage_gb": 0.0},
                                "_default": {"limit_gb": 0.5, "current_usage_gb": 0.0}}}
        cfg = request(sc.http_port, "GET", "/config")[1]
        assert cfg["cache"]["quotas"] == {"tenant-x": "1GiB", "_default": "512MiB"}
        assert cfg["http"]["admin_token"] == "<redacted>"
        assert cfg["l2"]["redis"]["password"] == "<redacted>"
    finally:
        sc.stop()


def completed_prefetch(port: int, rid: str) -> dict:
    """Polls GET /cache/prefetches/{rid} until it reports completed."""
    def completed():
        st, s = request(port, "GET", f"/cache/prefetches/{rid}")
        assert st == 200 and s["status"] in ("pending", "completed"), s
        return s if s["status"] == "completed" else None
    return wait_until(completed, 10, f"prefetch {rid} completed", interval=0.02)


def test_prefetch_by_token_ids_loads_l2_into_l1(lmc, cache_server, kv_pools, tmp_path):
    """POST /cache/prefetches (LMCache's PrefetchRequest) warms L1 from the
    disk tier after a clear; GET /cache/prefetches/{id} reports pending or
    completed with found/total keys once, then 404 as LMCache does."""
    srv = cache_server(overrides={"l2.disk.enabled": True, "l2.disk.path": str(tmp_path / "l2"),
                                  "l2.disk.size": "16MiB"})
    port = srv.sidecar.http_port
    eng = Engine(lmc, srv, kv_pools("vllm", num_blocks=160))
    try:
        toks = tokens(3, salt=95)
        eng.store(toks, "tenant-p")
        srv.wait_stats(lambda s: s["written"] >= 3, actor="l2", timeout=10, what="written=3")
        stored_usage = request(port, "GET", "/quota/tenant-p")[1]["current_usage_gb"]
        assert stored_usage > 0
        assert request(port, "POST", "/cache/clear")[1]["chunks"] == 3
        srv.wait_stats(lambda s: s["chunks"] == 0)
        assert request(port, "GET", "/quota/tenant-p")[1]["current_usage_gb"] == 0
        body = {"model_name": MODEL, "world_size": 1, "token_ids": toks + [7] * 10,
                "cache_salt": "tenant-p"}
        st, js = request(port, "POST", "/cache/prefetches", body)
        assert st == 202 and js["chunks"] == 3 and js["status"] == "submitted", js
        rid = js["request_id"]
        done = completed_prefetch(port, rid)
        assert done == {"request_id": rid, "status": "completed", "found_keys": 3,
                        "total_keys": 3}
        assert request(port, "GET", f"/cache/prefetches/{rid}")[0] == 404  # reported once
        # In L1 now, and the prefetch holds no lock.
        srv.wait_stats(lambda s: s["chunks"] == 3 and s["locks"] == 0 and s["sessions"] == 0)
        # Loaded back from L2, the chunks count against their salt again.
        assert request(port, "GET", "/quota/tenant-p")[1]["current_usage_gb"] == stored_usage
        status = request(port, "GET", "/status")[1]
        assert status["kvsidecar"]["l2"]["prefetched_chunks_total"] == 3
        assert status["storage_manager"]["l1_manager"]["total_object_count"] == 3
        # Another salt's identity finds nothing; a sub-chunk sequence is a no-op.
        st, js = request(port, "POST", "/cache/prefetches", dict(body, cache_salt="other"))
        miss = completed_prefetch(port, js["request_id"])
        assert miss["found_keys"] == 0 and miss["total_keys"] == 3
        assert request(port, "POST", "/cache/prefetches",
                       dict(body, token_ids=[1, 2, 3])) == (202, {"chunks": 0, "status": "noop"})
    finally:
        eng.close()


def disk_l2_with_three_chunks(lmc, cache_server, kv_pools, path, salt, tenant):
    """A sidecar with events and a 16 MiB disk L2 at `path`, an engine that
    stored 3 chunks under `tenant`, and their BlockStored "DISK" hashes in
    announcement order (each chunk written to L2 and announced first)."""
    import vllm_structs as vs
    srv = cache_server(events=True, overrides={"l2.disk.enabled": True,
                                               "l2.disk.path": str(path),
                                               "l2.disk.size": "16MiB"})
    eng = Engine(lmc, srv, kv_pools("vllm", num_blocks=160))
    try:
        eng.store(tokens(3, salt=salt), tenant)
        srv.wait_stats(lambda s: s["written"] >= 3, actor="l2", timeout=10, what="written=3")
        stored = srv.events(6, kind=vs.BlockStored, timeout=10)
        on_disk = [h for e in stored if e.medium == "DISK" for h in e.block_hashes]
        assert len(on_disk) == 3 and len(list(path.glob("*.kvl2"))) == 3, on_disk
    except BaseException:
        eng.close()
        raise
    return srv, eng, on_disk


def test_clear_by_tier_empties_the_disk_tier_with_its_events(lmc, cache_server, kv_pools, tmp_path):
    """POST /cache/clear {"tier": "l2"} removes the node-local disk tier's
    files, each announced chunk with a BlockRemoved "DISK", and leaves L1;
    {"tier": "all"} empties L1 as well; without an L2 tier "l2" is a 400."""
    import vllm_structs as vs
    path = tmp_path / "l2"
    srv, eng, on_disk = disk_l2_with_three_chunks(lmc, cache_server, kv_pools, path, 96, "tenant-c")
    on_disk = sorted(on_disk)
    port = srv.sidecar.http_port
    try:
        st, js = request(port, "POST", "/cache/clear", {"tier": "l2"})
        after = srv.mark()
        assert st == 200 and js == {"status": "ok", "cleared": {"tier": "l2"},
                                    "l2_objects": 3}, js
        removed = srv.events(1, kind=vs.BlockRemoved, timeout=10)
        assert sorted(h for e in removed if e.medium == "DISK" for h in e.block_hashes) == on_disk
        assert not list(path.glob("*.kvl2"))
        # L1 untouched: a stats line written after the call still counts 3.
        srv.wait_stats(lambda s: s["chunks"] == 3, mark=after, what="chunks=3")
        st, js = request(port, "POST", "/cache/clear", {"tier": "all"})
        assert st == 200 and js["chunks"] == 3 and js["l2_objects"] == 0, js
        srv.wait_stats(lambda s: s["chunks"] == 0)
    finally:
        eng.close()
    plain = cache_server()
    st, js = request(plain.sidecar.http_port, "POST", "/cache/clear", {"tier": "l2"})
    assert st == 400 and "no L2 tier" in js["detail"], js


def test_objects_on_l2_by_default_listed_and_deleted_by_key(lmc, cache_server, kv_pools,
                                                            tmp_path):
    """GET /cache/objects with no tier lists the L2 disk tier (LMCache's
    default tier): one entry per file, its key the BlockStored hash, rank and
    salt, oldest first, paged; DELETE /cache/objects with those keys and no
    tier removes exactly those files, each announced BlockRemoved "DISK",
    and leaves L1; an unknown adapter is a 404, tier=l1 still lists L1."""
    import vllm_structs as vs
    path = tmp_path / "l2"
    srv, eng, on_disk = disk_l2_with_three_chunks(lmc, cache_server, kv_pools, path, 97, "tenant-d")
    port = srv.sidecar.http_port
    try:
        entries, pages = list_all(port, tier="l2")
        assert pages == 2  # 3 objects, 2 a page
        assert [int(e["key"]["chunk_hash_hex"], 16) for e in entries] == [u64(h) for h in on_disk]
        for e in entries:
            assert e["key"]["kv_rank"] == 0 and e["key"]["object_group_id"] == 0
            assert e["key"]["cache_salt"] == "tenant-d" and e["size_bytes"] == CHUNK_BYTES
            assert "tier" not in e  # LMCache's KeyEntry: key and size_bytes
        st, js = request(port, "GET", "/cache/objects?adapter=disk")
        assert st == 200 and js["adapter"] == "disk" and js["shared"] is False
        assert len(js["entries"]) == 3 and js["next_page_token"] is None
        assert request(port, "GET", "/cache/objects?adapter=s3")[0] == 404
        keys = [e["key"] for e in entries[:2]]
        assert request(port, "DELETE", "/cache/objects", {"keys": keys}) \
            == (200, {"deleted": 2, "skipped": 0, "ok": True})
        after = srv.mark()
        removed = srv.events(1, kind=vs.BlockRemoved)
        assert sorted(h for e in removed if e.medium == "DISK" for h in e.block_hashes) \
            == sorted(on_disk[:2])
        assert len(list(path.glob("*.kvl2"))) == 1
        assert [e["key"] for e in list_all(port, tier="l2")[0]] == [entries[2]["key"]]
        # L1 untouched: a stats line written after the call still counts 3.
        srv.wait_stats(lambda s: s["chunks"] == 3, mark=after, what="chunks=3")
        assert len(list_all(port)[0]) == 3  # tier=l1 lists L1's
        # A key of LMCache's format (32-byte hash) names nothing in kvsidecar's.
        st, js = request(port, "DELETE", "/cache/objects",
                         {"keys": [dict(keys[0], chunk_hash_hex="ab" * 32)]})
        assert st == 400 and "keys[0]" in js["detail"], js
    finally:
        eng.close()


# -- cache objects: listed, deleted by salt, checksummed --------------------------------


def list_all(port: int, query: str = "", page_size: int = 2,
             tier: str = "l1") -> tuple[list[dict], int]:
    """Every entry of GET /cache/objects, page by page; and the page count."""
    entries, token, pages = [], None, 0
    while True:
        q = f"tier={tier}&page_size={page_size}" + (f"&page_token={token}" if token else "") \
            + (f"&{query}" if query else "")
        st, js = request(port, "GET", f"/cache/objects?{q}")
        assert st == 200, js
        assert set(js) == {"adapter", "shared", "entries", "next_page_token"}, js
        assert len(js["entries"]) <= page_size
        entries += js["entries"]
        pages += 1
        token = js["next_page_token"]
        if token is None:
            return entries, pages
        assert pages < 100, "the listing never ends"


def u64(h: int) -> int:
    return h & ((1 << 64) - 1)


def test_objects_listed_deleted_by_salt_and_checksummed(lmc, cache_server, kv_pools):
    """GET /cache/objects pages add up to what LMCache's client stored, with
    model, salt, size and lock; DELETE /cache/objects by cache_salt drops
    exactly that salt's chunks with BlockRemoved for each and leaves the
    other salt's; POST /cache/checksums gives the MD5 of the bytes stored."""
    import hashlib
    import vllm_structs as vs
    srv = cache_server(events=True)
    port = srv.sidecar.http_port
    pools = kv_pools("vllm", num_blocks=160)
    eng = Engine(lmc, srv, pools)
    try:
        a_toks, b_toks = tokens(3, salt=61), tokens(2, salt=62)
        eng.store(a_toks, "tenant-a")
        stored_a = srv.events(3, kind=vs.BlockStored)
        eng.store(b_toks, "")
        stored_b = srv.events(2, kind=vs.BlockStored)
        srv.wait_stats(lambda s: s["chunks"] == 5)
        hashes_a = {u64(e.block_hashes[0]) for e in stored_a}
        hashes_b = {u64(e.block_hashes[0]) for e in stored_b}

        entries, pages = list_all(port)
        assert pages == 3  # 5 chunks, 2 a page
        assert len(entries) == 5
        by_hash = {int(e["key"]["chunk_hash_hex"], 16): e for e in entries}
        assert set(by_hash) == hashes_a | hashes_b
        for h, e in by_hash.items():
            assert e["key"]["model_name"] == MODEL and e["key"]["kv_rank"] == 0
            assert e["key"]["cache_salt"] == ("tenant-a" if h in hashes_a else "")
            assert e["size_bytes"] == CHUNK_BYTES and e["tier"] == "l1"
            assert e["locked"] is False
        # Filters: by salt ("_default" is the empty one) and by model.
        assert {int(e["key"]["chunk_hash_hex"], 16)
                for e in list_all(port, "cache_salt=tenant-a")[0]} == hashes_a
        assert len(list_all(port, "cache_salt=_default", page_size=100)[0]) == 2
        assert list_all(port, "model_name=other%2Fmodel")[0] == []
        st, js = request(port, "GET", "/cache/objects?tier=l1")  # default page: all 5, no next
        assert st == 200 and len(js["entries"]) == 5 and js["next_page_token"] is None
        assert request(port, "GET", "/cache/objects?tier=l1&page_size=5001")[0] == 422
        assert request(port, "GET", "/cache/objects")[0] == 503  # L2, LMCache's default: none

        # Checksums: MD5 of each chunk's bytes as stored (KV_2LTD: K then V,
        # layer by layer, the chunk's 16 pages of 16 tokens in order).
        def chunk_bytes(i: int) -> bytes:
            blocks = range(i * CHUNK // PAGE, (i + 1) * CHUNK // PAGE)
            return b"".join(pools.page(kv, layer, b) for kv in range(2)
                            for layer in range(pools.num_layers) for b in blocks)
        body = {"model_name": MODEL, "world_size": 1, "token_ids": a_toks + [5] * 7,
                "cache_salt": "tenant-a"}
        st, js = request(port, "POST", "/cache/checksums", body)
        assert st == 200, js
        assert js["num_chunks"] == 3 and js["chunk_size"] == CHUNK and js["layerwise"] is False
        assert js["chunk_checksums"] == [hashlib.md5(chunk_bytes(i)).hexdigest()
                                         for i in range(3)]
        assert js["token_ranges"] == [[0, CHUNK], [CHUNK, 2 * CHUNK], [2 * CHUNK, 3 * CHUNK]]
        # Another salt's identity has no such chunks; the locks went back.
        st, js = request(port, "POST", "/cache/checksums", dict(body, cache_salt="other"))
        assert st == 200 and js["chunk_checksums"] == [None, None, None]
        srv.wait_stats(lambda s: s["locks"] == 0)
        # The block-id form reads an instance's registered KV: not instance 0's here.
        st, js = request(port, "POST", "/cache/checksums", {"block_ids": [0, 1], "chunk_size": 16})
        assert st == 404 and js["detail"] == "instance_id 0 not registered"

        # Delete by salt: exactly tenant-a's chunks go, announced.
        st, js = request(port, "DELETE", "/cache/objects", {"cache_salt": "tenant-a",
                                                            "tier": "l1"})
        assert (st, js) == (200, {"deleted": 3, "skipped": 0, "ok": True})
        removed = srv.events(3, kind=vs.BlockRemoved)
        assert {u64(e.block_hashes[0]) for e in removed} == hashes_a
        srv.assert_no_events()
        left = list_all(port)[0]
        assert {int(e["key"]["chunk_hash_hex"], 16) for e in left} == hashes_b
        assert request(port, "GET", "/quota/tenant-a")[1]["current_usage_gb"] == 0
        # A chunk a reader holds stays, and is said to.
        k = eng.key(b_toks, "", None, "held")
        assert eng.client.lookup(k, 1).result(timeout=5) is None
        assert eng.client.wait_prefetch_status("held", 30.0).result(timeout=5) == 2
        assert all(e["locked"] for e in list_all(port)[0])
        assert request(port, "DELETE", "/cache/objects", {"cache_salt": "", "tier": "l1"}) \
            == (200, {"deleted": 0, "skipped": 2, "ok": True})
        assert eng.client.free_lookup_locks(k, 1).result(timeout=5) is None
        assert eng.client.end_session("held").result(timeout=5) is None
        assert eng.hits(b_toks, "") == 2
        # LMCache's own body: the keys as listed. One of salt b's goes; a key
        # naming the wrong salt or model matches nothing.
        listed = [e["key"] for e in list_all(port)[0]]
        wrong = [dict(listed[1], cache_salt="tenant-a"), dict(listed[1], model_name="x/y")]
        assert request(port, "DELETE", "/cache/objects", {"keys": wrong, "tier": "l1"}) \
            == (200, {"deleted": 0, "skipped": 0, "ok": True})
        assert request(port, "DELETE", "/cache/objects", {"keys": listed[:1], "tier": "l1"}) \
            == (200, {"deleted": 1, "skipped": 0, "ok": True})
        gone = srv.events(1, kind=vs.BlockRemoved)
        assert [u64(e.block_hashes[0]) for e in gone] == [int(listed[0]["chunk_hash_hex"], 16)]
        assert [e["key"] for e in list_all(port)[0]] == listed[1:]
        # Nothing left to match: nothing deleted; a filter is required.
        assert request(port, "DELETE", "/cache/objects",
                       {"cache_salt": "tenant-a", "tier": "l1"})[1]["deleted"] == 0
        assert request(port, "DELETE", "/cache/objects", {"tier": "l1"})[0] == 400
        assert request(port, "DELETE", "/cache/objects",
                       {"cache_salt": "a@b", "tier": "l1"})[0] == 400
    finally:
        eng.close()
