"""L2 quotas side by side with LMCache's own server (issue #45): LMCache
0.5.6's http_server with its `fs` L2 adapter under the IsolatedLRU eviction
policy, and kvsidecar with l2.format = "lmcache", its folder and
l2.quota_mode = "isolated", each with a folder of its own. The same
prompts of three tenants are stored into each by LMCache's own client
(lmcache_l2_driver.py), the same quotas set through the same /quota calls:

- while both tenants a and b are under their quotas nothing goes, and a
  tenant without a quota (c) loses all its L2 objects (the allowlist rule);
- when a's quota is lowered below what it holds, both servers evict a's
  own least recently used objects, pass after pass, down to the same
  survivors -- the same file names, b's untouched -- and /quota reports the
  same L2 usage on both;
- GET /cache/objects (tier l2 by default) lists kvsidecar's folder with
  LMCache's keys, and the same key-addressed DELETE /cache/objects removes
  the same files on both, with the same answer and usage.

Needs the engine venv (build-venv-engine); skipped without it. Run:
  KVSIDECAR_BIN=<build>/kvsidecar python3 -m pytest -q tests/integration/test_cache_l2_quota_lmcache.py
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.register_assert_rewrite("conftest_cache")

from kvsidecar_harness import free_port_range, wait_until
from lmcache_l2_fleet import PYTHON, Fleet, release_env
from test_http_control_plane import request

pytest_plugins = ["conftest_cache"]

CHUNK_BYTES = 2 * 1024 * 1024
MIB = 1 << 20
GIB = 1 << 30
ISOLATED = {"eviction_policy": "IsolatedLRU", "trigger_watermark": 0.8, "eviction_ratio": 0.2}


class LMCacheHttpServer:
    """`python -m lmcache.v1.multiprocess.http_server`: the MP server and its
    HTTP API (/quota) in one process, with one L2 adapter."""

    def __init__(self, workdir: Path, env: dict, adapter: dict, extra: tuple[str, ...] = ()):
        self.port, self.http_port = free_port_range(1), free_port_range(1)
        self.url = f"tcp://127.0.0.1:{self.port}"
        self.log = workdir / "lmcache-server.log"
        workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [str(PYTHON), "-m", "lmcache.v1.multiprocess.http_server", "--host", "127.0.0.1",
             "--port", str(self.port), "--http-port", str(self.http_port), "--chunk-size", "256",
             "--l1-size-gb", "1", "--eviction-policy", "LRU",
             "--l2-adapter", json.dumps(adapter), *extra],
            env=env, stdin=subprocess.DEVNULL, stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT)

        def up():
            assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]
            try:
                return request(self.http_port, "GET", "/healthcheck")[0] == 200
            except OSError:
                return False
        wait_until(up, 90, "LMCache's http_server up", interval=0.2)

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


def by_salt(folder: Path) -> dict[str, set[str]]:
    """The folder's object files by the salt their names end with."""
    out: dict[str, set[str]] = {}
    for p in folder.iterdir():
        if not p.name.endswith(".data"):
            continue
        fields = p.name[:-len(".data")].split("@")
        out.setdefault(fields[4] if len(fields) == 5 else "", set()).add(p.name)
    return out


