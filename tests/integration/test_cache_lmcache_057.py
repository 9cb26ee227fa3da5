"""kvsidecar driven by LMCache 0.5.7's own client classes (the pre-release
``lmcache==0.5.7rc2``; ``lmcache-cli==0.5.7rc3.dev0`` ships the same source),
and by a 0.5.6 client on the same endpoint at the same time.

0.5.7 changed the wire without changing the op ids: keys carry
``token_bytes`` (big-endian uint32) instead of ``token_ids``;
``free_lookup_locks`` and ``prepare_store`` always send a third argument;
``negotiate_chunk_size`` is the vLLM adapter's first request; the
engine-driven registration carries ``group_layouts`` and its reply
``null_block_id``. Neither LMCache server serves the other release; kvsidecar
serves both, telling them apart from what each request carries
(docs/lmcache-mp-compat.md, "Releases served").

Loaded like test_cache_lmcache_client.py loads 0.5.6 (torch stood in for
the import, device packages bypassed), from build-wheels/ (scripts/
install-deps.sh downloads the wheel) or ``LMCACHE057_WHEEL``. Its own pytest
process: ctest runs each file alone, so the two releases never share an
interpreter.
"""

from __future__ import annotations

import importlib
import os
import random
import time
import types
from pathlib import Path

import msgspec
import pytest

pytest.register_assert_rewrite("conftest_cache", "lmcache_client")

from conftest_cache import CHUNK, pages_equal, tokens
from lmcache_client import EVENT_HANDLE, cache_key
from lmcache_wheels import client_namespace, unpack, wheel_imports
from test_cache_engine_driven import Staging
from test_cache_lmcache_client import (PAGE, _torch_stand_in, blocks,
                                       lmcache_wrappers)
import vllm_structs as vs  # noqa: E402  (on the path conftest_cache sets)
from kvsidecar_harness import wait_until
from test_cache_l2 import RedisCluster, needs_redis, redis_overrides

pytest_plugins = ["conftest_cache"]

ROOT = Path(__file__).resolve().parents[2]
MODEL = "test-org/test-model"
T = 5.0


