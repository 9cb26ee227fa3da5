"""One cache client must never reach another's memory (issue 8 items 6 and 7).

- Log injection: a newline in a client-supplied string (shm name, request id)
  is written escaped, so no forged line appears; an shm name with an
  embedded NUL is refused, not truncated to an object that exists.
- Shared-memory policy: names outside cache.shm_allow_prefixes and sem.*
  are refused; over tcp:// an object must belong to the sidecar's user,
  over ipc:// to the connecting process's user (SO_PEERCRED).
- An instance id belongs to the connection that registered it: another
  connection cannot re-register, unregister, store from, retrieve into or
  keep it alive while its owner's connection lives; once that connection
  ends, or the instance is reaped, another connection may register it (how
  an engine that reconnected gets its instance back).
- A cache endpoint reachable from the network is a logged WARN.

Run: KVSIDECAR_BIN=<build>/kvsidecar python3 -m pytest -q tests/integration/test_cache_tenants.py
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import msgspec
import pytest
import zmq

pytest.register_assert_rewrite("conftest_cache", "lmcache_client")

from conftest_cache import CHUNK, changed_pages, pages_equal, snapshot_pages, tokens
import shm_pool  # noqa: E402 (conftest_cache puts tests/tools on the path)
from kvsidecar_harness import free_port_range
from lmcache_client import MPClient, cache_key, pool_wrappers
from test_cache_server import (MODEL, PAGE, STORE_FAILED, STORE_OK, blocks, committed,
                               lookup_wait, register, store)

pytest_plugins = ["conftest_cache"]

enc = msgspec.msgpack.encode
FORGED = "2026-11-30T12:00:00.000000Z INFO  registry#3 instance 1 registered: forged"
NOBODY = 65534


def submit_register(c: MPClient, wrappers, instance: int) -> int:
    return c.submit("register_kv_cache", instance, wrappers, MODEL, 1, "sglang",
                    {"tokens_per_block": PAGE}, [])


def renamed(pools, name: str) -> list:
    """The pools' wrappers with the first tensor's shm name replaced."""
    w = pool_wrappers(pools)
    d = msgspec.msgpack.decode(w[0].data)
    d["shm_name"] = name
    w[0] = msgspec.msgpack.Ext(0x4B, enc(d))
    return w


def no_forged_line(srv) -> None:
    for line in srv.lines_since(0):
        assert not line.startswith(FORGED[:27] + " INFO  registry#3"), line
        assert "forged" not in line or "\\n" in line, line


# --- item 6: log injection ----------------------------------------------------------------


def test_newline_in_shm_name_is_escaped_in_text_log(cache_server, kv_pools):
    srv = cache_server()
    pools = kv_pools("sglang")
    c = srv.client()
    mark = srv.mark()
    uid = submit_register(c, renamed(pools, pools.objects[0].name + "\n" + FORGED), 7001)
    assert c.failure(uid).startswith("kvsidecar: register_kv_cache")
    m = srv.wait_log(r"register_kv_cache of instance 7001 failed: tensor 0 \('(.*)'\): "
                     r"shared-memory name contains a control character", mark)
    assert m.group(1) == pools.objects[0].name + "\\n" + FORGED
    no_forged_line(srv)
    register(c, pools, 7002)  # the client is still served


def test_newline_in_request_id_is_escaped_in_json_log(cache_server, kv_pools):
    srv = cache_server(overrides={"sidecar.log_format": "json", "sidecar.log_level": "debug",
                                  "cache.session_ttl": "200ms"})
    c = srv.client()
    rid = "req\n" + FORGED
    toks = tokens(1, salt=3)
    mark = srv.mark()
    assert c.lookup(cache_key(MODEL, 1, None, toks, 0, CHUNK, rid), 1) is None
    srv.wait_log(r"idle past session_ttl", mark, timeout=5.0)
    lines = srv.lines_since(mark)
    for line in lines:
        obj = msgspec.json.decode(line)  # every line is one whole JSON object
        assert set(obj) == {"ts", "level", "actor", "msg"}
    assert any(rid in msgspec.json.decode(l)["msg"] for l in lines), "\n".join(lines)
    no_forged_line(srv)


def test_nul_in_shm_name_is_refused_not_truncated(cache_server, kv_pools):
    srv = cache_server()
    pools = kv_pools("sglang")
    c = srv.client()
    mark = srv.mark()
    # Truncated at the NUL the name is an existing, allowed object: before
    # the fix this registered it.
    uid = submit_register(c, renamed(pools, pools.objects[0].name + "\0/../victim"), 7003)
    assert c.failure(uid).startswith("kvsidecar: register_kv_cache")
    srv.wait_log(r"register_kv_cache of instance 7003 failed: tensor 0 \('.*\\x00/\.\./victim'\): "
                 r"shared-memory name contains a NUL byte", mark)
    srv.wait_stats(lambda s: s["instances"] == 0 and s["failed"] == 1, actor="registry")
    # Nothing under that id: a store through it fails.
    assert store(c, 7003, tokens(1, salt=4), "s", blocks(0, 1)) == STORE_FAILED


# --- item 7: which objects ----------------------------------------------------------------


def test_names_outside_allow_prefixes_and_semaphores_refused(cache_server):
    srv = cache_server()
    c = srv.client()
    other = shm_pool.sglang_mha_pools(2, 32, PAGE, 2, 16, prefix="other_tenant")
    sem = shm_pool.sglang_mha_pools(2, 32, PAGE, 2, 16, prefix="sem.kvs")
    try:
        mark = srv.mark()
        assert c.failure(submit_register(c, pool_wrappers(other), 7010)).startswith("kvsidecar: register_kv_cache")
        srv.wait_log(r"instance 7010 failed: tensor 0 \('/other_tenant_[0-9_]+'\): shared-memory "
                     r"name does not start with an allowed prefix \(cache.shm_allow_prefixes = "
                     r"\['/lmcache_kv_', '/kvs_'\]\)", mark)
        assert c.failure(submit_register(c, pool_wrappers(sem), 7011)).startswith("kvsidecar: register_kv_cache")
        srv.wait_log(r"instance 7011 failed: .*starts with 'sem\.'", mark)
        srv.wait_stats(lambda s: s["instances"] == 0 and s["failed"] == 2, actor="registry")
    finally:
        other.close()
        sem.close()


def test_allow_prefixes_is_configurable_but_sem_always_refused(cache_server):
    srv = cache_server(overrides={"cache.shm_allow_prefixes": ["/other_tenant_", "/sem."]})
    c = srv.client()
    other = shm_pool.sglang_mha_pools(2, 32, PAGE, 2, 16, prefix="other_tenant")
    sem = shm_pool.sglang_mha_pools(2, 32, PAGE, 2, 16, prefix="sem.kvs")
    try:
        register(c, other, 7012)
        mark = srv.mark()
        assert c.failure(submit_register(c, pool_wrappers(sem), 7013)).startswith("kvsidecar: register_kv_cache")
        srv.wait_log(r"instance 7013 failed: .*starts with 'sem\.'", mark)
    finally:
        other.close()
        sem.close()


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown / setuid")


@needs_root
def test_tcp_object_of_another_user_refused(cache_server, kv_pools):
    srv = cache_server()
    pools = kv_pools("sglang")
    for o in pools.objects:
        os.chown("/dev/shm" + o.name, NOBODY, NOBODY)
    c = srv.client()
    mark = srv.mark()
    assert c.failure(submit_register(c, pool_wrappers(pools), 7020)).startswith("kvsidecar: register_kv_cache")
    srv.wait_log(rf"instance 7020 failed: tensor 0 .*owned by uid {NOBODY}, the client runs as "
                 rf"uid {os.geteuid()} \(over tcp:// the objects must belong to the sidecar's user",
                 mark)


def as_user(uid: int, fn) -> list[str]:
    """Runs fn() in a forked child that dropped to `uid` (a client process of
    another user); returns the words it wrote."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: nothing of the parent's ZeroMQ context is used here
        code = 1
        try:
            os.close(r)
            os.setgid(uid)
            os.setuid(uid)
            os.write(w, " ".join(fn()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    return out.split()


def try_register(c: MPClient, wrappers, instance: int) -> str:
    """"registered", or "refused" when the failure reply (the op frame
    "kvsidecar: register_kv_cache ...") comes back."""
    why, value = c.failure_or_value(submit_register(c, wrappers, instance), 2.0)
    if why is None:
        assert value is None, value
        return "registered"
    assert why.startswith("kvsidecar: register_kv_cache"), why
    return "refused"


@needs_root
def test_ipc_uses_the_peer_uid(cache_server, kv_pools):
    d = Path(tempfile.mkdtemp(prefix="kvs_ipc_"))
    d.chmod(0o777)
    sock = d / "cache.sock"
    srv = cache_server(overrides={"cache.endpoint": f"ipc://{sock}"})
    sock.chmod(0o777)  # the other user must be able to connect
    root_pools = kv_pools("sglang")
    mark = srv.mark()
    root_wrappers = pool_wrappers(root_pools)

    def nobody_client() -> list[str]:
        ctx = zmq.Context()
        c = MPClient(f"ipc://{sock}", ctx)
        own = shm_pool.sglang_mha_pools(2, 32, PAGE, 2, 16, prefix="kvs_nobody")
        try:
            return [try_register(c, pool_wrappers(own), 7030),
                    try_register(c, root_wrappers, 7031)]
        finally:
            own.close()
            c.close()
            ctx.destroy(linger=0)

    assert as_user(NOBODY, nobody_client) == ["registered", "refused"]
    srv.wait_log(r"instance 7030 registered", mark)
    srv.wait_log(rf"instance 7031 failed: tensor 0 .*owned by uid 0, the client runs as "
                 rf"uid {NOBODY}$", mark)
    # And root over the same socket cannot register nobody's objects either.
    nobody_pools = kv_pools("sglang")
    for o in nobody_pools.objects:
        os.chown("/dev/shm" + o.name, NOBODY, NOBODY)
    c = MPClient(f"ipc://{sock}", srv.ctx)
    srv.clients.append(c)
    assert c.failure(submit_register(c, pool_wrappers(nobody_pools), 7032)).startswith("kvsidecar: register_kv_cache")
    srv.wait_log(rf"instance 7032 failed: .*owned by uid {NOBODY}, the client runs as uid 0$",
                 mark)
    register(c, root_pools, 7033)


# --- item 7: an instance belongs to its connection --------------------------------------


def test_other_connection_cannot_use_an_instance(cache_server, kv_pools):
    srv = cache_server()
    pa, pb = kv_pools("sglang", seed=1), kv_pools("sglang", seed=2)
    a, b = srv.client(), srv.client()
    register(a, pa, 7100)
    register(b, pb, 7101)
    toks = tokens(2, salt=21)
    assert store(a, 7100, toks, "a-s", blocks(0, 2)) == STORE_OK
    committed(srv, 2)
    untouched = snapshot_pages(pa, blocks(80, 2) + blocks(0, 2))
    before = srv.wait_stats(lambda s: True)
    mark = srv.mark()
    # B retrieves A's cached chunks into A's instance: refused, A's pages untouched.
    assert lookup_wait(b, toks, "b-r") == 2
    r = b.retrieve(cache_key(MODEL, 1, 0, toks, 0, 2 * CHUNK, "b-r"), 7100, [blocks(80, 2)])
    assert r == [b"", False]
    srv.wait_log(r"bad request from peer \w+ uid \w+ op retrieve: foreign_instance: instance 7100 "
                 r"was registered by connection \w+; only that connection may use it", mark)
    # B stores from A's pages into L1 under new tokens: refused, nothing stored.
    assert store(b, 7100, tokens(2, salt=22), "b-s", blocks(0, 2)) == STORE_FAILED
    # B re-registers A's id with its own pools: the failure reply.
    c_uid = submit_register(b, pool_wrappers(pb), 7100)
    assert b.failure(c_uid).startswith("kvsidecar: register_kv_cache")
    srv.wait_log(r"op register_kv_cache: foreign_instance: instance 7100", mark)
    # B unregisters A's instance: answered None, nothing happens.
    assert b.unregister_kv_cache(7100) is None
    srv.wait_log(r"op unregister_kv_cache: foreign_instance: instance 7100", mark)
    b.end_session("b-r")
    b.end_session("b-s")
    after = srv.wait_stats(lambda s: s["locks"] == 0)
    assert after["stored"] == before["stored"]
    assert not changed_pages(pa, untouched)
    # A's instance still works for A: its own retrieve lands the right bytes.
    assert lookup_wait(a, toks, "a-r") == 2
    r = a.retrieve(cache_key(MODEL, 1, 0, toks, 0, 2 * CHUNK, "a-r"), 7100, [blocks(80, 2)])
    assert r == [b"", True]
    assert [pa.page(0, 0, x) for x in blocks(80, 2)] == [pa.page(0, 0, x) for x in blocks(0, 2)]
    srv.wait_stats(lambda s: s["instances"] == 2, actor="registry")
    for rid in ("a-s", "a-r"):
        a.end_session(rid)
    srv.wait_idle()


def test_reconnected_engine_registers_again_at_once(cache_server, kv_pools):
    """The connection that registered an id ended (a blip, a crash): the id
    is released with it, and the engine's next connection registers it at
    once (test_cache_crash_restart.py does it with SIGKILLed LMCache clients)."""
    srv = cache_server()
    pools = kv_pools("sglang")
    old = srv.client()
    register(old, pools, 7210)
    assert old.ping(7210) is True
    mark = srv.mark()
    old.close()  # the blip: the engine's next connection has a new routing id
    srv.wait_log(r"connection \w+ ended \(disconnected\): released instance\(s\) 7210", mark)
    new = srv.client()
    register(new, pools, 7210)
    assert store(new, 7210, tokens(1, salt=29), "s", blocks(0, 1)) == STORE_OK
    new.end_session("s")
    srv.wait_idle()
    srv.wait_stats(lambda s: s["released"] == 1 and s["instances"] == 1, actor="registry")


def test_silent_owner_keeps_its_id_until_it_is_reaped(cache_server, kv_pools):
    """An owner whose connection stays open but falls silent keeps its id
    until it is reaped (heartbeat_timeout); another connection's pings do
    not keep the binding alive, and it registers the id once it is free."""
    srv = cache_server(overrides={"cache.heartbeat_timeout": "600ms"})
    pools = kv_pools("sglang")
    old = srv.client()
    register(old, pools, 7200)
    # The engine pings (as LMCache's adapter does), so its silence is judged
    # by heartbeat_timeout, not by registration_grace (default 1 h).
    assert old.ping(7200) is True
    new = srv.client()
    mark = srv.mark()
    c_uid = submit_register(new, pool_wrappers(pools), 7200)
    assert new.failure(c_uid).startswith("kvsidecar: register_kv_cache")
    # The new connection's pings do not keep the old binding alive ...
    deadline = time.monotonic() + 5.0
    while not srv.find(r"instance 7200 silent for over 600ms \(heartbeat_timeout\): reaped", mark):
        assert new.ping(7200) is True
        assert time.monotonic() < deadline, srv.tail()
        time.sleep(0.05)
    # ... and once it is reaped (the bridge has freed the id: the registry's
    # line comes first) the engine registers again and is served.
    srv.wait_log(r"instance 7200 reaped: its id is free for another connection", mark)
    register(new, pools, 7200)
    assert store(new, 7200, tokens(1, salt=30), "s", blocks(0, 1)) == STORE_OK
    new.end_session("s")
    srv.wait_idle()


def test_unregistered_id_is_free_for_any_connection(cache_server, kv_pools):
    srv = cache_server()
    pools = kv_pools("sglang")
    a, b = srv.client(), srv.client()
    register(a, pools, 7300)
    assert a.unregister_kv_cache(7300) is None
    register(b, pools, 7300)
    assert store(b, 7300, tokens(1, salt=31), "s", blocks(0, 1)) == STORE_OK
    assert store(a, 7300, tokens(1, salt=32), "t", blocks(0, 1)) == STORE_FAILED
    b.end_session("s")
    a.end_session("t")
    srv.wait_idle()


# --- item 7: the endpoint ---------------------------------------------------------------


def test_network_reachable_cache_endpoint_is_a_warning(cache_server):
    port = free_port_range(1)
    srv = cache_server(overrides={"cache.endpoint": f"tcp://*:{port}"})
    srv.wait_log(rf"WARN  engine_bridge#\d+ cache.endpoint = \"tcp://\*:{port}\" is reachable from "
                 r"the network")
    local = cache_server()
    local.wait_log(r"bound tcp://127\.0\.0\.1:\d+ \(cache.endpoint\)")
    assert not local.find(r"reachable from the network")
