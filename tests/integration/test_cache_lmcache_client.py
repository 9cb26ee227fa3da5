"""kvsidecar driven by LMCache 0.5.6's own client classes.

The client is ``ZmqMultiprocessClient`` over ``MessageQueueClient``
(lmcache/v1/multiprocess/transport/zmq_impl/{client,mq}.py), made by
``create_request_client`` exactly as the 0.5.6 adapters make it. Two things
are checked:

1. the frames LMCache's client puts on the wire equal, byte for byte, the
   frames of tests/integration/lmcache_client.py (which every other cache
   test uses), captured by a plain ROUTER;
2. LMCache's client, unmodified, registers host shared-memory KV pools
   (0.5.6's own ``CpuShmTensorWrapper`` descriptor), stores, looks up, waits,
   retrieves (bytes checked page for page) and ends its session against
   kvsidecar;
3. ``subscribe_kv_events`` (advertised as ``kv_event_stream``): LMCache's
   client decodes every batch into its own ``KVEventBatch``, and the vLLM
   adapter's own receiver methods (compiled from
   ``integration/vllm/vllm_multi_process_adapter.py``, whose module needs
   vLLM) turn them into the CacheStoreEvent / CacheRemoveEvent vLLM drains.

LMCache 0.5.6 imports without a GPU stack only partly, so this module:
- needs the unpacked wheel: ``LMCACHE_SRC`` = a folder holding ``lmcache/``,
  or ``LMCACHE_WHEEL`` = the ``.whl`` (``pip download --no-deps
  lmcache==0.5.6``), unpacked into a temporary folder;
- needs ``cachetools`` (``lmcache.utils`` imports it at module level;
  ``pip install cachetools``) besides msgspec and pyzmq;
- replaces ``torch`` with a stand-in module for the import only (dtypes with
  their item sizes; any other attribute is an inert class): the client code
  paths used here never call torch, and 0.5.6's ``ipc_wire`` builds its
  dtype table from ``torch.dtype`` instances. The stand-in is removed from
  ``sys.modules`` again right after the import;
- bypasses the ``__init__`` of four LMCache packages that pull in device
  kernels and memory management (``lmcache.v1.distributed``,
  ``...distributed.transfer_channel``, ``lmcache.v1.gpu_connector``,
  ``...gpu_connector.kv_format``); only their plain submodules are imported.
Without the wheel or cachetools every test here is skipped with that reason.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import threading
import time
import types
from pathlib import Path

import pytest
import zmq

pytest.register_assert_rewrite("conftest_cache", "lmcache_client")

from conftest_cache import CHUNK, pages_equal, tokens
from lmcache_client import EVENT_HANDLE, MPClient, cache_key, pool_wrappers
from lmcache_wheels import BYPASSED_PACKAGES, client_namespace, unpack, wheel_imports  # noqa: F401

pytest_plugins = ["conftest_cache"]  # the cache_server and kv_pools fixtures

MODEL = "test-org/test-model"
PAGE = 16
DTYPE_SIZES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "uint8": 1,
               "int8": 1, "int32": 4, "int64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1}


def _lmcache_src() -> tuple[Path | None, str]:
    src = os.environ.get("LMCACHE_SRC")
    if src:
        p = Path(src)
        return (p, "") if (p / "lmcache").is_dir() else (None, f"LMCACHE_SRC={src} has no lmcache/")
    wheel = os.environ.get("LMCACHE_WHEEL")
    if wheel:
        if not Path(wheel).is_file():
            return None, f"LMCACHE_WHEEL={wheel} does not exist"
        return unpack(Path(wheel), "lmcache-0.5.6-"), ""
    return None, ("LMCache 0.5.6 not available: set LMCACHE_SRC to an unpacked "
                  "lmcache-0.5.6 wheel or LMCACHE_WHEEL to the wheel "
                  "(pip download --no-deps lmcache==0.5.6)")


class _InertModule(types.ModuleType):
    """`torch` for the import: any attribute is an empty class."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        v = type(name, (), {})
        setattr(self, name, v)
        return v