class _Probe(type):
    """An inert torch attribute whose own attributes are callables answering
    False: 0.5.7's device detection asks torch.<backend>.is_available()."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: False


def _torch_stand_in_057() -> types.ModuleType:
    torch = _torch_stand_in()
    base_getattr = type(torch).__getattr__

    class Module057(type(torch)):
        def __getattr__(self, name):
            v = base_getattr(self, name)
            if isinstance(v, type) and type(v) is type:
                v = _Probe(v.__name__, (), {})
                setattr(self, name, v)
            return v

    torch.__class__ = Module057
    return torch


def _wheel() -> Path | None:
    env = os.environ.get("LMCACHE057_WHEEL")
    if env:
        return Path(env)
    found = sorted((ROOT / "build-wheels").glob("lmcache-0.5.7rc2-*.whl"))
    return found[0] if found else None


def _src057() -> Path:
    wheel = _wheel()
    if wheel is None or not wheel.is_file():
        pytest.skip("lmcache 0.5.7rc2 wheel not in build-wheels/ (scripts/install-deps.sh "
                    "--with-python downloads it)")
    return unpack(wheel, "lmcache-0.5.7-")


def _load() -> types.SimpleNamespace:
    src = _src057()
    with wheel_imports(src, _torch_stand_in_057(), "LMCache 0.5.7's client"):
        ns = client_namespace("zmq")
        ns.server_module = importlib.import_module("lmcache.v1.multiprocess.protocols.server_module")
        ns.EngineGroupInfo = importlib.import_module(
            "lmcache.v1.multiprocess.group_view").EngineGroupInfo
        return ns


@pytest.fixture(scope="module")
def lmc():
    return _load()


def key057(lmc, toks, start, end, rid, worker=0, readers=0, model=MODEL):
    return lmc.IPCCacheServerKey.from_token_ids(
        model_name=model, world_size=1, worker_id=worker, token_ids=list(toks), start=start,
        end=end, request_id=rid, num_kv_readers=readers)


def _engine_driven(ct, instance: int, groups=(), model: str = MODEL, num_layers: int = 0):
    """The RegisterEngineDrivenContextPayload of these tests' workers: 64-wide
    bfloat16 layers in 32-token blocks (2 layers; 3 for a hybrid one, whose
    `groups` are its group_layouts)."""
    return ct.RegisterEngineDrivenContextPayload(
        instance_id=instance, model_name=model, world_size=1, block_size=32,
        num_layers=num_layers or (3 if groups else 2), hidden_dim_size=64, dtype_str="bfloat16",
        use_mla=False, num_physical_slots=CHUNK, group_layouts=list(groups))


def test_057_client_full_flow_and_056_client_hits_its_chunks(lmc, cache_server, kv_pools):
    """A 0.5.7 engine stores through LMCache 0.5.7's client; a 0.5.6 client
    on the same endpoint finds and retrieves those chunks (a rolling upgrade
    keeps its cache); both are answered in their own dialect."""
    srv = cache_server()
    client = lmc.create_request_client(srv.endpoint, context=srv.ctx)
    pools = kv_pools("vllm")
    toks = tuple(tokens(4, salt=57))
    try:
        # The vLLM adapter's first request (0.5.7): the chunk size, for its alignment.
        assert client.negotiate_chunk_size(16).result(timeout=T) == CHUNK
        mark = srv.mark()
        # An alignment the fixed chunk size does not meet fails at once, naming both.
        with pytest.raises(Exception) as bad:
            client.negotiate_chunk_size(96).result(timeout=T)
        assert "not a multiple of the required alignment 96" in str(bad.value)
        srv.wait_log(r"LMCache client 0\.5\.7 \(from its negotiate_chunk_size\)", 0)
        del mark
        assert client.get_experimental().result(timeout=T) == ["kv_event_stream"]
        assert client.register_kv_cache(5700, lmcache_wrappers(lmc, pools), MODEL, 1,
                                        lmc.EngineType.VLLM, {"kv_layout": "NHD"},
                                        []).result(timeout=T) is None
        handle, ok = client.store(key057(lmc, toks, 0, 4 * CHUNK, "w"), 5700, [blocks(0, 4)],
                                  EVENT_HANDLE).result(timeout=T)
        assert ok is True
        srv.wait_stats(lambda s: s["stored"] == 4)
        sched = key057(lmc, toks, 0, 4 * CHUNK, "r57", worker=None, readers=1)
        assert client.lookup(sched, 1).result(timeout=T) is None
        assert client.wait_prefetch_status("r57", 30.0).result(timeout=T) == 4
        dst = blocks(80, 4)
        _, ok = client.retrieve(key057(lmc, toks, 0, 4 * CHUNK, "r57"), 5700, [dst],
                                EVENT_HANDLE, 0).result(timeout=T)
        assert ok is True
        assert not pages_equal(pools, dst, pools, blocks(0, 4))
        # 0.5.7's free_lookup_locks always sends extra_ranges: here the key's
        # range is empty and only the extra range frees the lookup's locks.
        empty = key057(lmc, toks, 0, 0, "r57", worker=None, readers=1)
        assert client.free_lookup_locks(empty, 1, ((0, 4 * CHUNK),)).result(timeout=T) is None
        srv.wait_locks(0)
        assert client.end_session("r57").result(timeout=T) is None
        assert client.end_session("w").result(timeout=T) is None

        # A 0.5.6 engine (its frames: token_ids keys, 2-argument calls).
        old = srv.client()
        k56 = cache_key(MODEL, 1, None, toks, 0, 4 * CHUNK, "r56", num_kv_readers=1)
        assert old.lookup(k56, 1) is None
        assert old.wait_prefetch_status("r56", 5.0) == 4
        srv.wait_locks(4)
        assert old.free_lookup_locks(k56, 1) is None
        srv.wait_locks(0)
        old.end_session("r56")

        # No server modules: LMCache's own answer for an unknown method, at once.
        req = lmc.server_module.ServerModuleCallRequest(method="pkg.echo", payload=b"x")
        resp = client.server_module_affinity_call(req).result(timeout=T)
        assert resp.success is False and "unknown server module method: pkg.echo" in resp.error
        assert client.unregister_kv_cache(5700).result(timeout=T) is None
        srv.wait_idle()
    finally:
        client.close()


def unified_wrappers(lmc, pools) -> list:
    """What LMCache 0.5.7's SGLang adapter (UnifiedLMCacheMPConnector)
    registers for an MHA pool: the K layers then the V layers, each viewed
    [num_pages, page_size, heads, head_dim] (its `_to_wire_block_tensor`)."""
    out = []
    for d in pools.descriptors():
        m = dict(d["metadata"])
        pbs, heads, hd = m["shape"]
        m["shape"] = [pbs // PAGE, PAGE, heads, hd]
        m["stride"] = [PAGE * heads * hd, heads * hd, hd, 1]
        data = lmc.CpuShmIPCData(version=1, metadata=lmc.TensorMetadata(**m),
                                 shm_name=d["shm_name"], nbytes=d["nbytes"])
        out.append(lmc.CpuShmTensorWrapper.from_wire(data))
    return out


def test_057_sglang_unified_registration_shares_chunks_with_056_k_v(lmc, cache_server, kv_pools):
    """LMCache 0.5.7's SGLang adapter registers kv_list_layout "unified"
    (per-component [pages, page_size, heads, head_dim] views, one engine
    group), 0.5.6's the flat K-then-V list ("k_v"). Both are the same pages:
    a chunk the 0.5.7 SGLang engine stores is byte for byte a hit for a 0.5.6
    SGLang engine, and the other way round. An MLA or hybrid unified
    registration is refused at once, naming why."""
    srv = cache_server()
    client = lmc.create_request_client(srv.endpoint, context=srv.ctx)
    new, old_pools = kv_pools("sglang", seed=71), kv_pools("sglang", seed=72)
    layers = len(new.descriptors()) // 2
    group = lmc.EngineGroupInfo(engine_group_id=0, layer_indices=tuple(range(2 * layers)),
                                tokens_per_block=PAGE, sw_size_tokens=-1, recurrent_state=False)
    toks = tuple(tokens(2, salt=71))
    back = tuple(tokens(2, salt=72))
    old = srv.client()
    try:
        assert client.register_kv_cache(5710, unified_wrappers(lmc, new), MODEL, 1,
                                        lmc.EngineType.SGLANG, {"kv_list_layout": "unified"},
                                        [group]).result(timeout=T) is None
        assert old.register_kv_cache(5610, old_pools.wire_kv_cache(), MODEL, 1, "sglang",
                                     {"tokens_per_block": PAGE, "kv_list_layout": "k_v"},
                                     []) is None
        # 0.5.7 (unified) stores, 0.5.6 (k_v) retrieves the same bytes.
        _, ok = client.store(key057(lmc, toks, 0, 2 * CHUNK, "u-w"), 5710, [blocks(0, 2)],
                             EVENT_HANDLE).result(timeout=T)
        assert ok is True
        srv.wait_stats(lambda s: s["stored"] == 2)
        k56 = cache_key(MODEL, 1, None, toks, 0, 2 * CHUNK, "o-r", num_kv_readers=1)
        assert old.lookup(k56, 1) is None
        assert old.wait_prefetch_status("o-r", 5.0) == 2
        k56w = cache_key(MODEL, 1, 0, toks, 0, 2 * CHUNK, "o-r")
        assert old.retrieve(k56w, 5610, [blocks(40, 2)], EVENT_HANDLE, 0)[1] is True
        assert not pages_equal(old_pools, blocks(40, 2), new, blocks(0, 2))
        old.end_session("o-r")
        # 0.5.6 (k_v) stores, 0.5.7 (unified) retrieves the same bytes.
        k56s = cache_key(MODEL, 1, 0, back, 0, 2 * CHUNK, "o-w")
        assert old.store(k56s, 5610, [blocks(0, 2)], EVENT_HANDLE)[1] is True
        srv.wait_stats(lambda s: s["stored"] == 4)
        sched = key057(lmc, back, 0, 2 * CHUNK, "u-r", worker=None, readers=1)
        assert client.lookup(sched, 1).result(timeout=T) is None
        assert client.wait_prefetch_status("u-r", 30.0).result(timeout=T) == 2
        _, ok = client.retrieve(key057(lmc, back, 0, 2 * CHUNK, "u-r"), 5710, [blocks(40, 2)],
                                EVENT_HANDLE, 0).result(timeout=T)
        assert ok is True
        assert not pages_equal(new, blocks(40, 2), old_pools, blocks(0, 2))
        for rid in ("u-w", "u-r"):
            client.end_session(rid).result(timeout=T)
        old.end_session("o-w")

        # MLA components ([pages, page_size, dim]) and a sliding-window group
        # beside the full one: refused at once, with the reason.
        mla = lmc.CpuShmTensorWrapper.from_wire(lmc.CpuShmIPCData(
            version=1, metadata=lmc.TensorMetadata(
                dtype="bfloat16", shape=[8, PAGE, 64], stride=[PAGE * 64, 64, 1],
                storage_offset=0, device_uuid="cpu"),
            shm_name=new.descriptors()[0]["shm_name"], nbytes=new.descriptors()[0]["nbytes"]))
        with pytest.raises(Exception) as refused:
            client.register_kv_cache(5711, [mla], MODEL, 1, lmc.EngineType.SGLANG,
                                     {"kv_list_layout": "unified"}, []).result(timeout=T)
        assert "MLA components" in str(refused.value)
        swa = lmc.EngineGroupInfo(engine_group_id=1, layer_indices=(2 * layers - 1,),
                                  tokens_per_block=PAGE, sw_size_tokens=4 * PAGE,
                                  recurrent_state=False)
        full = lmc.EngineGroupInfo(engine_group_id=0,
                                   layer_indices=tuple(range(2 * layers - 1)),
                                   tokens_per_block=PAGE, sw_size_tokens=-1,
                                   recurrent_state=False)
        with pytest.raises(Exception) as refused:
            client.register_kv_cache(5712, unified_wrappers(lmc, new), MODEL, 1,
                                     lmc.EngineType.SGLANG, {"kv_list_layout": "unified"},
                                     [full, swa]).result(timeout=T)
        assert "2 engine groups" in str(refused.value)
        assert client.unregister_kv_cache(5710).result(timeout=T) is None
        assert old.unregister_kv_cache(5610) is None
        srv.wait_idle()
    finally:
        client.close()


def test_057_engine_driven_registration_and_prepare_store(lmc, cache_server):
    """0.5.7's engine-driven payload (group_layouts) gets null_block_id in its
    reply; prepare_store's third argument (skipped_chunks) is accepted."""
    srv = cache_server()
    client = lmc.create_request_client(srv.endpoint, context=srv.ctx)
    ct = lmc.custom_types
    try:
        reply = client.register_kv_cache_engine_driven_context(
            _engine_driven(ct, 77)).result(timeout=T)
        assert reply.shm_name.startswith("/kvsidecar.") and reply.pool_size > 0
        assert reply.null_block_id == 0
        toks = tokens(1, salt=58)
        prep = client.prepare_store(key057(lmc, toks, 0, CHUNK, "e"), 77).result(timeout=T)
        assert prep.context["chunk_indices"] == [0]
        assert prep.context["slots"][0]["shape"] == [2, 2, CHUNK, 64]
        assert client.commit_store(key057(lmc, toks, 0, CHUNK, "e"), 77, b"").result(timeout=T) is True
        srv.wait_stats(lambda s: s["stored"] == 1)
        client.end_session("e").result(timeout=T)
        assert client.unregister_kv_cache_engine_driven_context(77).result(timeout=T) is None
        srv.wait_idle()
    finally:
        client.close()


