"""kvsidecar's gRPC transport driven by LMCache 0.5.7's own gRPC client
(``lmcache==0.5.7rc2``: ManagementService / KVEventService / ExtensionService
besides the shared services), and a 0.5.6 client on the same server at the
same time (ZeroMQ, and gRPC frames of 0.5.6's protos).

0.5.7's ``IpcCacheServerKey.token_bytes`` (big-endian uint32) shares field
number 4 with 0.5.6's packed varint ``token_ids``: the server reads it by the
release the client showed first (negotiate_chunk_size is the vLLM adapter's
first request, on a 0.5.7-only path), per ``lmcache-client-id-bin``.

Loaded like test_cache_lmcache_057.py (torch stood in for the import, device
packages bypassed; build-wheels/lmcache-0.5.7rc2-*.whl or LMCACHE057_WHEEL),
in its own pytest process (ctest runs each file alone).
"""

from __future__ import annotations

import importlib
import time
import types
import uuid
from pathlib import Path

import pytest

grpc = pytest.importorskip("grpc", reason="the gRPC tests need grpcio (pip install grpcio)")

pytest.register_assert_rewrite("conftest_cache", "lmcache_client")

from conftest_cache import CHUNK, pages_equal, tokens
from lmcache_client import EVENT_HANDLE, cache_key
from test_cache_grpc import (CHUNK_SIZE_REPLY, CTRL, LOOKUP, _batch, grpc_server, key056,
                             md, pb_bytes, pb_int, streams_gone, unary, wait_grpc, wait_request)
from lmcache_wheels import client_namespace, wheel_imports
from test_cache_engine_driven import Staging
from test_cache_lmcache_057 import (MODEL, _chunk_bytes, _grouped, _src057,
                                    _torch_stand_in_057, key057)
from test_cache_lmcache_client import blocks, lmcache_wrappers
from test_cache_server import lookup_wait, register

pytest_plugins = ["conftest_cache"]

T = 5.0


def _load_grpc057() -> types.SimpleNamespace:
    src = _src057()
    with wheel_imports(src, _torch_stand_in_057(), "LMCache 0.5.7's gRPC client"):
        ns = client_namespace("grpc")
        ns.server_module = importlib.import_module(
            "lmcache.v1.multiprocess.protocols.server_module")
        return ns


@pytest.fixture(scope="module")
def lmc():
    return _load_grpc057()


def test_057_negotiate_chunk_size(lmc, cache_server):
    srv = grpc_server(cache_server)
    client = lmc.factory.create(srv.grpc_url)
    assert type(client).__name__ == "GrpcMultiprocessClient"
    try:
        assert client.negotiate_chunk_size(16).result(timeout=T) == CHUNK
        assert client.negotiate_chunk_size(CHUNK).result(timeout=T) == CHUNK
        # An alignment the fixed chunk size does not meet: refused at once, naming it.
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as bad:
            client.negotiate_chunk_size(96).result(timeout=T)
        assert time.monotonic() - t0 < 2.0
        assert bad.value.code() == grpc.StatusCode.FAILED_PRECONDITION, bad.value
        assert bad.value.details().startswith("kvsidecar: "), bad.value.details()
        assert "not a multiple of the required alignment 96" in bad.value.details()
        srv.wait_log(r"LMCache client 0\.5\.7 \(from its negotiate_chunk_size\)", 0)
        # Still served after the refusal.
        assert client.get_chunk_size().result(timeout=T) == CHUNK
        assert client.noop().result(timeout=T) == "OK"
        assert client.ping(None).result(timeout=T) is True
    finally:
        client.close()
    s = wait_grpc(srv, lambda s: s["failed"] == 1 and s["replies"] == 5, what="failed=1")
    assert s["bad_requests"] == 0 and s["unimplemented"] == 0, s