def _torch_stand_in() -> types.ModuleType:
    torch = _InertModule("torch")
    torch.__path__ = []

    class dtype:  # noqa: N801 - mirrors torch.dtype
        def __init__(self, name: str, itemsize: int):
            self.name, self.itemsize = name, itemsize

        def __repr__(self) -> str:
            return "torch." + self.name

        __str__ = __repr__

    torch.dtype = dtype
    for name, size in DTYPE_SIZES.items():
        setattr(torch, name, dtype(name, size))
    return torch


def _load_lmcache() -> types.SimpleNamespace:
    src, why = _lmcache_src()
    if src is None:
        pytest.skip(why)
    if importlib.util.find_spec("cachetools") is None:
        pytest.skip("lmcache.utils (0.5.6) imports cachetools: pip install cachetools")
    with wheel_imports(src, _torch_stand_in(), "LMCache 0.5.6's client"):
        ns = client_namespace("zmq")
        ns.CacheStoreEvent, ns.CacheRemoveEvent = ns.utils.CacheStoreEvent, ns.utils.CacheRemoveEvent
        ns.src = src
        ns.legacy_ids = importlib.import_module(
            "lmcache.v1.multiprocess.transport.zmq_impl.wire").LEGACY_OPERATION_IDS
        return ns


@pytest.fixture(scope="module")
def lmc():
    return _load_lmcache()


def lmcache_wrappers(lmc, pools) -> list:
    """0.5.6's CpuShmTensorWrapper for each pool tensor, restored from its
    descriptor (no torch tensor needed)."""
    out = []
    for d in pools.descriptors():
        data = lmc.CpuShmIPCData(version=1, metadata=lmc.TensorMetadata(**d["metadata"]),
                                 shm_name=d["shm_name"], nbytes=d["nbytes"])
        out.append(lmc.CpuShmTensorWrapper.from_wire(data))
    return out