def _grouped(groups) -> bytes:
    """LMCache 0.5.7's GroupedTensorEnvelope (tensor_wire.py), as msgspec
    encodes it: groups of (first chunk index, dtype, shape, [bytes])."""
    return msgspec.msgpack.encode({"version": 1, "groups": [
        {"chunk_indices": list(range(first, first + len(datas))),
         "tensors": [{"dtype": dtype, "shape": list(shape), "data": d} for d in datas]}
        for first, dtype, shape, datas in groups]})


def _chunk_bytes(tag: int, n: int) -> bytes:
    return bytes((tag * 31 + i * 7) % 251 for i in range(n))


# The hybrid worker of these tests: a full-attention group of 2 K/V layers
# (bfloat16) and a one-chunk sliding-window group of 1 single-plane layer
# (float32, 128 of a chunk's 256 tokens); each group's chunk shape and bytes.
HYBRID_SHAPES = ((2, 2, CHUNK, 64), (1, CHUNK // 2, 128))
HYBRID_BYTES = (2 * 2 * CHUNK * 64 * 2, CHUNK // 2 * 128 * 4)


def _hybrid_groups(ct):
    return (ct.GroupLayout(num_layers=2, hidden_dim_size=64, dtype_str="bfloat16",
                           tokens_per_block=32, window_tokens=CHUNK, kv_size=2),
            ct.GroupLayout(num_layers=1, hidden_dim_size=128, dtype_str="float32",
                           tokens_per_block=32, window_tokens=CHUNK // 2, kv_size=1,
                           window_chunks=1))


@pytest.mark.parametrize("transfer", ["in_place", "shm", "inline"])
def test_057_hybrid_model_groups_store_lookup_and_retrieve(lmc, cache_server, transfer):
    """A hybrid-KV worker (group_layouts with a full-attention group and a
    sliding-window group of one chunk's window, as LMCache 0.5.7's vLLM
    connector registers Gemma-style models), over the instance's staging
    pool (a slot of the group's size per group's chunk: slots, chunk_indices,
    group_ids) and inline (the grouped envelope): each group's chunks stored,
    a lookup hits the longest prefix every group can serve (full attention:
    every chunk; the window: its last chunk), the retrieve returns each
    group's in-window suffix byte for byte, and what does not match a group
    is refused."""
    srv = cache_server(overrides={
        "cache.engine_driven_transfer": "inline" if transfer == "inline" else "shm",
        "cache.engine_driven_in_place": transfer == "in_place"})
    client = lmc.create_request_client(srv.endpoint, context=srv.ctx)
    ct = lmc.custom_types
    full, swa = _hybrid_groups(ct)
    full_shape, swa_shape = HYBRID_SHAPES
    full_n, swa_n = HYBRID_BYTES
    staging = None
    try:
        reply = client.register_kv_cache_engine_driven_context(
            _engine_driven(ct, 81, [full, swa])).result(timeout=T)
        assert reply.null_block_id == 0
        if transfer == "inline":
            assert (reply.shm_name, reply.pool_size) == ("", 0)
        else:
            # 16 slots per group, each as long as the largest group's chunk
            # (in place: after the L1 offsets, page-aligned).
            slots = 2 * 16 * full_n
            want = (64 << 20) + (slots + 4095) // 4096 * 4096 if transfer == "in_place" else slots
            assert reply.shm_name.startswith("/kvsidecar.") and reply.pool_size == want
            staging = Staging(reply.shm_name, reply.pool_size)
        srv.wait_log(r"instance 81 registered \(engine-driven, a hybrid model of 2 groups\)")

        def data(g, abs_chunk, tag):
            return _chunk_bytes(tag + abs_chunk, full_n) if g == 0 else \
                _chunk_bytes(tag + 100 + abs_chunk, swa_n)

        def store(toks, rid, start, n, swa_chunks, tag):
            """Chunks [start, start + n) of group 0 and `swa_chunks` (within
            the range) of the window group, as the worker stores them."""
            key = key057(lmc, toks, start * CHUNK, (start + n) * CHUNK, rid)
            if transfer == "inline":
                client.prepare_store(key, 81).result(timeout=T)
                return client.commit_store(key, 81, _grouped([
                    (0, "bfloat16", full_shape, [data(0, start + c, tag) for c in range(n)]),
                    (swa_chunks[0] if swa_chunks else 0, "float32", swa_shape,
                     [data(1, start + c, tag) for c in swa_chunks])])).result(timeout=T)
            skipped = ((), tuple(c for c in range(n) if c not in swa_chunks))
            ctx = client.prepare_store(key, 81, skipped).result(timeout=T).context
            assert len(ctx["slots"]) == len(ctx["chunk_indices"]) == len(ctx["group_ids"])
            for slot, c, g in zip(ctx["slots"], ctx["chunk_indices"], ctx["group_ids"]):
                assert slot["shape"] == list(full_shape if g == 0 else swa_shape)
                assert slot["dtype"] == ("bfloat16" if g == 0 else "float32")
                assert g == 0 or c in swa_chunks
                staging.write(slot, data(g, start + c, tag))
            return client.commit_store(key, 81, b"").result(timeout=T)

        def retrieve(toks, rid, n):
            """{group: {chunk: bytes}} of a prepare_retrieve of chunks [0, n)."""
            key = key057(lmc, toks, 0, n * CHUNK, rid)
            got = client.prepare_retrieve(key, 81).result(timeout=T)
            assert got.success is True
            out: dict[int, dict[int, bytes]] = {0: {}, 1: {}}
            if transfer == "inline":
                env = msgspec.msgpack.decode(got.data)
                assert env["version"] == 1 and len(env["groups"]) == 2
                for g, grp in enumerate(env["groups"]):
                    for c, t in zip(grp["chunk_indices"], grp["tensors"]):
                        assert tuple(t["shape"]) == (full_shape if g == 0 else swa_shape)
                        out[g][c] = t["data"]
            else:
                ctx = got.context
                for slot, g, c in zip(ctx["slots"], ctx["group_ids"], ctx["chunk_indices"]):
                    out[g][c] = staging.read(slot)
            assert client.commit_retrieve(key, 81).result(timeout=T) is True
            return out

        # Three chunks: the window group's chunk 0 was all-null (not sent).
        toks = tokens(3, salt=81)
        assert store(toks, "s", 0, 3, [1, 2], 10) is True
        srv.wait_stats(lambda s: s["stored"] == 5 and s["reserved"] == 0)
        assert client.lookup(key057(lmc, toks, 0, 3 * CHUNK, "r", worker=None, readers=1),
                             1).result(timeout=T) is None
        assert client.wait_prefetch_status("r", 10.0).result(timeout=T) == 3
        srv.wait_locks(4)  # group 0: chunks 0..2; the window: chunk 2
        got = retrieve(toks, "r", 3)
        assert sorted(got[0]) == [0, 1, 2] and sorted(got[1]) == [2]
        assert [got[0][c] for c in range(3)] == [data(0, c, 10) for c in range(3)]
        assert got[1][2] == data(1, 2, 10)
        client.end_session("r").result(timeout=T)
        srv.wait_locks(0)

        # Not monotone: the window group holds chunks 1 and 3 of four. A
        # 3-chunk prefix would need its chunk 2; the 4-chunk prefix is served.
        toks4 = tokens(4, salt=82)
        assert store(toks4, "s4", 0, 4, [1], 20) is True
        assert store(toks4, "s4b", 3, 1, [0], 20) is True
        srv.wait_stats(lambda s: s["stored"] == 11 and s["reserved"] == 0)
        assert client.lookup(key057(lmc, toks4, 0, 4 * CHUNK, "q", worker=None, readers=1),
                             1).result(timeout=T) is None
        assert client.wait_prefetch_status("q", 10.0).result(timeout=T) == 4
        got = retrieve(toks4, "q", 4)
        assert sorted(got[0]) == [0, 1, 2, 3] and got[1] == {3: data(1, 3, 20)}
        client.end_session("q").result(timeout=T)
        # Three of the four: chunk 2 of the window group is missing, and the
        # longest shorter prefix it can serve is 2 chunks (its chunk 1).
        assert client.lookup(key057(lmc, toks4, 0, 3 * CHUNK, "q3", worker=None, readers=1),
                             1).result(timeout=T) is None
        assert client.wait_prefetch_status("q3", 10.0).result(timeout=T) == 2
        client.end_session("q3").result(timeout=T)

        # Inline data that does not match a group's layout (on a pool
        # instance too, as LMCache takes inline data there): refused, nothing stored.
        bad = tokens(1, salt=83)
        keyb = key057(lmc, bad, 0, CHUNK, "b")
        client.prepare_store(keyb, 81).result(timeout=T)
        assert client.commit_store(keyb, 81, _grouped([
            (0, "bfloat16", full_shape, [_chunk_bytes(30, full_n)]),
            (0, "bfloat16", swa_shape, [_chunk_bytes(31, swa_n // 2)])])).result(timeout=T) is False
        srv.wait_log(r"groups\[1\]\.tensors\[0\]: dtype 'bfloat16'")
        assert client.commit_store(keyb, 81, _grouped([
            (0, "bfloat16", full_shape, [_chunk_bytes(30, full_n)])])).result(timeout=T) is False
        srv.wait_log(r"1 groups in the data for 2 registered groups")
        for rid in ("s", "s4", "s4b", "b"):
            client.end_session(rid).result(timeout=T)
        srv.wait_stats(lambda s: s["stored"] == 11 and s["reserved"] == 0)

        # A group the server cannot size is refused by name, at once.
        odd = ct.GroupLayout(num_layers=1, hidden_dim_size=64, dtype_str="bfloat16",
                             tokens_per_block=32, kv_size=3)
        with pytest.raises(Exception) as refused:
            client.register_kv_cache_engine_driven_context(
                _engine_driven(ct, 82, [full, odd], num_layers=2)).result(timeout=T)
        assert "group_layouts[1]: kv_size 3" in str(refused.value)
        if staging is not None:  # every slot handed out came back
            srv.wait_stats(lambda s: s["staging_free"] == 32, actor="gpu_transfer")
        assert client.unregister_kv_cache_engine_driven_context(81).result(timeout=T) is None
        srv.wait_idle()
    finally:
        if staging is not None:
            staging.close()
        client.close()


def _retrieve_3_inline(lmc, client, instance: int, toks, tag: int) -> None:
    """Request "r" retrieves chunks 0..2 of a hybrid instance (inline): group
    0's 3 chunks and the window group's chunk 2, as stored with `tag`
    (group 0's chunk c: _chunk_bytes(tag + c); the window's: tag + 100 + c)."""
    key = key057(lmc, toks, 0, 3 * CHUNK, "r")
    env = msgspec.msgpack.decode(client.prepare_retrieve(key, instance).result(timeout=T).data)
    assert [t["data"] for t in env["groups"][0]["tensors"]] == \
        [_chunk_bytes(tag + c, HYBRID_BYTES[0]) for c in range(3)]
    assert env["groups"][1]["chunk_indices"] == [2]
    assert env["groups"][1]["tensors"][0]["data"] == _chunk_bytes(tag + 102, HYBRID_BYTES[1])
    assert client.commit_retrieve(key, instance).result(timeout=T) is True


def test_057_hybrid_model_groups_in_l2_served_after_a_restart(lmc, cache_server, tmp_path):
    """An engine-driven hybrid model's chunks go to L2, every group's under
    its own key and layout (the one-plane window group too); routers get CPU
    and DISK BlockStored events for group 0's chunks only. After a restart on
    the same disk (L1 empty), a lookup fetches each group's part of the hit
    back (full attention: every chunk; the window: its last chunk) and the
    retrieve returns it byte for byte. When the disk evicts the chunks, only
    group 0's removals are announced: routers never heard of the others."""
    disk = {"cache.engine_driven_transfer": "inline", "l2.disk.enabled": True,
            "l2.disk.path": str(tmp_path / "d"), "l2.disk.size": "1MiB"}
    full_shape, swa_shape = HYBRID_SHAPES
    full_n, swa_n = HYBRID_BYTES
    plain_model = MODEL + "-one-group"
    toks = tokens(3, salt=85)

    def register(client, ct, plain=True):
        client.register_kv_cache_engine_driven_context(
            _engine_driven(ct, 85, _hybrid_groups(ct))).result(timeout=T)
        if plain:
            client.register_kv_cache_engine_driven_context(
                _engine_driven(ct, 86, model=plain_model)).result(timeout=T)

    def store_hybrid(client, toks, rid, tag, swa_chunks):
        n = len(toks) // CHUNK
        assert client.commit_store(key057(lmc, toks, 0, n * CHUNK, rid), 85, _grouped([
            (0, "bfloat16", full_shape, [_chunk_bytes(tag + c, full_n) for c in range(n)]),
            (swa_chunks[0], "float32", swa_shape,
             [_chunk_bytes(tag + 100 + c, swa_n) for c in swa_chunks])])).result(timeout=T)

    def by_medium(events) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for e in events:
            out.setdefault(e.medium, []).extend(e.block_hashes)
        return out

    ct = lmc.custom_types
    first = cache_server(events=True, overrides=disk)
    client = lmc.create_request_client(first.endpoint, context=first.ctx)
    try:
        register(client, ct)
        store_hybrid(client, toks, "h", 50, [1, 2])
        pkey = key057(lmc, tokens(1, salt=86), 0, CHUNK, "p", model=plain_model)
        client.prepare_store(pkey, 86).result(timeout=T)
        assert client.commit_store(pkey, 86, msgspec.msgpack.encode({"version": 1, "tensors": [
            {"dtype": "bfloat16", "shape": list(full_shape),
             "data": _chunk_bytes(70, full_n)}]})).result(timeout=T) is True
        # The hybrid prefix's 3 group-0 chunks and the plain chunk, on CPU
        # and on DISK; the window group's 2 chunks are written, not announced.
        got = by_medium(first.events(8, kind=vs.BlockStored, timeout=10))
        assert len(got["CPU"]) == 4 and sorted(got["DISK"]) == sorted(got["CPU"]), got
        group0 = got["CPU"][:3]
        st = first.wait_stats(lambda s: s["written"] >= 6, actor="l2", what="6 written")
        assert st["written"] == 6, st  # 3 + 2 hybrid, 1 plain
        for rid in ("h", "p"):
            client.end_session(rid).result(timeout=T)
    finally:
        client.close()
    first.close()

    second = cache_server(events=True, overrides=disk)
    second.wait_log(r"l2#\d+ started: disk .* 6 chunks found")
    client = lmc.create_request_client(second.endpoint, context=second.ctx)
    try:
        register(client, ct, plain=False)

        def hit(n, rid):
            assert client.lookup(key057(lmc, toks, 0, n * CHUNK, rid, worker=None, readers=1),
                                 1).result(timeout=T) is None
            return client.wait_prefetch_status(rid, 10.0).result(timeout=T)

        # L1 is empty: the 3-chunk hit comes from the disk (group 0's chunks
        # 0..2, the window's chunk 2), and the retrieve returns those bytes.
        assert hit(3, "r") == 3
        st = second.wait_stats(lambda s: s["fetched_disk"] >= 4, actor="l2", what="4 fetched")
        assert st["fetched_disk"] == 4, st
        _retrieve_3_inline(lmc, client, 85, toks, 50)
        client.end_session("r").result(timeout=T)
        # Two chunks: group 0's are in L1 now, the window's chunk 1 is read.
        assert hit(2, "r2") == 2
        st = second.wait_stats(lambda s: s["fetched_disk"] >= 5, actor="l2", what="5 fetched")
        assert st["fetched_disk"] == 5, st
        client.end_session("r2").result(timeout=T)
        second.wait_idle()
    finally:
        client.close()


@needs_redis
def test_057_hybrid_model_shared_through_redis_with_another_node(lmc, cache_server, tmp_path):
    """Two sidecars (two nodes) on one Redis Cluster: a hybrid prefix the
    first stores (every group's chunks written, group 0's announced as
    SHARED) is a hit on the second, whose L1 never held it: each group's
    part of the hit fetched from Redis and retrieved byte for byte."""
    cluster = RedisCluster(tmp_path / "redis")
    full_shape, swa_shape = HYBRID_SHAPES
    full_n, swa_n = HYBRID_BYTES
    o = {"cache.engine_driven_transfer": "inline", **redis_overrides(cluster)}
    clients = []
    try:
        a = cache_server(events=True, overrides=o)
        b = cache_server(overrides=o)
        ct = lmc.custom_types
        for srv in (a, b):
            clients.append(lmc.create_request_client(srv.endpoint, context=srv.ctx))
            clients[-1].register_kv_cache_engine_driven_context(
                _engine_driven(ct, 88, _hybrid_groups(ct))).result(timeout=T)
        ca, cb = clients
        toks = tokens(3, salt=88)
        assert ca.commit_store(key057(lmc, toks, 0, 3 * CHUNK, "s"), 88, _grouped([
            (0, "bfloat16", full_shape, [_chunk_bytes(80 + c, full_n) for c in range(3)]),
            (1, "float32", swa_shape, [_chunk_bytes(180 + c, swa_n) for c in (1, 2)])]),
        ).result(timeout=T) is True
        st = a.wait_stats(lambda s: s["written"] >= 5, actor="l2", what="5 written")
        assert st["written"] == 5, st
        shared = [h for e in a.events(6, kind=vs.BlockStored) if e.medium == "SHARED"
                  for h in e.block_hashes]
        assert len(shared) == 3, shared  # group 0's chunks only
        assert cb.lookup(key057(lmc, toks, 0, 3 * CHUNK, "r", worker=None, readers=1),
                         1).result(timeout=T) is None
        assert cb.wait_prefetch_status("r", 10.0).result(timeout=T) == 3
        st = b.wait_stats(lambda s: s["fetched_redis"] >= 4, actor="l2", what="4 fetched")
        assert st["fetched_redis"] == 4, st  # group 0's 3 chunks, the window's last
        _retrieve_3_inline(lmc, cb, 88, toks, 80)
        ca.end_session("s").result(timeout=T)
        cb.end_session("r").result(timeout=T)
        b.wait_idle()
    finally:
        for c in clients:
            c.close()
        cluster.close()


def test_057_hybrid_window_chunks_leave_the_disk_unannounced(lmc, cache_server, tmp_path):
    """Prefixes of a hybrid model that overflow a 1 MiB disk: the disk
    evicts the oldest chunks of every group, and routers get a DISK
    BlockRemoved only for chunks they got a DISK BlockStored for (group 0's);
    the window group's chunks, never announced, leave quietly."""
    srv = cache_server(events=True, overrides={
        "cache.engine_driven_transfer": "inline", "l2.disk.enabled": True,
        "l2.disk.path": str(tmp_path / "d"), "l2.disk.size": "1MiB"})
    client = lmc.create_request_client(srv.endpoint, context=srv.ctx)
    ct = lmc.custom_types
    full_shape, swa_shape = HYBRID_SHAPES
    full_n, swa_n = HYBRID_BYTES
    try:
        client.register_kv_cache_engine_driven_context(
            _engine_driven(ct, 87, _hybrid_groups(ct))).result(timeout=T)
        announced: set[int] = set()
        removed: list[int] = []

        def drain() -> None:
            while (m := srv.sub.recv(0, 0.05)) is not None:
                srv.events_seen.extend(vs.decoder.decode(m.payload).events)
            for e in srv.events_seen:
                if e.medium == "DISK" and isinstance(e, vs.BlockStored):
                    announced.update(e.block_hashes)
                elif e.medium == "DISK" and isinstance(e, vs.BlockRemoved):
                    removed.extend(e.block_hashes)
            srv.events_seen.clear()

        # Prefixes of 3, 7 and 7 chunks (the window group's last chunk each;
        # 448 + 960 + 960 KiB), then one of 1 chunk whose DISK event comes
        # after every earlier removal (one stream, in order).
        first = None
        for i, n in enumerate((3, 7, 7, 1)):
            toks = tokens(n, salt=90 + i)
            assert client.commit_store(key057(lmc, toks, 0, n * CHUNK, f"e{i}"), 87, _grouped([
                (0, "bfloat16", full_shape, [_chunk_bytes(i + c, full_n) for c in range(n)]),
                (n - 1, "float32", swa_shape, [_chunk_bytes(i + 9, swa_n)])])).result(timeout=T)
            wait_until(lambda: drain() or len(announced) >= sum((3, 7, 7, 1)[:i + 1]), 10,
                       f"prefix {i}'s DISK events")
            if first is None:
                first = set(announced)
        st = srv.wait_stats(lambda s: s["written"] == 22, actor="l2", what="22 written")
        assert st["disk_quiet"] < 4, st  # window chunks were evicted too
        assert first <= set(removed), (first, removed)  # the first prefix is gone
        assert set(removed) <= announced, set(removed) - announced
        for i in range(4):
            client.end_session(f"e{i}").result(timeout=T)
        srv.wait_idle()
    finally:
        client.close()


def test_057_hybrid_lmcache_driven_never_stores_all_null_chunks(lmc, cache_server, kv_pools):
    """The lmcache-driven path of a hybrid model: vLLM pools of two layers in
    two engine groups (full attention, and a sliding window whose blocks out
    of the window are vLLM's null block 0). A chunk whose block ids in some
    group are all 0 holds no KV there: it is not stored (LMCache's
    all_null_chunk_masks), so no later, shorter prefix can hit its garbage;
    the chunks after it are stored and retrieved byte for byte."""
    srv = cache_server()
    client = lmc.create_request_client(srv.endpoint, context=srv.ctx)
    pools = kv_pools("vllm", seed=85)
    full = lmc.EngineGroupInfo(engine_group_id=0, layer_indices=(0,), tokens_per_block=PAGE,
                               sw_size_tokens=-1, recurrent_state=False)
    swa = lmc.EngineGroupInfo(engine_group_id=1, layer_indices=(1,), tokens_per_block=PAGE,
                              sw_size_tokens=CHUNK // 2, recurrent_state=False)
    toks = tuple(tokens(3, salt=85))
    per_chunk = CHUNK // PAGE
    try:
        assert client.register_kv_cache(8500, lmcache_wrappers(lmc, pools), MODEL, 1,
                                        lmc.EngineType.VLLM, {"kv_layout": "NHD"},
                                        [full, swa]).result(timeout=T) is None
        # Chunk 0 of the window group is out of the window: all null blocks.
        window_ids = [0] * per_chunk + blocks(80 + per_chunk, 2)
        _, ok = client.store(key057(lmc, toks, 0, 3 * CHUNK, "w"), 8500,
                             [blocks(1, 3), window_ids], EVENT_HANDLE).result(timeout=T)
        assert ok is True
        srv.wait_stats(lambda s: s["stored"] == 2 and s["reserved"] == 0)
        # The prefix starts with the chunk that was not stored: no hit.
        assert client.lookup(key057(lmc, toks, 0, 3 * CHUNK, "r", worker=None, readers=1),
                             1).result(timeout=T) is None
        assert client.wait_prefetch_status("r", 10.0).result(timeout=T) == 0
        client.end_session("r").result(timeout=T)
        # From key.start = 1 chunk (the engine holds chunk 0): the other two hit,
        # and come back as they were stored, in both groups' pages.
        assert client.lookup(key057(lmc, toks, CHUNK, 3 * CHUNK, "r2", worker=None, readers=1),
                             1).result(timeout=T) is None
        assert client.wait_prefetch_status("r2", 10.0).result(timeout=T) == 3
        dst0, dst1 = blocks(50, 2), blocks(128, 2)
        src0, src1 = blocks(1, 3)[per_chunk:], window_ids[per_chunk:]

        def mismatches():  # layer 0 reads group 0's pages, layer 1 group 1's
            return [(kv, layer, d) for kv in range(2)
                    for layer, dst, src in ((0, dst0, src0), (1, dst1, src1))
                    for d, s_ in zip(dst, src)
                    if pools.page(kv, layer, d) != pools.page(kv, layer, s_)]
        assert len(mismatches()) == 2 * 2 * 2 * per_chunk  # random pages differ at first
        _, ok = client.retrieve(key057(lmc, toks, CHUNK, 3 * CHUNK, "r2"), 8500,
                                [dst0, dst1], EVENT_HANDLE, 0).result(timeout=T)
        assert ok is True
        assert mismatches() == []
        for rid in ("w", "r2"):
            client.end_session(rid).result(timeout=T)
        assert client.unregister_kv_cache(8500).result(timeout=T) is None
        srv.wait_idle()
    finally:
        client.close()


def test_057_lookup_from_key_start_counts_the_engines_prefix(lmc, cache_server, kv_pools):
    """LMCache 0.5.7 sends key.start > 0 when the engine's prefix cache holds
    the chunks below it: those are not looked for (nor locked), and the hit
    is absolute. Only chunks 2..3 of a 4-chunk prompt are stored: from 0 the
    lookup hits nothing, from start = 2 chunks it hits all 4 and locks 2; a
    retrieve of chunks 2..3 then reads them. A 0.5.6 key's start is ignored,
    as LMCache 0.5.6 ignores it."""
    srv = cache_server()
    client = lmc.create_request_client(srv.endpoint, context=srv.ctx)
    pools = kv_pools("vllm")
    toks = tuple(tokens(4, salt=59))
    try:
        assert client.register_kv_cache(5900, lmcache_wrappers(lmc, pools), MODEL, 1,
                                        lmc.EngineType.VLLM, {"kv_layout": "NHD"},
                                        []).result(timeout=T) is None
        _, ok = client.store(key057(lmc, toks, 2 * CHUNK, 4 * CHUNK, "w"), 5900, [blocks(0, 2)],
                             EVENT_HANDLE).result(timeout=T)
        assert ok is True
        srv.wait_stats(lambda s: s["stored"] == 2)
        # From chunk 0: chunk 0 is missing, so nothing.
        assert client.lookup(key057(lmc, toks, 0, 4 * CHUNK, "a", worker=None, readers=1),
                             1).result(timeout=T) is None
        assert client.wait_prefetch_status("a", 10.0).result(timeout=T) == 0
        srv.wait_locks(0)
        client.end_session("a").result(timeout=T)
        # From key.start = 2 chunks: 2 engine-covered + 2 found, 2 locked.
        assert client.lookup(key057(lmc, toks, 2 * CHUNK, 4 * CHUNK, "b", worker=None,
                                    readers=1), 1).result(timeout=T) is None
        assert client.wait_prefetch_status("b", 10.0).result(timeout=T) == 4
        srv.wait_locks(2)
        dst = blocks(40, 2)
        _, ok = client.retrieve(key057(lmc, toks, 2 * CHUNK, 4 * CHUNK, "b"), 5900, [dst],
                                EVENT_HANDLE, 0).result(timeout=T)
        assert ok is True
        assert not pages_equal(pools, dst, pools, blocks(0, 2))
        srv.wait_locks(0)
        client.end_session("b").result(timeout=T)
        # A 0.5.6 key with the same start: looked up from chunk 0 (a miss).
        old = srv.client()
        k56 = cache_key(MODEL, 1, None, toks, 2 * CHUNK, 4 * CHUNK, "c", num_kv_readers=1)
        assert old.lookup(k56, 1) is None
        assert old.wait_prefetch_status("c", 5.0) == 0
        old.end_session("c")
        client.end_session("w").result(timeout=T)
        assert client.unregister_kv_cache(5900).result(timeout=T) is None
        srv.wait_idle()
    finally:
        client.close()


def test_mixed_releases_in_one_request_are_refused_at_once(cache_server):
    """A token_ids key (0.5.6) in a 3-argument free_lookup_locks (0.5.7) is
    no release's request: refused at once, naming why."""
    srv = cache_server()
    c = srv.client()
    k56 = cache_key(MODEL, 1, None, tokens(1), 0, CHUNK, "m", num_kv_readers=1)
    why = c.failure(c.submit("free_lookup_locks", k56, 1, []))
    assert "only 0.5.7 sends 3 arguments" in why
    both = dict(k56, token_bytes=b"\0\0\0\1")
    why = c.failure(c.submit("lookup", both, 1))
    assert "both 'token_ids' (0.5.6) and 'token_bytes' (0.5.7)" in why
    ragged = {k: v for k, v in k56.items() if k != "token_ids"}
    ragged["token_bytes"] = b"\0\0\1"
    why = c.failure(c.submit("lookup", ragged, 1))
    assert "not a whole number of 4-byte token ids" in why
    assert c.noop() == "OK"


def test_053_get_experimental_id_40_and_failures_echo_the_op(cache_server):
    """LMCache 0.5.3/0.5.4 number get_experimental 40 and decode every echoed
    op as their own enum: a str op (the failure reply) would end their
    client's polling thread. So id 40 is served, and a failure on such a
    connection echoes the request's own op."""
    srv = cache_server()
    c = srv.client()
    import msgspec
    uid = c.next_uid()
    c.send_frames([msgspec.msgpack.encode(uid), b"\x28"])
    r = c._await(uid, T)[0]
    assert r.op_frame == b"\x28" and msgspec.msgpack.decode(r.body) == ["kv_event_stream"]
    srv.wait_log(r"LMCache client 0\.5\.3-0\.5\.5 \(from its get_experimental\)", 0)
    # An undecodable store on the same connection: its own op back, no str op.
    uid = c.next_uid()
    c.send_frames([msgspec.msgpack.encode(uid), b"\x06", b"\xc1"])
    r = c._await(uid, T)[0]
    assert r.op_frame == b"\x06"


def _rss_kib(srv) -> int:
    for line in Path(f"/proc/{srv.sidecar.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_057_hybrid_inputs_under_garbage_floods_and_killed_clients(lmc, cache_server):
    """Everything a hybrid-KV worker sends, hostile: garbage inline data
    (random bytes, truncated and lying envelopes) and garbage group layouts,
    each answered at once; a flood of prepared stores from a second worker
    that is then killed mid-request without committing (its instance released:
    its reservations aborted, its staging slots and sessions gone). The
    process stays up, its memory bounded, and the first worker's chunks are
    still served byte for byte."""
    # The first worker never pings (the registration grace keeps it); the
    # second pings once; its connection ending (the kill) releases it at once.
    srv = cache_server(overrides={"cache.heartbeat_timeout": "500ms",
                                  "cache.registration_grace": "300s"})
    ct = lmc.custom_types
    full, swa = _hybrid_groups(ct)
    full_n, swa_n = HYBRID_BYTES

    def register(client, iid):
        return client.register_kv_cache_engine_driven_context(
            _engine_driven(ct, iid, [full, swa])).result(timeout=T)

    a = lmc.create_request_client(srv.endpoint, context=srv.ctx)
    try:
        reply = register(a, 90)
        staging = Staging(reply.shm_name, reply.pool_size)
        toks = tokens(2, salt=90)
        key = key057(lmc, toks, 0, 2 * CHUNK, "a")
        ctx = a.prepare_store(key, 90, ()).result(timeout=T).context
        want = {}
        for slot, c, g in zip(ctx["slots"], ctx["chunk_indices"], ctx["group_ids"]):
            want[(g, c)] = _chunk_bytes(40 + 10 * g + c, full_n if g == 0 else swa_n)
            staging.write(slot, want[(g, c)])
        assert a.commit_store(key, 90, b"").result(timeout=T) is True
        srv.wait_stats(lambda s: s["stored"] == 4 and s["reserved"] == 0)
        rss0 = _rss_kib(srv)

        # Garbage inline data, 300 times: each refused (False) at once.
        rng = random.Random(90)
        env = _grouped([(0, "bfloat16", (2, 2, CHUNK, 64), [b"\0" * full_n])])
        shapes = [
            lambda: rng.randbytes(rng.randrange(1, 4096)),
            lambda: env[:rng.randrange(1, len(env))],  # truncated
            lambda: msgspec.msgpack.encode({"version": 1, "groups": [
                {"chunk_indices": [rng.randrange(0, 1 << 40)] * 3, "tensors": []}]}),
            lambda: msgspec.msgpack.encode({"version": 1, "groups": [
                {"chunk_indices": [0], "tensors": [{"dtype": "bfloat16", "shape": [1 << 40],
                                                    "data": b"x"}]}] * 65})]
        bad_key = key057(lmc, tokens(1, salt=91), 0, CHUNK, "g")
        t0 = time.monotonic()
        for i in range(300):
            assert a.commit_store(bad_key, 90, shapes[i % len(shapes)]()).result(timeout=T) is False
        assert time.monotonic() - t0 < 60
        # Garbage group layouts: refused at once, naming the group.
        for odd in (ct.GroupLayout(num_layers=-1, hidden_dim_size=64, dtype_str="bfloat16",
                                   tokens_per_block=32),
                    ct.GroupLayout(num_layers=1, hidden_dim_size=64, dtype_str="complex128",
                                   tokens_per_block=32),
                    ct.GroupLayout(num_layers=1, hidden_dim_size=64, dtype_str="bfloat16",
                                   tokens_per_block=32, window_tokens=10 * CHUNK),
                    ct.GroupLayout(num_layers=1, hidden_dim_size=64, dtype_str="bfloat16",
                                   tokens_per_block=32, window_chunks=-3)):
            with pytest.raises(Exception) as refused:
                a.register_kv_cache_engine_driven_context(
                    _engine_driven(ct, 92, [full, odd], num_layers=2)).result(timeout=T)
            assert "group_layouts[1]" in str(refused.value)

        # A second worker floods prepared stores and is killed without a commit.
        b = lmc.create_request_client(srv.endpoint, context=srv.ctx)
        register(b, 91)
        assert b.ping(91).result(timeout=T) is True
        for i in range(40):
            b.prepare_store(key057(lmc, tokens(2, salt=200 + i), 0, 2 * CHUNK, f"b{i}"), 91,
                            ()).result(timeout=T)
        b.prepare_store(key057(lmc, tokens(2, salt=300), 0, 2 * CHUNK, "b-last"), 91, ())
        b.close()  # mid-request: the last prepare's answer is never read
        srv.wait_log(r"instance 91 released: the connection that registered it ended",
                     timeout=15.0)
        srv.wait_stats(lambda s: s["reserved"] == 0, timeout=15.0)
        # Left: the first worker's own two ("a", "g"); the 41 of the killed one ended.
        srv.wait_stats(lambda s: s["sessions"] == 2 and s["ended"] >= 41, actor="session_router",
                       timeout=15.0)
        assert srv.sidecar.running()

        # The first worker's chunks, byte for byte; it kept pinging meanwhile.
        assert a.lookup(key057(lmc, toks, 0, 2 * CHUNK, "r", worker=None, readers=1),
                        1).result(timeout=T) is None
        assert a.wait_prefetch_status("r", 10.0).result(timeout=T) == 2
        got = a.prepare_retrieve(key057(lmc, toks, 0, 2 * CHUNK, "r"), 90).result(timeout=T)
        assert got.success is True
        ctx = got.context
        assert {(g, c): staging.read(slot) for slot, g, c in
                zip(ctx["slots"], ctx["group_ids"], ctx["chunk_indices"])} == \
            {k: v for k, v in want.items() if k[0] == 0 or k[1] == 1}
        assert a.commit_retrieve(key057(lmc, toks, 0, 2 * CHUNK, "r"), 90).result(timeout=T)
        assert _rss_kib(srv) - rss0 < 64 * 1024, (rss0, _rss_kib(srv))
        for rid in ("a", "g", "r"):
            a.end_session(rid).result(timeout=T)
        staging.close()
    finally:
        a.close()