def test_l2_quotas_evict_the_same_objects_as_lmcache(cache_server, tmp_path):
    if not PYTHON.is_file():
        pytest.skip(f"no engine venv at {PYTHON.parents[1]}")
    env = release_env("0.5.6")
    theirs_dir, ours_dir = tmp_path / "lmcache-l2", tmp_path / "kvsidecar-l2"
    theirs_dir.mkdir()
    lmc = LMCacheHttpServer(tmp_path / "lmc", env,
                            {"type": "fs", "base_path": str(theirs_dir), "eviction": ISOLATED})
    fleet = None
    try:
        kvs = cache_server(overrides={"l2.format": "lmcache", "l2.disk.enabled": True,
                                      "l2.disk.path": str(ours_dir), "l2.disk.size": "1GiB",
                                      "l2.quota_mode": "isolated", "l2.quota_watermark": 0.8,
                                      "l2.quota_eviction_ratio": 0.2,
                                      "cache.l1_size": "128MiB"})
        servers = [(lmc.url, lmc.http_port, theirs_dir),
                   (kvs.endpoint, kvs.sidecar.http_port, ours_dir)]
        # Room for everything first: a and b under their quotas.
        for _, http, _ in servers:
            for salt in ("tenant-a", "tenant-b"):
                assert request(http, "PUT", f"/quota/{salt}", {"limit_gb": 1.0})[0] == 200
        fleet = Fleet(env)
        model = "org/quota"
        # a: 3 prompts (12 chunks), b: 2 (8), c: 1 (4), each prompt's 4
        # objects in L2 before the next is stored (one batch each, as both
        # servers write them).
        plan = [("tenant-a", 1), ("tenant-b", 2), ("tenant-a", 3), ("tenant-c", 4),
                ("tenant-b", 5), ("tenant-a", 6)]
        for url, _, folder in servers:
            held = {"tenant-a": 0, "tenant-b": 0}
            for salt, p in plan:
                assert fleet.step("store", url, model=model, salt=salt, seed=p, prompt=p)["ok"]
                if salt in held:
                    held[salt] += 4
                    n = held[salt]
                    wait_until(lambda f=folder, s=salt, n=n: len(by_salt(f).get(s, ())) == n, 30,
                               f"{salt}: {n} objects in {folder.name}")
        # c has no quota: its objects go on the next pass, on both.
        for _, http, folder in servers:
            wait_until(lambda f=folder: "tenant-c" not in by_salt(f), 30, "tenant-c evicted")
            assert {s: len(n) for s, n in by_salt(folder).items()} == {"tenant-a": 12,
                                                                      "tenant-b": 8}
        usage = [request(http, "GET", "/quota/tenant-a")[1] for _, http, _ in servers]
        assert usage[0] == usage[1] and usage[0]["current_usage_gb"] == 12 * CHUNK_BYTES / GIB
        # a's quota below what it holds: 10 MiB, evicted under 0.8 x 10 MiB.
        for _, http, _ in servers:
            assert request(http, "PUT", "/quota/tenant-a", {"limit_gb": 10 * MIB / GIB})[0] == 200
        for _, _, folder in servers:
            wait_until(lambda f=folder: len(by_salt(f)["tenant-a"]) == 3, 60,
                       "tenant-a down to 3 objects (6 MiB < 0.8 x 10 MiB)")
        theirs, ours = by_salt(theirs_dir), by_salt(ours_dir)
        assert ours == theirs  # the same survivors, by name
        assert len(ours["tenant-b"]) == 8
        for salt in ("tenant-a", "tenant-b"):
            t = request(lmc.http_port, "GET", f"/quota/{salt}")[1]
            o = request(kvs.sidecar.http_port, "GET", f"/quota/{salt}")[1]
            assert t == o, (salt, t, o)
        assert request(kvs.sidecar.http_port, "GET", "/quota/tenant-a")[1]["current_usage_gb"] \
            == 3 * CHUNK_BYTES / GIB

        # Objects on L2, LMCache's default tier: kvsidecar lists its folder
        # page by page with LMCache's keys (LMCache 0.5.6's fs adapter cannot
        # list: 503), each key naming a file there.
        assert request(lmc.http_port, "GET", "/cache/objects")[0] == 503
        entries, token = [], None
        while True:
            q = "/cache/objects?page_size=4" + (f"&page_token={token}" if token else "")
            st, page = request(kvs.sidecar.http_port, "GET", q)
            assert st == 200 and page["adapter"] == "disk" and page["shared"] is False, page
            assert len(page["entries"]) <= 4
            entries += page["entries"]
            token = page["next_page_token"]
            if token is None:
                break
        assert len(entries) == 11 and all(e["size_bytes"] == CHUNK_BYTES for e in entries)
        named = {"{}@0x{:08x}@{:x}@{}@{}.data".format(
            k["model_name"].replace("/", "-SEP-"), k["kv_rank"], k["object_group_id"],
            k["chunk_hash_hex"], k["cache_salt"]) for k in (e["key"] for e in entries)}
        assert named == set().union(*by_salt(ours_dir).values())
        # The same key-addressed DELETE (the coordinator's call) on both
        # servers: the same answer, the same files gone, the same usage.
        keys = [e["key"] for e in entries if e["key"]["cache_salt"] == "tenant-b"][:2]
        for _, http, _ in servers:
            assert request(http, "DELETE", "/cache/objects", {"keys": keys}) \
                == (200, {"deleted": 2, "skipped": 0, "ok": True})
        assert by_salt(ours_dir) == by_salt(theirs_dir)
        assert len(by_salt(ours_dir)["tenant-b"]) == 6
        assert request(lmc.http_port, "GET", "/quota/tenant-b")[1] \
            == request(kvs.sidecar.http_port, "GET", "/quota/tenant-b")[1]
    finally:
        if fleet:
            fleet.close()
        lmc.close()