def test_057_grpc_client_full_flow_and_056_zmq_client_hits_its_chunks(lmc, cache_server,
                                                                      kv_pools):
    """A 0.5.7 engine stores through LMCache 0.5.7's gRPC client; a 0.5.6
    engine on the ZeroMQ endpoint of the same server finds and retrieves
    those chunks, byte for byte."""
    srv = grpc_server(cache_server)
    client = lmc.create_request_client(srv.grpc_url)
    pools, old_pools = kv_pools("vllm", seed=1), kv_pools("vllm", seed=2)
    toks = tuple(tokens(4, salt=157))
    try:
        assert client.negotiate_chunk_size(16).result(timeout=T) == CHUNK
        assert client.get_experimental().result(timeout=T) == ["kv_event_stream"]
        assert client.register_kv_cache(5710, lmcache_wrappers(lmc, pools), MODEL, 1,
                                        lmc.EngineType.VLLM, {"kv_layout": "NHD"},
                                        []).result(timeout=T) is None
        assert client.ping(5710).result(timeout=T) is True
        # KVEventService/SubscribeKvEvents (0.5.7's path): first batch at once.
        stream = client.subscribe_kv_events(5710, MODEL, 0, 64)
        first = _batch(stream)
        assert first.enabled and not first.lost and first.events == []
        handle, ok = client.store(key057(lmc, toks, 0, 4 * CHUNK, "w"), 5710, [blocks(0, 4)],
                                  EVENT_HANDLE).result(timeout=T)
        assert ok is True and handle == b""
        srv.wait_stats(lambda s: s["stored"] == 4)
        got = []
        while len(got) < 4:
            got += _batch(stream).events
        # The chunks' tokens as stored: token_bytes were read as 0.5.7's.
        assert [r.token_ids for r in got] == [list(toks[i * CHUNK:(i + 1) * CHUNK])
                                              for i in range(4)]
        stream.close()
        streams_gone(srv)
        sched = key057(lmc, toks, 0, 4 * CHUNK, "r57", worker=None, readers=1)
        assert client.lookup(sched, 1).result(timeout=T) is None
        assert client.wait_prefetch_status("r57", 30.0).result(timeout=T) == 4
        srv.wait_locks(4)
        dst = blocks(80, 4)
        _, ok = client.retrieve(key057(lmc, toks, 0, 4 * CHUNK, "r57"), 5710, [dst],
                                EVENT_HANDLE, 0).result(timeout=T)
        assert ok is True
        assert not pages_equal(pools, dst, pools, blocks(0, 4))
        srv.wait_locks(0)
        # extra_ranges: the key's range is empty, only the extra range frees
        # the second lookup's locks.
        sched2 = key057(lmc, toks, 0, 4 * CHUNK, "r57b", worker=None, readers=1)
        assert client.lookup(sched2, 1).result(timeout=T) is None
        assert client.wait_prefetch_status("r57b", 30.0).result(timeout=T) == 4
        srv.wait_locks(4)
        empty = key057(lmc, toks, 0, 0, "r57b", worker=None, readers=1)
        assert client.free_lookup_locks(empty, 1, ((0, 4 * CHUNK),)).result(timeout=T) is None
        srv.wait_locks(0)
        for rid in ("r57", "r57b", "w"):
            assert client.end_session(rid).result(timeout=T) is None

        # A 0.5.6 engine on ZeroMQ: token_ids keys, 2-argument calls.
        old = srv.client()
        register(old, old_pools, 5711, layout="vllm", wrapper="cpu_shm")
        assert lookup_wait(old, list(toks), "r56") == 4
        assert old.retrieve(cache_key(MODEL, 1, 0, list(toks), 0, 4 * CHUNK, "r56"), 5711,
                            [blocks(80, 4)]) == [b"", True]
        assert not pages_equal(old_pools, blocks(80, 4), pools, blocks(0, 4))
        k56 = cache_key(MODEL, 1, None, list(toks), 0, 4 * CHUNK, "r56b", num_kv_readers=1)
        assert old.lookup(k56, 1) is None
        assert old.wait_prefetch_status("r56b", 5.0) == 4
        srv.wait_locks(4)
        assert old.free_lookup_locks(k56, 1) is None
        srv.wait_locks(0)
        old.end_session("r56")
        old.end_session("r56b")
        assert old.unregister_kv_cache(5711) is None

        # No server modules: LMCache's own answer for an unknown method, at once.
        req = lmc.server_module.ServerModuleCallRequest(method="pkg.echo", payload=b"x")
        resp = client.server_module_affinity_call(req).result(timeout=T)
        assert resp.success is False and "unknown server module method: pkg.echo" in resp.error
        resp = client.server_module_call(req).result(timeout=T)
        assert resp.success is False and "unknown server module method: pkg.echo" in resp.error
        assert client.clear(False).result(timeout=T) is None
        srv.wait_stats(lambda s: s["chunks"] == 0)
        assert client.unregister_kv_cache(5710).result(timeout=T) is None
        srv.wait_idle()
    finally:
        client.close()
    s = wait_grpc(srv, lambda s: s["replies"] >= 20, what="replies>=20")
    assert s["failed"] == 0 and s["bad_requests"] == 0 and s["unimplemented"] == 0, s


