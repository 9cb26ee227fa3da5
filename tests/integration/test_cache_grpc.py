"""kvsidecar's gRPC transport (cache.grpc_endpoint) driven by LMCache 0.5.6's
own gRPC client, and by raw grpc calls that no LMCache client would make.

1. LMCache 0.5.6's ``GrpcMultiprocessClient`` (transport/grpc_impl/client.py,
   made by ``grpc_impl.create_request_client`` as ``RequestClientFactory``
   makes it for a ``grpc://`` / ``grpc+unix://`` URL) runs the whole
   LMCache-driven flow against kvsidecar: chunk size, experimental features,
   registration of host shared-memory pools, store, lookup, wait, retrieve
   (pages compared byte for byte), lock release, session end, the KV event
   stream (server-streaming; cancelled by the client), ping, clear, noop,
   unregister; over TCP and over a unix socket (mode 0600).
2. The gRPC endpoint and the ZeroMQ endpoint of one server share one cache:
   chunks stored through one are hit through the other.
3. Hostile input on the gRPC endpoint (no LMCache needed): undecodable
   messages, unknown paths, out-of-range tokens, a flood of calls, a stream
   whose client is SIGKILLed, more than cache.hwm unanswered calls of one
   client; and the tenant rule (an instance belongs to the client that
   registered it) between two gRPC clients.
4. TLS and mutual TLS (cache.grpc_tls_*), with a self-signed certificate.

LMCache 0.5.6 is loaded as test_cache_lmcache_client.py loads it (torch
stood in for the import, device packages bypassed; LMCACHE_SRC /
LMCACHE_WHEEL, else build-wheels/lmcache-0.5.6-*.whl); the tests that need it
are skipped with the reason when it is missing. Everything here needs the
``grpc`` Python package (grpcio).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import select
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import types
import uuid
from pathlib import Path

import pytest

grpc = pytest.importorskip("grpc", reason="the gRPC tests need grpcio (pip install grpcio)")

pytest.register_assert_rewrite("conftest_cache", "lmcache_client")

from conftest_cache import CHUNK, changed_pages, pages_equal, snapshot_pages, tokens
from kvsidecar_harness import free_port_range, parse_stats, wait_until
from lmcache_client import EVENT_HANDLE, cache_key
from lmcache_wheels import client_namespace, unpack, wheel_imports
from test_cache_lmcache_client import (MODEL, PAGE, _lmcache_src,
                                       _torch_stand_in, blocks, lmcache_wrappers)
from test_cache_server import STORE_OK, committed, lookup_wait, register, store

pytest_plugins = ["conftest_cache"]

ROOT = Path(__file__).resolve().parents[2]
T = 5.0
CLIENT_ID = "lmcache-client-id-bin"
CHUNK_SIZE_REPLY = b"\x08\x80\x02"  # GetChunkSizeResponse{chunk_size: 256}
NOOP_REPLY = b"\x0a\x02OK"          # NoopResponse{message: "OK"}

# Paths (LMCache 0.5.6's generated stubs).
CTRL = "/lmcache.mp.ControllerService/"
LOOKUP = "/lmcache.mp.LookupService/"
DRIVEN = "/lmcache.mp.LMCacheDrivenService/"
NOOP = "/lmcache.mp.DebugService/Noop"
SUBSCRIBE = "/lmcache.mp.ObservabilityService/SubscribeKvEvents"


# --- LMCache 0.5.6's gRPC client ------------------------------------------------------------


def _src056() -> tuple[Path | None, str]:
    if os.environ.get("LMCACHE_SRC") or os.environ.get("LMCACHE_WHEEL"):
        return _lmcache_src()
    found = sorted((ROOT / "build-wheels").glob("lmcache-0.5.6-*.whl"))
    if not found:
        return None, ("LMCache 0.5.6 not available: no build-wheels/lmcache-0.5.6-*.whl "
                      "(scripts/install-deps.sh --with-python), LMCACHE_SRC or LMCACHE_WHEEL")
    return unpack(found[0], "lmcache-0.5.6-"), ""


def _load_grpc056() -> types.SimpleNamespace:
    src, why = _src056()
    if src is None:
        pytest.skip(why)
    if importlib.util.find_spec("cachetools") is None:
        pytest.skip("lmcache.utils (0.5.6) imports cachetools: pip install cachetools")
    with wheel_imports(src, _torch_stand_in(), "LMCache 0.5.6's gRPC client"):
        ns = client_namespace("grpc")
        ns.src = src
        return ns


@pytest.fixture(scope="module")
def lmc():
    return _load_grpc056()


# --- the server, its stats ------------------------------------------------------------------

GRPC_BOUND = (r"grpc_bridge#\d+ bound (\S+) \(cache\.grpc_endpoint\): "
              r"serving LMCache's gRPC transport")


def grpc_server(cache_server, overrides: dict | None = None, unix_path: str | None = None):
    """A cache server with its gRPC endpoint on; srv.grpc_url (LMCache's URL)
    and srv.grpc_target (grpc's channel target) set."""
    if unix_path is not None:
        url, target = f"grpc+unix://{unix_path}", f"unix://{unix_path}"
    else:
        port = free_port_range(1)
        url, target = f"grpc://127.0.0.1:{port}", f"127.0.0.1:{port}"
    o = {"cache.grpc_endpoint": url}
    o.update(overrides or {})
    srv = cache_server(overrides=o)
    assert srv.wait_log(GRPC_BOUND).group(1) == url
    srv.grpc_url, srv.grpc_target = url, target
    return srv


def actor_stats(srv, actor: str, mark: int = 0) -> dict | None:
    rx = re.compile(rf"\s{actor}#\d+ stats: (.*)$")
    last = None
    for line in srv.lines_since(mark):
        m = rx.search(line)
        if m:
            last = m.group(1)
    return parse_stats(last) if last is not None else None


def wait_grpc(srv, cond, mark: int | None = None, timeout: float = 5.0, what: str = "") -> dict:
    """Polls until the latest grpc_bridge stats line after mark (default: now)
    satisfies cond."""
    if mark is None:
        mark = srv.mark()

    def ok():
        s = actor_stats(srv, "grpc_bridge", mark)
        return s if s is not None and cond(s) else None
    try:
        return wait_until(ok, timeout, f"grpc_bridge stats {what}", interval=0.02)
    except AssertionError as e:
        raise AssertionError(f"{e}; latest: {actor_stats(srv, 'grpc_bridge', mark)}\n"
                             f"{srv.tail()}") from None


def streams_gone(srv, timeout: float = 5.0) -> None:
    wait_grpc(srv, lambda s: s["streams"] == 0, timeout=timeout, what="streams=0")
    srv.wait_stats(lambda s: s["kv_event_subscribers"] == 0, actor="engine_bridge",
                   timeout=timeout, what="kv_event_subscribers=0")


# --- raw gRPC -------------------------------------------------------------------------------


def _varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def pb_int(field: int, v: int) -> bytes:
    return _varint(field << 3) + _varint(v)


def pb_bytes(field: int, v: bytes | str) -> bytes:
    if isinstance(v, str):
        v = v.encode()
    return _varint(field << 3 | 2) + _varint(len(v)) + v


def pb_double(field: int, v: float) -> bytes:
    return _varint(field << 3 | 1) + struct.pack("<d", v)


def key056(toks, start: int, end: int, rid: str, worker: int | None = 0) -> bytes:
    """IpcCacheServerKey as 0.5.6 encodes it (packed varint token_ids)."""
    return (pb_bytes(1, MODEL) + pb_int(2, 1) + (b"" if worker is None else pb_int(3, worker))
            + pb_bytes(4, b"".join(_varint(t) for t in toks)) + pb_int(5, start)
            + pb_int(6, end) + pb_bytes(7, rid) + pb_int(10, 1))


def wait_request(rid: str, timeout: float) -> bytes:
    return pb_bytes(1, rid) + pb_double(2, timeout)


def subscribe_request(instance: int, cursor: int = 0, max_events: int = 64) -> bytes:
    return pb_int(1, instance) + pb_bytes(2, MODEL) + pb_int(3, cursor) + pb_int(4, max_events)


def unary(channel, path: str):
    return channel.unary_unary(path, request_serializer=None, response_deserializer=None)


def md(cid: bytes):
    return ((CLIENT_ID, cid),)


def rpc_error(channel, path: str, body: bytes, cid: bytes = b"raw", timeout: float = T):
    with pytest.raises(grpc.RpcError) as e:
        unary(channel, path)(body, metadata=md(cid), timeout=timeout)
    return e.value


# --- LMCache 0.5.6's client over gRPC --------------------------------------------------------


def _next(stream, timeout: float = T):
    """("batch", b) / ("end", None) / ("error", exc) of next(stream), with a deadline."""
    box: list = []

    def read():
        try:
            box.append(("batch", next(stream)))
        except StopIteration:
            box.append(("end", None))
        except BaseException as e:  # noqa: BLE001 - reported to the test
            box.append(("error", e))
    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout)
    assert box, f"no batch within {timeout}s"
    return box[0]


def _batch(stream, timeout: float = T):
    kind, v = _next(stream, timeout)
    assert kind == "batch", (kind, v)
    return v


def _flow(lmc, srv, client, pools, layout: str, inst: int, salt: int) -> None:
    """The LMCache-driven flow of test_lmcache_client_full_flow, over gRPC."""
    K = lmc.IPCCacheServerKey
    toks = tuple(tokens(4, salt=salt))
    assert client.get_chunk_size().result(timeout=T) == CHUNK
    assert client.noop().result(timeout=T) == "OK"
    assert client.ping(None).result(timeout=T) is True
    assert client.get_experimental().result(timeout=T) == ["kv_event_stream"]
    engine = lmc.EngineType.SGLANG if layout == "sglang" else lmc.EngineType.VLLM
    hints = {"tokens_per_block": PAGE} if layout == "sglang" else {"kv_layout": "NHD"}
    assert client.register_kv_cache(inst, lmcache_wrappers(lmc, pools), MODEL, 1, engine,
                                    hints, []).result(timeout=T) is None
    assert client.ping(inst).result(timeout=T) is True
    handle, ok = client.store(K(model_name=MODEL, world_size=1, worker_id=0, token_ids=toks,
                                start=0, end=4 * CHUNK, request_id="w"),
                              inst, [blocks(0, 4)], EVENT_HANDLE).result(timeout=T)
    assert ok is True and handle == b""
    srv.wait_stats(lambda s: s["stored"] == 4)
    sched = K(model_name=MODEL, world_size=1, worker_id=None, token_ids=toks, start=0,
              end=4 * CHUNK, request_id="r", num_kv_readers=1)
    assert client.lookup(sched, 1).result(timeout=T) is None
    assert client.wait_prefetch_status("r", 30.0).result(timeout=T) == 4
    srv.wait_locks(4)
    skip = CHUNK if layout == "vllm" else CHUNK // PAGE
    dst = blocks(80, 4)
    before = snapshot_pages(pools, dst[:CHUNK // PAGE])
    handle, ok = client.retrieve(K(model_name=MODEL, world_size=1, worker_id=0, token_ids=toks,
                                   start=0, end=4 * CHUNK, request_id="r"),
                                 inst, [dst], EVENT_HANDLE, skip).result(timeout=T)
    assert ok is True and handle == b""
    skipped = CHUNK // PAGE
    assert not pages_equal(pools, dst[skipped:], pools, blocks(0, 4)[skipped:])
    assert not changed_pages(pools, before), "skipped pages were written"
    srv.wait_locks(0)
    assert client.free_lookup_locks(sched, 1).result(timeout=T) is None
    assert client.end_session("r").result(timeout=T) is None
    assert client.query_prefetch_status("r").result(timeout=T) == 0
    # A lookup whose locks only free_lookup_locks releases (no retrieve).
    sched2 = K(model_name=MODEL, world_size=1, worker_id=None, token_ids=toks, start=0,
               end=4 * CHUNK, request_id="r2", num_kv_readers=1)
    assert client.lookup(sched2, 1).result(timeout=T) is None
    assert client.wait_prefetch_status("r2", 30.0).result(timeout=T) == 4
    srv.wait_locks(4)
    assert client.free_lookup_locks(sched2, 1).result(timeout=T) is None
    srv.wait_locks(0)
    for rid in ("r2", "w"):
        assert client.end_session(rid).result(timeout=T) is None
    assert client.clear(False).result(timeout=T) is None
    srv.wait_stats(lambda s: s["chunks"] == 0)
    assert client.unregister_kv_cache(inst).result(timeout=T) is None
    srv.wait_idle()


@pytest.mark.parametrize("layout", ["sglang", "vllm"])
def test_lmcache_056_grpc_client_full_flow(lmc, cache_server, kv_pools, layout):
    srv = grpc_server(cache_server)
    # As LMCache's adapters make it: the factory picks the transport by scheme.
    client = lmc.factory.create(srv.grpc_url)
    assert type(client).__name__ == "GrpcMultiprocessClient"
    try:
        _flow(lmc, srv, client, kv_pools(layout), layout, 4900, salt=91)
    finally:
        client.close()
    s = wait_grpc(srv, lambda s: s["replies"] >= 20, what="replies>=20")
    assert s["failed"] == 0 and s["bad_requests"] == 0 and s["unimplemented"] == 0, s
    srv.wait_stats(lambda s: s["grpc_requests"] >= 20, actor="engine_bridge")
    m = srv.sidecar.metrics()
    assert m[("kvsidecar_grpc_replies_total", frozenset())] >= 20
    srv.wait_log(r"LMCache client 0\.5\.6", 0)


def test_lmcache_056_grpc_client_over_unix_socket(lmc, cache_server, kv_pools):
    d = tempfile.mkdtemp(prefix="kvs-grpc-")  # short: a socket path has 108 bytes at most
    try:
        path = os.path.join(d, "lmcache.sock")
        srv = grpc_server(cache_server, unix_path=path)
        st = os.stat(path)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600, oct(st.st_mode)
        client = lmc.factory.create(srv.grpc_url)
        try:
            _flow(lmc, srv, client, kv_pools("vllm"), "vllm", 4901, salt=92)
        finally:
            client.close()
    finally:
        shutil.rmtree(d, True)


def test_lmcache_056_grpc_kv_event_stream(lmc, cache_server, kv_pools):
    """subscribe_kv_events over gRPC: a server stream of KVEventBatch, the
    first at once; a store's chunks arrive as records; the client's cancel
    ends the stream in the engine bridge too."""
    srv = grpc_server(cache_server)
    client = lmc.create_request_client(srv.grpc_url)
    pools = kv_pools("vllm")
    toks = tuple(tokens(3, salt=93))
    K = lmc.IPCCacheServerKey
    try:
        assert "kv_event_stream" in client.get_experimental().result(timeout=T)
        assert client.register_kv_cache(4910, lmcache_wrappers(lmc, pools), MODEL, 1,
                                        lmc.EngineType.VLLM, {"kv_layout": "NHD"},
                                        []).result(timeout=T) is None
        stream = client.subscribe_kv_events(4910, MODEL, 0, 64)
        first = _batch(stream)
        assert isinstance(first, lmc.KVEventBatch)
        assert first.enabled and not first.lost and first.events == [] and first.next_cursor == 0
        assert first.incarnation > 0
        wait_grpc(srv, lambda s: s["streams"] == 1, what="streams=1")
        srv.wait_stats(lambda s: s["kv_event_subscribers"] == 1, actor="engine_bridge")
        _, ok = client.store(K(model_name=MODEL, world_size=1, worker_id=0, token_ids=toks,
                               start=0, end=3 * CHUNK, request_id="w"),
                             4910, [blocks(0, 3)], EVENT_HANDLE).result(timeout=T)
        assert ok
        got = []
        while len(got) < 3:
            b = _batch(stream)
            assert b.incarnation == first.incarnation and not b.lost and b.enabled
            got += b.events
        assert [r.kind for r in got] == ["stored"] * 3
        assert all(r.medium == "CPU" and r.model_name == MODEL for r in got)
        assert [r.token_ids for r in got] == [list(toks[i * CHUNK:(i + 1) * CHUNK])
                                              for i in range(3)]
        assert got[0].parent_block_hash is None
        for prev, r in zip(got, got[1:]):
            assert r.parent_block_hash == prev.block_hashes[0] and r.seq > prev.seq
        assert all(len(r.block_hashes) == 1 and len(r.block_hashes[0]) == 8 for r in got)
        mark = srv.mark()
        stream.close()  # the client's cancel
        streams_gone(srv)
        assert wait_grpc(srv, lambda s: s["cancelled"] >= 1, mark=mark)["streams"] == 0
        # From cursor 0 again: the log replayed; a refused subscription is an error at once.
        again = client.subscribe_kv_events(4910, MODEL, 0, 64)
        replay = _batch(again)
        assert [r.kind for r in replay.events] == ["stored"] * 3
        assert [r.block_hashes for r in replay.events] == [r.block_hashes for r in got]
        again.close()
        t0 = time.monotonic()
        kind, err = _next(client.subscribe_kv_events(4910, MODEL, -1, 64))
        assert kind == "error" and isinstance(err, grpc.RpcError), (kind, err)
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err
        assert err.details().startswith("kvsidecar: "), err.details()
        assert time.monotonic() - t0 < 2.0
        streams_gone(srv)
        assert client.end_session("w").result(timeout=T) is None
        assert client.unregister_kv_cache(4910).result(timeout=T) is None
        srv.wait_idle()
    finally:
        client.close()


def test_grpc_and_zmq_clients_share_the_cache(lmc, cache_server, kv_pools):
    """A 0.5.6 engine on gRPC and one on ZeroMQ (same server): each hits and
    retrieves, byte for byte, what the other stored."""
    srv = grpc_server(cache_server)
    g = lmc.create_request_client(srv.grpc_url)
    z = srv.client()
    pa, pb = kv_pools("vllm", seed=1), kv_pools("vllm", seed=2)
    K = lmc.IPCCacheServerKey
    t1, t2 = tuple(tokens(4, salt=94)), tuple(tokens(3, salt=95))
    try:
        assert g.get_chunk_size().result(timeout=T) == CHUNK
        assert g.register_kv_cache(4920, lmcache_wrappers(lmc, pa), MODEL, 1,
                                   lmc.EngineType.VLLM, {"kv_layout": "NHD"},
                                   []).result(timeout=T) is None
        register(z, pb, 4921, layout="vllm", wrapper="cpu_shm")
        # gRPC stores, ZeroMQ hits.
        _, ok = g.store(K(model_name=MODEL, world_size=1, worker_id=0, token_ids=t1, start=0,
                          end=4 * CHUNK, request_id="g-w"),
                        4920, [blocks(0, 4)], EVENT_HANDLE).result(timeout=T)
        assert ok is True
        committed(srv, 4)
        assert lookup_wait(z, list(t1), "z-r") == 4
        assert z.retrieve(cache_key(MODEL, 1, 0, list(t1), 0, 4 * CHUNK, "z-r"), 4921,
                          [blocks(80, 4)]) == [b"", True]
        assert not pages_equal(pb, blocks(80, 4), pa, blocks(0, 4))
        # ZeroMQ stores, gRPC hits.
        assert store(z, 4921, list(t2), "z-w", blocks(0, 3)) == STORE_OK
        committed(srv, 7)
        sched = K(model_name=MODEL, world_size=1, worker_id=None, token_ids=t2, start=0,
                  end=3 * CHUNK, request_id="g-r", num_kv_readers=1)
        assert g.lookup(sched, 1).result(timeout=T) is None
        assert g.wait_prefetch_status("g-r", 30.0).result(timeout=T) == 3
        _, ok = g.retrieve(K(model_name=MODEL, world_size=1, worker_id=0, token_ids=t2,
                             start=0, end=3 * CHUNK, request_id="g-r"),
                           4920, [blocks(100, 3)], EVENT_HANDLE, 0).result(timeout=T)
        assert ok is True
        assert not pages_equal(pa, blocks(100, 3), pb, blocks(0, 3))
        srv.wait_locks(0)
        for rid in ("g-w", "g-r"):
            assert g.end_session(rid).result(timeout=T) is None
        for rid in ("z-r", "z-w"):
            z.end_session(rid)
        assert g.unregister_kv_cache(4920).result(timeout=T) is None
        assert z.unregister_kv_cache(4921) is None
        srv.wait_idle()
    finally:
        g.close()


def test_instance_belongs_to_the_grpc_client_that_registered_it(lmc, cache_server, kv_pools):
    """Two LMCache gRPC clients (each its own lmcache-client-id-bin): the
    second cannot store from, retrieve into, re-register or unregister the
    first's instance (test_cache_tenants.py's rule for ZeroMQ connections)."""
    srv = grpc_server(cache_server)
    a, b = lmc.create_request_client(srv.grpc_url), lmc.create_request_client(srv.grpc_url)
    pa, pb = kv_pools("vllm", seed=1), kv_pools("vllm", seed=2)
    K = lmc.IPCCacheServerKey
    toks = tuple(tokens(2, salt=96))

    def key(t, rid, worker=0, readers=0):
        return K(model_name=MODEL, world_size=1, worker_id=worker, token_ids=t, start=0,
                 end=len(t), request_id=rid, num_kv_readers=readers)
    try:
        for c in (a, b):
            assert c.get_chunk_size().result(timeout=T) == CHUNK
        assert a.register_kv_cache(4930, lmcache_wrappers(lmc, pa), MODEL, 1, lmc.EngineType.VLLM,
                                   {"kv_layout": "NHD"}, []).result(timeout=T) is None
        assert a.store(key(toks, "a-w"), 4930, [blocks(0, 2)],
                       EVENT_HANDLE).result(timeout=T) == (b"", True)
        committed(srv, 2)
        mark = srv.mark()
        untouched = snapshot_pages(pa, blocks(0, 2) + blocks(80, 2))
        # B stores from A's pages: LMCache's failure value, nothing stored.
        assert b.store(key(tuple(tokens(2, salt=97)), "b-w"), 4930, [blocks(0, 2)],
                       EVENT_HANDLE).result(timeout=T) == (b"", False)
        srv.wait_log(r"op store: foreign_instance: instance 4930 was registered by connection "
                     r"\w+; only that connection may use it", mark)
        # B retrieves A's chunks into A's pages: refused, pages untouched.
        assert b.lookup(key(toks, "b-r", worker=None, readers=1), 1).result(timeout=T) is None
        assert b.wait_prefetch_status("b-r", 30.0).result(timeout=T) == 2
        assert b.retrieve(key(toks, "b-r"), 4930, [blocks(80, 2)], EVENT_HANDLE,
                          0).result(timeout=T) == (b"", False)
        # B re-registers A's id: refused at once, with the reason.
        with pytest.raises(grpc.RpcError) as e:
            b.register_kv_cache(4930, lmcache_wrappers(lmc, pb), MODEL, 1, lmc.EngineType.VLLM,
                                {"kv_layout": "NHD"}, []).result(timeout=T)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "instance 4930 belongs to another connection" in e.value.details()
        # B unregisters it: None, nothing happens.
        assert b.unregister_kv_cache(4930).result(timeout=T) is None
        srv.wait_log(r"op unregister_kv_cache: foreign_instance: instance 4930", mark)
        for rid in ("b-w", "b-r"):
            assert b.end_session(rid).result(timeout=T) is None
        s = srv.wait_stats(lambda s: s["locks"] == 0)
        assert s["stored"] == 2
        assert not changed_pages(pa, untouched)
        # A's instance still serves A.
        assert a.lookup(key(toks, "a-r", worker=None, readers=1), 1).result(timeout=T) is None
        assert a.wait_prefetch_status("a-r", 30.0).result(timeout=T) == 2
        assert a.retrieve(key(toks, "a-r"), 4930, [blocks(80, 2)], EVENT_HANDLE,
                          0).result(timeout=T) == (b"", True)
        assert not pages_equal(pa, blocks(80, 2), pa, blocks(0, 2))
        for rid in ("a-w", "a-r"):
            assert a.end_session(rid).result(timeout=T) is None
        assert a.unregister_kv_cache(4930).result(timeout=T) is None
        srv.wait_idle()
    finally:
        a.close()
        b.close()


# --- hostile input (raw grpc, no LMCache) --------------------------------------------------


def test_undecodable_and_unknown_requests(cache_server):
    srv = grpc_server(cache_server)
    with grpc.insecure_channel(srv.grpc_target) as ch:
        t0 = time.monotonic()
        e = rpc_error(ch, LOOKUP + "Lookup", b"\x0f garbage")
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
        assert e.details() == "lookup: LookupRequest: not a valid protobuf message (9 bytes)"
        # A length-delimited field running past the end, on another method.
        e = rpc_error(ch, DRIVEN + "Store", b"\x0a\x10k")
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.details().startswith("store: StoreRequest: not a valid protobuf message"), e
        assert time.monotonic() - t0 < 2.0
        for path in ("/nope.Service/Method", "/lmcache.mp.P2PService/P2PLookupAndLock",
                     "/lmcache.mp.ControllerService/NoSuchMethod"):
            e = rpc_error(ch, path, b"")
            assert e.code() == grpc.StatusCode.UNIMPLEMENTED, (path, e)
            assert e.details().startswith(path + " is not served by kvsidecar"), e.details()
        # A token id outside LMCache's uint32 (its hasher packs ">I"), after
        # the client showed 0.5.6 (its GetChunkSize path).
        cid = b"tokens-" + uuid.uuid4().bytes
        chunk_size = unary(ch, CTRL + "GetChunkSize")
        assert chunk_size(b"", metadata=md(cid), timeout=T) == CHUNK_SIZE_REPLY
        for tok, shown in ((2 ** 33, "8589934592"), (-1, "-1")):
            req = pb_bytes(1, key056([5, tok], 0, CHUNK, "t", worker=None)) + pb_int(2, 1)
            e = rpc_error(ch, LOOKUP + "Lookup", req, cid)
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
            assert e.details() == (f"lookup: LookupRequest.key: token_ids[1] = {shown} "
                                   "is outside [0, 2^32)"), e.details()
        # A request the shared decoder refuses: FAILED_PRECONDITION with its text.
        sub = ch.unary_stream(SUBSCRIBE, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as refused:
            next(sub(subscribe_request(1, max_events=0), metadata=md(cid), timeout=T))
        e = refused.value
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
        assert e.details().startswith("kvsidecar: ") and "max_events" in e.details(), e.details()
        # Still serving.
        assert unary(ch, NOOP)(b"", metadata=md(cid), timeout=T) == NOOP_REPLY
    s = wait_grpc(srv, lambda s: s["bad_requests"] == 4 and s["unimplemented"] == 3
                  and s["failed"] == 1, what="bad_requests=4 unimplemented=3 failed=1")
    assert s["replies"] == 2, s


def test_flood_of_garbage_and_valid_calls(cache_server):
    """2000 concurrent calls, half undecodable (to several methods, one of
    1 MiB), half valid: every one answered as it should, the server alive
    and serving afterwards."""
    srv = grpc_server(cache_server)
    n = 1000
    garbage_paths = [LOOKUP + "Lookup", DRIVEN + "Store", DRIVEN + "RegisterKvCache",
                     LOOKUP + "WaitPrefetchStatus", NOOP, SUBSCRIBE]
    with grpc.insecure_channel(srv.grpc_target) as ch:
        calls = {p: unary(ch, p) for p in garbage_paths}
        futures = []
        for i in range(n):
            cid = b"flood-%d" % (i % 7)
            path = garbage_paths[i % len(garbage_paths)]
            body = b"\x0f" + os.urandom(1 << 20 if i == 0 else i % 64)
            if path == SUBSCRIBE:
                f = ch.unary_stream(path, request_serializer=None, response_deserializer=None)(
                    body, metadata=md(cid), timeout=20)
            else:
                f = calls[path].future(body, metadata=md(cid), timeout=20)
            futures.append(("bad", f))
            futures.append(("ok", calls[NOOP].future(b"", metadata=md(cid), timeout=20)))
        for kind, f in futures:
            if kind == "ok":
                assert f.result() == NOOP_REPLY
            else:  # unary futures and streams alike (a stream call is a grpc.Future too)
                assert f.exception() is not None and f.code() == grpc.StatusCode.INVALID_ARGUMENT, f
        assert srv.sidecar.running()
        assert unary(ch, CTRL + "GetChunkSize")(b"", timeout=T) == CHUNK_SIZE_REPLY
    s = wait_grpc(srv, lambda s: s["bad_requests"] == n and s["replies"] >= n + 1,
                  timeout=10, what=f"bad_requests={n}")
    assert s["overloaded"] == 0 and s["streams"] == 0, s
    # The ZeroMQ endpoint is unaffected.
    assert srv.client().noop() == "OK"


KILLED_SUBSCRIBER = r"""
import sys, time, grpc
ch = grpc.insecure_channel(sys.argv[1])
call = ch.unary_stream(sys.argv[2], request_serializer=None, response_deserializer=None)
it = call(bytes.fromhex(sys.argv[3]), metadata=(("lmcache-client-id-bin", b"doomed"),))
print(next(it).hex(), flush=True)
time.sleep(600)
"""


def test_subscriber_killed_mid_stream(cache_server):
    srv = grpc_server(cache_server)
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SUBSCRIBER, srv.grpc_target, SUBSCRIBE,
                             subscribe_request(4940).hex()],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        if not ready:
            proc.kill()
            raise AssertionError(f"the subscriber got no first batch: {proc.stderr.read()!r}")
        first = bytes.fromhex(proc.stdout.readline().decode().strip())
        assert first.startswith(b"\x08\x01"), first  # KVEventBatch{enabled: true, ...}
        wait_grpc(srv, lambda s: s["streams"] == 1, what="streams=1")
        srv.wait_stats(lambda s: s["kv_event_subscribers"] == 1, actor="engine_bridge")
        mark = srv.mark()
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
        streams_gone(srv)
        wait_grpc(srv, lambda s: s["cancelled"] == 1, mark=mark, what="cancelled=1")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        proc.stdout.close()
        proc.stderr.close()
    assert srv.sidecar.running()
    with grpc.insecure_channel(srv.grpc_target) as ch:
        assert unary(ch, NOOP)(b"", timeout=T) == NOOP_REPLY
        # The same client id subscribes again.
        again = ch.unary_stream(SUBSCRIBE, request_serializer=None, response_deserializer=None)(
            subscribe_request(4940), metadata=md(b"doomed"), timeout=10)
        assert next(again).startswith(b"\x08\x01")
        again.cancel()
    streams_gone(srv)


def test_more_than_hwm_unanswered_calls_of_one_client(cache_server):
    """cache.hwm = 4: a client with 4 streams open has 4 requests unanswered;
    its further calls are refused at once (RESOURCE_EXHAUSTED), other clients
    are served; a burst of concurrent waits from one client is served or
    refused, nothing else; once its streams end the client is served again."""
    srv = grpc_server(cache_server, overrides={"cache.hwm": 4})
    with grpc.insecure_channel(srv.grpc_target) as ch:
        sub = ch.unary_stream(SUBSCRIBE, request_serializer=None, response_deserializer=None)
        streams = [sub(subscribe_request(4950 + i), metadata=md(b"hog"), timeout=30)
                   for i in range(4)]
        for s in streams:
            assert next(s).startswith(b"\x08\x01")
        wait_grpc(srv, lambda s: s["streams"] == 4, what="streams=4")
        wait = unary(ch, LOOKUP + "WaitPrefetchStatus")
        refused = [wait.future(wait_request(f"h{i}", 60.0), metadata=md(b"hog"), timeout=10)
                   for i in range(50)]
        t0 = time.monotonic()
        for f in refused:
            assert f.exception() is not None, f.result()
            assert f.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, f.exception()
            assert f.details() == ("wait_prefetch_status: more than cache.hwm (4) requests of "
                                   "this client are unanswered")
        assert time.monotonic() - t0 < 3.0
        # Another client is served meanwhile.
        assert wait(wait_request("o", 60.0), metadata=md(b"other"), timeout=T) == b"\x08\x00"
        # A burst of one client's waits: each answered (0: no such lookup) or refused.
        burst = [wait.future(wait_request(f"b{i}", 60.0), metadata=md(b"burst"), timeout=10)
                 for i in range(300)]
        codes = {}
        for f in burst:
            if f.exception() is None:
                assert f.result() == b"\x08\x00"
                codes["ok"] = codes.get("ok", 0) + 1
            else:
                assert f.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, f.exception()
                codes["exhausted"] = codes.get("exhausted", 0) + 1
        assert codes.get("ok", 0) >= 4, codes
        for s in streams:
            s.cancel()
        streams_gone(srv)
        assert wait(wait_request("h", 60.0), metadata=md(b"hog"), timeout=T) == b"\x08\x00"
    s = wait_grpc(srv, lambda s: s["overloaded"] == 50 + codes.get("exhausted", 0),
                  what="overloaded")
    assert s["cancelled"] == 4, s
    assert srv.sidecar.running()


# --- TLS ------------------------------------------------------------------------------------


def _self_signed(d: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=30)
    return cert, key


def test_tls_and_mutual_tls(cache_server, tmp_path):
    cert, key = _self_signed(tmp_path)
    pem = cert.read_bytes()
    srv = grpc_server(cache_server, overrides={"cache.grpc_tls_cert_file": str(cert),
                                               "cache.grpc_tls_key_file": str(key)})
    srv.wait_log(GRPC_BOUND + r".* over TLS")
    with grpc.secure_channel(srv.grpc_target, grpc.ssl_channel_credentials(pem)) as ch:
        assert unary(ch, CTRL + "GetChunkSize")(b"", timeout=T) == CHUNK_SIZE_REPLY
    with grpc.insecure_channel(srv.grpc_target) as ch:
        e = rpc_error(ch, CTRL + "GetChunkSize", b"", timeout=3)
        assert e.code() == grpc.StatusCode.UNAVAILABLE, e
    # Client certificates required: the same self-signed certificate as the CA.
    mtls = grpc_server(cache_server, overrides={"cache.grpc_tls_cert_file": str(cert),
                                                "cache.grpc_tls_key_file": str(key),
                                                "cache.grpc_tls_client_ca_file": str(cert)})
    creds = grpc.ssl_channel_credentials(pem, private_key=key.read_bytes(), certificate_chain=pem)
    with grpc.secure_channel(mtls.grpc_target, creds) as ch:
        assert unary(ch, CTRL + "GetChunkSize")(b"", timeout=T) == CHUNK_SIZE_REPLY
    with grpc.secure_channel(mtls.grpc_target, grpc.ssl_channel_credentials(pem)) as ch:
        e = rpc_error(ch, CTRL + "GetChunkSize", b"", timeout=3)
        assert e.code() == grpc.StatusCode.UNAVAILABLE, e
    assert srv.sidecar.running() and mtls.sidecar.running()


# --- a subscriber killed while the server's write waits for it ------------------------------

STALLED_SUBSCRIBER = r"""
import sys, time, grpc
# No BDP probing: the stream's flow-control window stays at its initial 64 KiB.
ch = grpc.insecure_channel(sys.argv[1], options=[("grpc.http2.bdp_probe", 0)])
call = ch.unary_stream(sys.argv[2], request_serializer=None, response_deserializer=None)
it = call(bytes.fromhex(sys.argv[3]), metadata=(("lmcache-client-id-bin", b"stalled"),))
print(next(it).hex(), flush=True)
time.sleep(600)  # reads nothing more
"""


def test_subscriber_killed_while_its_stream_is_flow_controlled(cache_server, kv_pools):
    """A subscriber that stops reading: the server's Write waits on gRPC flow
    control (in place of LMCache's ZeroMQ ack). Killed then, its subscription
    must end in the engine bridge as a cancel does (not linger until the
    instance's heartbeat expires it)."""
    srv = grpc_server(cache_server)
    z = srv.client()
    pools = kv_pools("vllm")
    register(z, pools, 4960, layout="vllm", wrapper="cpu_shm")
    proc = subprocess.Popen([sys.executable, "-c", STALLED_SUBSCRIBER, srv.grpc_target, SUBSCRIBE,
                             subscribe_request(4960, max_events=1024).hex()],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        if not ready:
            proc.kill()
            raise AssertionError(f"the subscriber got no first batch: {proc.stderr.read()!r}")
        assert bytes.fromhex(proc.stdout.readline().decode().strip()).startswith(b"\x08\x01")
        # 300 records of 256 token ids each: several times the 64 KiB window.
        for i in range(30):
            assert store(z, 4960, tokens(10, salt=300 + i), f"s{i}", blocks(0, 10)) == STORE_OK
        committed(srv, 300)
        srv.wait_stats(lambda s: s["kv_event_log"] >= 300, actor="engine_bridge")

        # Stalled: the stream's writes stop advancing (same count on three
        # stats lines in a row, the stream still open).
        def stalled():
            lines = [parse_stats(m.group(1)) for m in srv.find(r"\sgrpc_bridge#\d+ stats: (.*)$")]
            last = lines[-3:]
            return (len(last) == 3 and all(s["streams"] == 1 for s in last)
                    and len({s["replies"] for s in last}) == 1 and last[-1]["replies"] > 1)
        wait_until(stalled, 10, "the stream's writes to stall")
        mark = srv.mark()
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
        streams_gone(srv)
        wait_grpc(srv, lambda s: s["cancelled"] == 1, mark=mark, what="cancelled=1")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        proc.stdout.close()
        proc.stderr.close()
    for i in range(30):
        z.end_session(f"s{i}")
    srv.wait_idle()
