"""API keys on the HTTP port, as LMCache 0.5.7 has them (lmcache-cli
0.5.7rc3 ``v1/multiprocess/http_auth.py``: ``--api-key-file`` repeatable,
``LMCACHE_API_KEY(_FILE)`` and the legacy ``LMCACHE_HTTP_API_KEY(_FILE)``):
with keys configured, every path but ``/``, ``/healthcheck`` and the probes
answers LMCache's 401 without one -- reads and ``/metrics`` included -- and
every configured key is accepted at once (rotation), as a bearer token or
``X-LMCache-API-Key``. A bad key file stops the start naming the file.
LMCache's own CLI, which sends no key, still pings (``/healthcheck`` is
public) but cannot describe a keyed server.
"""

from __future__ import annotations

import http.client
import json

import pytest

from kvsidecar_harness import Sidecar, free_port_range, wait_until
from lmcache_cli import release_env, run_cli

KEYS = ["old-key-4a9f0c7d2e", "new-key-81b3e5f6a0", "env-key-5c2d7e9f13"]


def get(port: int, method: str, path: str, headers: dict | None = None,
        body: dict | None = None) -> tuple[int, dict, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        h = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, json.dumps(body) if body is not None else None, h)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read().decode()
    finally:
        conn.close()


@pytest.fixture
def keyed(tmp_path, monkeypatch):
    old, new = tmp_path / "old.key", tmp_path / "new.key"
    old.write_text(KEYS[0] + "\n")
    new.write_text(f"  {KEYS[1]}  \n")
    monkeypatch.setenv("LMCACHE_HTTP_API_KEY", KEYS[2])
    monkeypatch.delenv("LMCACHE_API_KEY", raising=False)
    monkeypatch.delenv("LMCACHE_API_KEY_FILE", raising=False)
    monkeypatch.delenv("LMCACHE_HTTP_API_KEY_FILE", raising=False)
    sc = Sidecar(tmp_path / "sc", {
        "events.enabled": False, "cache.l1_size": "64MiB", "gpu.backend": "host",
        "cache.endpoint": f"tcp://127.0.0.1:{free_port_range(1)}",
        "http.api_key_files": [str(old), str(new)]}).start()
    wait_until(lambda: get(sc.http_port, "GET", "/readyz")[0] == 200, 10, "ready")
    yield sc
    sc.stop()


def test_every_path_but_the_public_ones_needs_a_key(keyed):
    port = keyed.http_port
    assert "3 HTTP API key(s) accepted" in keyed.log_text()
    for path in ["/", "/healthcheck", "/healthz", "/readyz"]:
        assert get(port, "GET", path)[0] == 200, path
    for method, path, body in [("GET", "/status", None), ("GET", "/metrics", None),
                               ("GET", "/config", None), ("GET", "/quota", None),
                               ("GET", "/cache/objects", None), ("GET", "/version", None),
                               ("POST", "/cache/clear", {}), ("GET", "/no/such/path", None)]:
        for headers in [{}, {"Authorization": "Bearer wrong-key"},
                        {"Authorization": KEYS[0]}, {"X-LMCache-API-Key": "Bearer " + KEYS[0]}]:
            status, h, text = get(port, method, path, headers, body)
            assert status == 401, (path, headers, status, text)
            assert json.loads(text) == {"detail": "Invalid or missing API key"}
            assert h.get("WWW-Authenticate") == "Bearer"
    # Every key at once (files, then the environment's): rotation.
    for key in KEYS:
        assert get(port, "GET", "/status", {"Authorization": f"Bearer {key}"})[0] == 200
        assert get(port, "GET", "/metrics", {"X-LMCache-API-Key": key})[0] == 200
        assert get(port, "GET", "/status", {"authorization": f"bearer {key}"})[0] == 200
    status, _, text = get(port, "POST", "/cache/clear", {"Authorization": f"Bearer {KEYS[1]}"}, {})
    assert status == 200, text
    assert json.loads(text)["status"] == "ok"
    # The config shows the file paths, never the keys.
    status, _, text = get(port, "GET", "/config", {"Authorization": f"Bearer {KEYS[0]}"})
    assert status == 200 and not any(k in text for k in KEYS)


def test_lmcache_cli_without_a_key(keyed):
    env, why = release_env("0.5.6")
    if env is None:
        pytest.skip(why)
    url = f"http://127.0.0.1:{keyed.http_port}"
    ping, describe = run_cli("0.5.6", [["ping", "kvcache", "--url", url],
                                       ["describe", "kvcache", "--url", url]])
    assert ping["rc"] == 0, ping
    assert describe["rc"] != 0, describe
    assert "401" in describe["out"] + describe["err"], describe


@pytest.mark.parametrize("text, words", [
    ("", "API key file is empty"),
    ("one\ntwo\n", "API key file must contain exactly one line"),
    (None, "cannot be read"),
])
def test_a_bad_key_file_stops_the_start(tmp_path, monkeypatch, text, words):
    for var in ["LMCACHE_API_KEY", "LMCACHE_API_KEY_FILE", "LMCACHE_HTTP_API_KEY",
                "LMCACHE_HTTP_API_KEY_FILE"]:
        monkeypatch.delenv(var, raising=False)
    f = tmp_path / "bad.key"
    if text is not None:
        f.write_text(text)
    sc = Sidecar(tmp_path / "sc", {"events.enabled": False, "cache.enabled": False,
                                   "http.api_key_files": [str(f)]}).spawn()
    assert sc.proc.wait(timeout=10) == 1
    log = sc.log_text()
    assert "http.api_key_files: " in log and words in log and str(f) in log, log


def test_off_loopback_a_key_opens_state_changes(tmp_path, monkeypatch):
    """No admin token, one key, a non-loopback listener: the key is what a
    state change needs there (as on LMCache, where a key opens every route)."""
    for var in ["LMCACHE_API_KEY", "LMCACHE_API_KEY_FILE", "LMCACHE_HTTP_API_KEY_FILE"]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LMCACHE_HTTP_API_KEY", KEYS[0])
    port = free_port_range(1)
    sc = Sidecar(tmp_path / "sc", {
        "events.enabled": False, "cache.l1_size": "64MiB", "gpu.backend": "host",
        "cache.endpoint": f"tcp://127.0.0.1:{free_port_range(1)}",
        "http.listen": f"0.0.0.0:{port}"}).start()
    try:
        assert "not loopback and no http.admin_token" not in sc.log_text()
        wait_until(lambda: get(port, "GET", "/readyz")[0] == 200, 10, "ready")
        assert get(port, "PUT", "/quota/t", {}, {"limit_gb": 1})[0] == 401
        assert get(port, "PUT", "/quota/t", {"Authorization": "Bearer nope"},
                   {"limit_gb": 1})[0] == 401
        status, _, text = get(port, "PUT", "/quota/t", {"Authorization": f"Bearer {KEYS[0]}"},
                              {"limit_gb": 1})
        assert status == 200, text
        status, _, text = get(port, "GET", "/quota/t", {"X-LMCache-API-Key": KEYS[0]})
        assert status == 200 and json.loads(text)["limit_gb"] == 1, text
        # The other header opens the same.
        status, _, text = get(port, "DELETE", "/quota/t", {"X-LMCache-API-Key": KEYS[0]})
        assert status == 200, text
    finally:
        sc.stop()