def test_056_and_057_grpc_clients_on_one_server(lmc, cache_server, kv_pools):
    """Field 4 of the key, per client: a 0.5.7 client's token_bytes and a
    0.5.6 client's varint token_ids (0.5.6's protos, raw) name the same
    chunks; each client is read in the release it showed."""
    srv = grpc_server(cache_server)
    client = lmc.create_request_client(srv.grpc_url)
    pools = kv_pools("vllm")
    toks = tokens(2, salt=158)
    old = b"v056-" + uuid.uuid4().bytes
    try:
        assert client.negotiate_chunk_size(16).result(timeout=T) == CHUNK
        assert client.register_kv_cache(5720, lmcache_wrappers(lmc, pools), MODEL, 1,
                                        lmc.EngineType.VLLM, {"kv_layout": "NHD"},
                                        []).result(timeout=T) is None
        _, ok = client.store(key057(lmc, toks, 0, 2 * CHUNK, "w"), 5720, [blocks(0, 2)],
                             EVENT_HANDLE).result(timeout=T)
        assert ok is True
        srv.wait_stats(lambda s: s["stored"] == 2)
        with grpc.insecure_channel(srv.grpc_target) as ch:
            # 0.5.6's ControllerService: this client is 0.5.6 from now on.
            assert unary(ch, CTRL + "GetChunkSize")(b"", metadata=md(old),
                                                    timeout=T) == CHUNK_SIZE_REPLY
            lookup = pb_bytes(1, key056(toks, 0, 2 * CHUNK, "o", worker=None)) + pb_int(2, 1)
            assert unary(ch, LOOKUP + "Lookup")(lookup, metadata=md(old), timeout=T) == b""
            assert unary(ch, LOOKUP + "WaitPrefetchStatus")(
                wait_request("o", 30.0), metadata=md(old), timeout=T) == b"\x08\x02"
            srv.wait_locks(2)
            free = pb_bytes(1, key056(toks, 0, 2 * CHUNK, "o", worker=None)) + pb_int(2, 1)
            assert unary(ch, LOOKUP + "FreeLookupLocks")(free, metadata=md(old), timeout=T) == b""
            srv.wait_locks(0)
            assert unary(ch, LOOKUP + "EndSession")(pb_bytes(1, "o"), metadata=md(old),
                                                    timeout=T) == b""
        # The 0.5.7 client still finds them with its token_bytes.
        sched = key057(lmc, toks, 0, 2 * CHUNK, "r", worker=None, readers=1)
        assert client.lookup(sched, 1).result(timeout=T) is None
        assert client.wait_prefetch_status("r", 30.0).result(timeout=T) == 2
        assert client.free_lookup_locks(sched, 1).result(timeout=T) is None
        srv.wait_locks(0)
        for rid in ("r", "w"):
            assert client.end_session(rid).result(timeout=T) is None
        assert client.unregister_kv_cache(5720).result(timeout=T) is None
        srv.wait_idle()
    finally:
        client.close()