def blocks(first: int, n_chunks: int) -> list[int]:
    return list(range(first, first + n_chunks * CHUNK // PAGE))


class Capture(threading.Thread):
    """A ROUTER that records what arrives and answers nothing."""

    def __init__(self, ctx: zmq.Context):
        super().__init__(daemon=True)
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.frames: list[list[bytes]] = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            if self.sock.poll(20):
                self.frames.append(self.sock.recv_multipart()[1:])  # identity dropped

    def wait_for(self, n: int, timeout: float = 5.0) -> list[list[bytes]]:
        deadline = time.monotonic() + timeout
        while len(self.frames) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.frames) >= n, f"captured {len(self.frames)} of {n} requests"
        return self.frames[:n]

    def close(self):
        self.stop.set()
        self.join(5)
        self.sock.close(linger=0)


def test_legacy_op_ids_match(lmc):
    from lmcache_client import OP_IDS
    for name, op_id in OP_IDS.items():
        if name == "query_prefetch_lookup_hits":
            # Retired in 0.5.6; its id must never be reused.
            assert name not in lmc.legacy_ids and op_id not in lmc.legacy_ids.values()
            continue
        assert lmc.legacy_ids[name] == op_id, name


def test_frames_identical_to_lmcache_client(lmc, kv_pools):
    ctx = zmq.Context()
    cap = Capture(ctx)
    cap.start()
    theirs = lmc.create_request_client(f"tcp://127.0.0.1:{cap.port}", context=ctx)
    ours = MPClient(f"tcp://127.0.0.1:{cap.port}", ctx)
    pools = kv_pools("sglang")
    toks = tuple(tokens(2, salt=40))
    K = lmc.IPCCacheServerKey
    k_w = dict(model_name=MODEL, world_size=2, worker_id=1, token_ids=toks, start=0, end=512,
               request_id="req-1", cache_salt="tenant", num_kv_readers=2,
               request_configs={"lmcache.tag": "x", "n": [1, 2.5]})
    k_s = dict(model_name=MODEL, world_size=2, worker_id=None, token_ids=toks, start=256,
               end=512, request_id="req-1")
    calls = [
        ("get_chunk_size", (), ()),
        ("noop", (), ()),
        ("ping", (None,), (None,)),
        ("ping", (4242,), (4242,)),
        ("get_experimental", (), ()),
        ("register_kv_cache",
         (4242, lmcache_wrappers(lmc, pools), MODEL, 2, lmc.EngineType.SGLANG,
          {"tokens_per_block": PAGE}, []),
         (4242, pool_wrappers(pools, "cpu_shm"), MODEL, 2, "sglang",
          {"tokens_per_block": PAGE}, [])),
        ("store", (K(**k_w), 4242, [blocks(0, 2)], EVENT_HANDLE),
         (cache_key(**k_w), 4242, [blocks(0, 2)], EVENT_HANDLE)),
        ("lookup", (K(**k_s), 2), (cache_key(**k_s), 2)),
        ("query_prefetch_status", ("req-1",), ("req-1",)),
        ("wait_prefetch_status", ("req-1", 300.0), ("req-1", 300.0)),
        ("retrieve", (K(**k_w), 4242, [blocks(64, 2)], EVENT_HANDLE, 32),
         (cache_key(**k_w), 4242, [blocks(64, 2)], EVENT_HANDLE, 32)),
        ("free_lookup_locks", (K(**k_s), 2), (cache_key(**k_s), 2)),
        ("end_session", ("req-1",), ("req-1",)),
        ("clear", (False,), (False,)),
        ("unregister_kv_cache", (4242,), (4242,)),
    ]
    try:
        for op, their_args, _ in calls:
            getattr(theirs, op)(*their_args)
        got_theirs = cap.wait_for(len(calls))
        for op, _, our_args in calls:
            ours.submit(op, *our_args)
        got_ours = cap.wait_for(2 * len(calls))[len(calls):]
        for (op, _, _), t, o in zip(calls, got_theirs, got_ours):
            assert o == t, f"{op}: LMCache sent {t!r}\n             we sent {o!r}"
    finally:
        theirs.close()
        ours.close()
        cap.close()
        ctx.destroy(linger=0)


@pytest.mark.parametrize("layout", ["sglang", "vllm"])
def test_lmcache_client_full_flow(lmc, cache_server, kv_pools, layout):
    srv = cache_server()
    client = lmc.create_request_client(srv.endpoint, context=srv.ctx)
    pools = kv_pools(layout)
    toks = tuple(tokens(4, salt=41))
    K = lmc.IPCCacheServerKey
    T = 5.0
    try:
        assert client.get_chunk_size().result(timeout=T) == CHUNK
        assert client.noop().result(timeout=T) == "OK"
        assert client.ping(None).result(timeout=T) is True
        assert client.get_experimental().result(timeout=T) == ["kv_event_stream"]
        engine = lmc.EngineType.SGLANG if layout == "sglang" else lmc.EngineType.VLLM
        hints = {"tokens_per_block": PAGE} if layout == "sglang" else {"kv_layout": "NHD"}
        assert client.register_kv_cache(4800, lmcache_wrappers(lmc, pools), MODEL, 1, engine,
                                        hints, []).result(timeout=T) is None
        assert client.ping(4800).result(timeout=T) is True
        handle, ok = client.store(K(model_name=MODEL, world_size=1, worker_id=0, token_ids=toks,
                                    start=0, end=4 * CHUNK, request_id="r"),
                                  4800, [blocks(0, 4)], EVENT_HANDLE).result(timeout=T)
        assert ok is True and handle == b""
        # Visible once the copy has completed (the reply comes when it starts).
        srv.wait_stats(lambda s: s["stored"] == 4)
        # 0.5.6's adapters send num_kv_readers >= 1 on a lookup.
        sched_key = K(model_name=MODEL, world_size=1, worker_id=None, token_ids=toks, start=0,
                      end=4 * CHUNK, request_id="r", num_kv_readers=1)
        assert client.lookup(sched_key, 1).result(timeout=T) is None
        assert client.wait_prefetch_status("r", 30.0).result(timeout=T) == 4
        srv.wait_locks(4)
        # Skip the first chunk (tokens, as 0.5.6's vLLM adapter counts; the
        # SGLang adapters count pages), retrieve into other pages.
        skip = CHUNK if layout == "vllm" else CHUNK // PAGE
        dst = blocks(80, 4)
        handle, ok = client.retrieve(K(model_name=MODEL, world_size=1, worker_id=0,
                                       token_ids=toks, start=0, end=4 * CHUNK, request_id="r"),
                                     4800, [dst], EVENT_HANDLE, skip).result(timeout=T)
        # b"": no device work to wait for (the host copy is over), which
        # 0.5.6's client reads as "no event" (futures.py: `if event_bytes:`).
        assert ok is True and handle == b""
        skipped = CHUNK // PAGE
        assert not pages_equal(pools, dst[skipped:], pools, blocks(0, 4)[skipped:])
        assert pages_equal(pools, dst[:skipped], pools, blocks(0, 4)[:skipped]), \
            "skipped pages were written"
        srv.wait_locks(0)
        assert client.free_lookup_locks(sched_key, 1).result(timeout=T) is None
        assert client.end_session("r").result(timeout=T) is None
        assert client.query_prefetch_status("r").result(timeout=T) == 0
        assert client.clear(False).result(timeout=T) is None
        srv.wait_stats(lambda s: s["chunks"] == 0)
        assert client.unregister_kv_cache(4800).result(timeout=T) is None
        srv.wait_idle()
    finally:
        client.close()


def _next(stream, timeout: float = 5.0):
    """next(stream) with a deadline (LMCache's stream read blocks without one)."""
    box: list = []
    t = threading.Thread(target=lambda: box.append(next(stream, None)), daemon=True)
    t.start()
    t.join(timeout)
    assert box, f"no batch within {timeout}s"
    return box[0]


def test_lmcache_client_kv_event_stream(lmc, cache_server, kv_pools):
    """LMCache 0.5.6's own client subscribes (as its vLLM adapter does when
    get_experimental advertises kv_event_stream), decodes every batch into its
    own KVEventBatch / KVEventRecord types, and sees the CPU-tier chunks of its
    model stored and removed, chained by parent hash, with the same hashes the
    relay publishes as BlockStored / BlockRemoved."""
    import vllm_structs as vs
    srv = cache_server(events=True)
    client = lmc.create_request_client(srv.endpoint, context=srv.ctx)
    pools, other_pools = kv_pools("vllm"), kv_pools("vllm", seed=9)
    toks, other = tuple(tokens(4, salt=61)), tuple(tokens(2, salt=62))
    K = lmc.IPCCacheServerKey
    T = 5.0
    try:
        assert "kv_event_stream" in client.get_experimental().result(timeout=T)
        hints = {"kv_layout": "NHD"}
        for inst, p, model in ((4810, pools, MODEL), (4811, other_pools, "org/other")):
            assert client.register_kv_cache(inst, lmcache_wrappers(lmc, p), model, 1,
                                            lmc.EngineType.VLLM, hints, []).result(timeout=T) is None
        stream = client.subscribe_kv_events(4810, MODEL, 0, 64)
        first = _next(stream)
        assert isinstance(first, lmc.KVEventBatch)
        assert first.enabled and not first.lost and first.events == [] and first.next_cursor == 0
        incarnation = first.incarnation
        assert incarnation > 0
        # The other model's store is not this subscriber's business.
        _, ok = client.store(K(model_name="org/other", world_size=1, worker_id=0, token_ids=other,
                               start=0, end=2 * CHUNK, request_id="o"),
                             4811, [blocks(0, 2)], EVENT_HANDLE).result(timeout=T)
        assert ok
        _, ok = client.store(K(model_name=MODEL, world_size=1, worker_id=0, token_ids=toks,
                               start=0, end=4 * CHUNK, request_id="r"),
                             4810, [blocks(0, 4)], EVENT_HANDLE).result(timeout=T)
        assert ok
        got = []
        while len(got) < 4:
            b = _next(stream)
            assert b.incarnation == incarnation and not b.lost
            got += b.events
        assert [r.kind for r in got] == ["stored"] * 4
        assert all(r.medium == "CPU" and r.model_name == MODEL for r in got)
        assert [r.token_ids for r in got] == [list(toks[i * CHUNK:(i + 1) * CHUNK])
                                              for i in range(4)]
        assert got[0].parent_block_hash is None
        for prev, r in zip(got, got[1:]):
            assert r.parent_block_hash == prev.block_hashes[0]
            assert r.seq > prev.seq
        hashes = [r.block_hashes[0] for r in got]
        assert all(len(h) == 8 for h in hashes)
        # The same chunks, as the relay publishes them (int hashes).
        relay = srv.events(6, kind=vs.BlockStored)
        my_chunks = [list(toks[i * CHUNK:(i + 1) * CHUNK]) for i in range(4)]
        mine = [e.block_hashes[0] for e in relay if e.token_ids in my_chunks]
        assert mine == [int.from_bytes(h, "big") for h in hashes]
        # CLEAR evicts them: one "removed" record with all four.
        assert client.end_session("r").result(timeout=T) is None
        assert client.end_session("o").result(timeout=T) is None
        assert client.clear(True).result(timeout=T) is None
        removed = []
        while len(removed) < 4:
            b = _next(stream)
            for r in b.events:
                assert r.kind == "removed" and r.model_name == MODEL
                removed += r.block_hashes
        assert sorted(removed) == sorted(hashes)
        # A reconnecting subscriber resumes at its cursor: nothing new, and
        # from cursor 0 the whole log is replayed (both kinds, this model only).
        stream.close()
        srv.wait_stats(lambda s: s["kv_event_subscribers"] == 0, actor="engine_bridge")
        again = client.subscribe_kv_events(4810, MODEL, 0, 64)
        replay = _next(again)
        assert [r.kind for r in replay.events] == ["stored"] * 4 + ["removed"]
        assert replay.incarnation == incarnation
        again.close()
        # Bad arguments: the call fails at once (LMCache raises and sends nothing).
        bad = client.subscribe_kv_events(4810, MODEL, -1, 64)
        assert _next(bad) is None, "a refused subscription ends the stream"
        assert client.unregister_kv_cache(4810).result(timeout=T) is None
        assert client.unregister_kv_cache(4811).result(timeout=T) is None
        srv.wait_idle()
    finally:
        client.close()


# The vLLM adapter's KV-event receiver, method for method.
ADAPTER_METHODS = ["_receive_kv_events", "_apply_kv_event_batch", "_apply_kv_event_record",
                   "_resync_kv_events", "_buffer_kv_events", "_disable_kv_event_stream"]


class _Metric:
    def __init__(self):
        self.value = 0

    def inc(self, n: int = 1):
        self.value += n

    def set(self, v):
        self.value = v


def _adapter_receiver(lmc, client, instance_id: int, model: str):
    """An object running 0.5.6's own LMCacheMPWorkerAdapter KV-event code
    (integration/vllm/vllm_multi_process_adapter.py), taken from the file by
    name: the module itself imports vLLM and torch, so only these six methods
    are compiled, with the module-level names they use, onto an object that
    carries the attributes the adapter's __init__ would set."""
    import ast
    import logging
    path = lmc.src / "lmcache/integration/vllm/vllm_multi_process_adapter.py"
    tree = ast.parse(path.read_text(), str(path))
    funcs = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in ADAPTER_METHODS:
            funcs[node.name] = node
    assert sorted(funcs) == sorted(ADAPTER_METHODS), sorted(funcs)
    module = ast.Module(body=list(funcs.values()), type_ignores=[])
    import __future__
    code = compile(module, str(path), "exec", flags=__future__.annotations.compiler_flag,
                   dont_inherit=True)
    ct = lmc.custom_types
    ns = {"logger": logging.getLogger("lmcache-adapter"), "_KV_EVENT_BATCH_SIZE": 1024,
          "KV_EVENT_KIND_STORED": ct.KV_EVENT_KIND_STORED,
          "KV_EVENT_KIND_REMOVED": ct.KV_EVENT_KIND_REMOVED,
          "CacheStoreEvent": lmc.CacheStoreEvent, "CacheRemoveEvent": lmc.CacheRemoveEvent}
    exec(code, ns)
    adapter = type("AdapterKVEvents", (), {n: ns[n] for n in ADAPTER_METHODS})()
    adapter.req_client = client
    adapter.instance_id = instance_id
    adapter.model_name = model
    adapter.lmcache_tokens_per_chunk = CHUNK
    adapter._kv_event_stop = threading.Event()
    adapter._kv_event_lock = threading.RLock()  # as its __init__ makes it
    adapter._kv_event_stream = None
    adapter._kv_event_server_source = True
    adapter._kv_event_subscriber = True
    adapter._kv_event_incarnation = None
    adapter._announced_kv_hashes = set()
    adapter._kv_events = []
    adapter._kv_events_generated = _Metric()
    adapter._kv_events_buffered = _Metric()
    adapter._kv_event_batches = _Metric()
    adapter._kv_event_resyncs = {r: _Metric() for r in ("server_restart", "events_lost",
                                                        "stream_closed")}
    return adapter


def test_lmcache_vllm_adapter_gets_cpu_events_in_band(lmc, cache_server, kv_pools):
    """0.5.6's vLLM adapter receiver thread (_receive_kv_events) against
    kvsidecar: the events vLLM drains are the CacheStoreEvent /
    CacheRemoveEvent it would get from LMCache's own server."""
    srv = cache_server()
    client = lmc.create_request_client(srv.endpoint, context=srv.ctx)
    pools = kv_pools("vllm")
    toks = tuple(tokens(3, salt=71))
    K = lmc.IPCCacheServerKey
    T = 5.0
    adapter = _adapter_receiver(lmc, client, 4820, MODEL)
    receiver = threading.Thread(target=adapter._receive_kv_events, daemon=True)
    try:
        assert client.register_kv_cache(4820, lmcache_wrappers(lmc, pools), MODEL, 1,
                                        lmc.EngineType.VLLM, {"kv_layout": "NHD"},
                                        []).result(timeout=T) is None
        receiver.start()
        srv.wait_stats(lambda s: s["kv_event_subscribers"] == 1, actor="engine_bridge")
        _, ok = client.store(K(model_name=MODEL, world_size=1, worker_id=0, token_ids=toks,
                               start=0, end=3 * CHUNK, request_id="r"),
                             4820, [blocks(0, 3)], EVENT_HANDLE).result(timeout=T)
        assert ok
        deadline = time.monotonic() + T
        while len(adapter._kv_events) < 3:
            assert time.monotonic() < deadline, adapter._kv_events
            time.sleep(0.01)
        stored = list(adapter._kv_events)
        assert all(isinstance(e, lmc.CacheStoreEvent) for e in stored)
        assert [e.token_ids for e in stored] == [list(toks[i * CHUNK:(i + 1) * CHUNK])
                                                 for i in range(3)]
        assert all(e.medium == "CPU" and e.block_size == CHUNK for e in stored)
        assert stored[0].parent_block_hash is None
        assert [e.parent_block_hash for e in stored[1:]] == [e.block_hashes[0] for e in stored[:2]]
        assert adapter._kv_event_resyncs["events_lost"].value == 0
        assert client.end_session("r").result(timeout=T) is None
        assert client.clear(True).result(timeout=T) is None
        while len(adapter._kv_events) < 4:
            assert time.monotonic() < deadline + T, adapter._kv_events
            time.sleep(0.01)
        gone = adapter._kv_events[3]
        assert isinstance(gone, lmc.CacheRemoveEvent) and gone.medium == "CPU"
        assert sorted(gone.block_hashes) == sorted(e.block_hashes[0] for e in stored)
        assert adapter._announced_kv_hashes == set()
    finally:
        # As the adapter's shutdown() does.
        adapter._kv_event_stop.set()
        with adapter._kv_event_lock:
            if adapter._kv_event_stream is not None:
                adapter._kv_event_stream.close()
        receiver.join(T)
        assert not receiver.is_alive()
        client.close()