def test_057_engine_driven_over_grpc(lmc, cache_server):
    """0.5.7's engine-driven registration (group_layouts) over gRPC: its
    reply carries null_block_id; prepare_store / commit_store. A hybrid
    registration (two groups, one a one-chunk window) is served over gRPC
    too: its grouped inline data stored and retrieved byte for byte; a group
    the server cannot size is refused at once with the reason."""
    srv = grpc_server(cache_server)
    client = lmc.create_request_client(srv.grpc_url)
    ct = lmc.custom_types
    try:
        assert client.negotiate_chunk_size(16).result(timeout=T) == CHUNK
        payload = ct.RegisterEngineDrivenContextPayload(
            instance_id=5730, model_name=MODEL, world_size=1, block_size=32, num_layers=2,
            hidden_dim_size=64, dtype_str="bfloat16", use_mla=False, num_physical_slots=CHUNK)
        reply = client.register_kv_cache_engine_driven_context(payload).result(timeout=T)
        assert reply.shm_name.startswith("/kvsidecar.") and reply.pool_size > 0
        assert reply.null_block_id == 0
        toks = tokens(1, salt=159)
        prep = client.prepare_store(key057(lmc, toks, 0, CHUNK, "e"), 5730).result(timeout=T)
        assert prep.context["chunk_indices"] == [0]
        assert prep.context["slots"][0]["shape"] == [2, 2, CHUNK, 64]
        assert client.commit_store(key057(lmc, toks, 0, CHUNK, "e"), 5730,
                                   b"").result(timeout=T) is True
        srv.wait_stats(lambda s: s["stored"] == 1)
        full = ct.GroupLayout(num_layers=2, hidden_dim_size=64, dtype_str="bfloat16",
                              tokens_per_block=32, window_tokens=CHUNK, kv_size=2)
        swa = ct.GroupLayout(num_layers=1, hidden_dim_size=64, dtype_str="bfloat16",
                             tokens_per_block=32, window_tokens=CHUNK // 2, kv_size=1,
                             window_chunks=1)
        hybrid = ct.RegisterEngineDrivenContextPayload(
            instance_id=5731, model_name=MODEL + "-hybrid", world_size=1, block_size=32,
            num_layers=3, hidden_dim_size=64, dtype_str="bfloat16", use_mla=False,
            num_physical_slots=CHUNK, group_layouts=[full, swa])
        reply = client.register_kv_cache_engine_driven_context(hybrid).result(timeout=T)
        assert reply.shm_name.startswith("/kvsidecar.") and reply.null_block_id == 0
        staging = Staging(reply.shm_name, reply.pool_size)
        full_n, swa_n = 2 * 2 * CHUNK * 64 * 2, CHUNK // 2 * 64 * 2
        htoks = tokens(2, salt=160)

        def hkey(rid, worker=0, readers=0):
            return lmc.IPCCacheServerKey.from_token_ids(
                model_name=MODEL + "-hybrid", world_size=1, worker_id=worker,
                token_ids=list(htoks), start=0, end=2 * CHUNK, request_id=rid,
                num_kv_readers=readers)
        client.prepare_store(hkey("h"), 5731).result(timeout=T)
        data = _grouped([(0, "bfloat16", (2, 2, CHUNK, 64), [_chunk_bytes(c, full_n) for c in (1, 2)]),
                         (1, "bfloat16", (1, CHUNK // 2, 64), [_chunk_bytes(9, swa_n)])])
        assert client.commit_store(hkey("h"), 5731, data).result(timeout=T) is True
        srv.wait_stats(lambda s: s["stored"] == 4)
        assert client.lookup(hkey("hr", worker=None, readers=1), 1).result(timeout=T) is None
        assert client.wait_prefetch_status("hr", 30.0).result(timeout=T) == 2
        # Stored inline (a pool instance takes inline data too), read back
        # through the staging slots.
        got = client.prepare_retrieve(hkey("hr"), 5731).result(timeout=T)
        assert got.success is True
        ctx = got.context
        assert list(zip(ctx["group_ids"], ctx["chunk_indices"])) == [(0, 0), (0, 1), (1, 1)]
        assert [staging.read(slot) for slot in ctx["slots"]] == [
            _chunk_bytes(1, full_n), _chunk_bytes(2, full_n), _chunk_bytes(9, swa_n)]
        staging.close()
        assert client.commit_retrieve(hkey("hr"), 5731).result(timeout=T) is True
        for rid in ("h", "hr"):
            assert client.end_session(rid).result(timeout=T) is None
        odd = ct.GroupLayout(num_layers=1, hidden_dim_size=64, dtype_str="bfloat16",
                             tokens_per_block=32, kv_size=3)
        bad = ct.RegisterEngineDrivenContextPayload(
            instance_id=5732, model_name=MODEL, world_size=1, block_size=32, num_layers=2,
            hidden_dim_size=64, dtype_str="bfloat16", use_mla=False, num_physical_slots=CHUNK,
            group_layouts=[full, odd])
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:
            client.register_kv_cache_engine_driven_context(bad).result(timeout=T)
        assert time.monotonic() - t0 < 2.0
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "group_layouts[1]: kv_size 3" in refused.value.details()
        assert client.end_session("e").result(timeout=T) is None
        assert client.unregister_kv_cache_engine_driven_context(5730).result(timeout=T) is None
        assert client.unregister_kv_cache_engine_driven_context(5731).result(timeout=T) is None
        srv.wait_idle()
    finally:
        client.close()
