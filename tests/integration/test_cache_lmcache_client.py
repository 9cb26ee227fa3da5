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
   kvsidecar.

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

import atexit
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import time
import types
import zipfile
from pathlib import Path

import pytest
import zmq

pytest.register_assert_rewrite("conftest_cache", "lmcache_client")

from conftest_cache import CHUNK, pages_equal, tokens
from lmcache_client import EVENT_HANDLE, MPClient, cache_key, pool_wrappers

pytest_plugins = ["conftest_cache"]  # the cache_server and kv_pools fixtures

MODEL = "test-org/test-model"
PAGE = 16
DTYPE_SIZES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "uint8": 1,
               "int8": 1, "int32": 4, "int64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1}
BYPASSED_PACKAGES = ["lmcache.v1.distributed", "lmcache.v1.distributed.transfer_channel",
                     "lmcache.v1.gpu_connector", "lmcache.v1.gpu_connector.kv_format"]


def _lmcache_src() -> tuple[Path | None, str]:
    src = os.environ.get("LMCACHE_SRC")
    if src:
        p = Path(src)
        return (p, "") if (p / "lmcache").is_dir() else (None, f"LMCACHE_SRC={src} has no lmcache/")
    wheel = os.environ.get("LMCACHE_WHEEL")
    if wheel:
        if not Path(wheel).is_file():
            return None, f"LMCACHE_WHEEL={wheel} does not exist"
        out = Path(tempfile.mkdtemp(prefix="lmcache-0.5.6-"))
        atexit.register(shutil.rmtree, out, True)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(out)
        return out, ""
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
    had_torch = sys.modules.get("torch")
    sys.modules["torch"] = _torch_stand_in()
    sys.path.insert(0, str(src))
    try:
        import lmcache
        if not str(Path(lmcache.__file__).resolve()).startswith(str(src.resolve())):
            pytest.skip(f"another lmcache is imported ({lmcache.__file__}), not {src}")
        for pkg in BYPASSED_PACKAGES:
            if pkg not in sys.modules:
                m = types.ModuleType(pkg)
                m.__path__ = [str(src.joinpath(*pkg.split(".")))]
                sys.modules[pkg] = m
        ns = types.SimpleNamespace()
        zmq_impl = importlib.import_module("lmcache.v1.multiprocess.transport.zmq_impl")
        # create_request_client imports these lazily: import them while torch stands in.
        importlib.import_module("lmcache.v1.multiprocess.transport.zmq_impl.mq")
        importlib.import_module("lmcache.v1.multiprocess.transport.zmq_impl.client")
        ns.create_request_client = zmq_impl.create_request_client
        ns.IPCCacheServerKey = importlib.import_module(
            "lmcache.v1.multiprocess.custom_types").IPCCacheServerKey
        wire = importlib.import_module("lmcache.v1.platform.base.ipc_wire")
        ns.CpuShmIPCData, ns.TensorMetadata = wire.CpuShmIPCData, wire.TensorMetadata
        ns.CpuShmTensorWrapper = importlib.import_module(
            "lmcache.v1.platform.devices.cpu.shm").CpuShmTensorWrapper
        ns.EngineType = importlib.import_module("lmcache.utils").EngineType
        ns.legacy_ids = importlib.import_module(
            "lmcache.v1.multiprocess.transport.zmq_impl.wire").LEGACY_OPERATION_IDS
        return ns
    except ImportError as e:
        pytest.skip(f"LMCache 0.5.6's client does not import here: {e}")
    finally:
        if had_torch is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = had_torch


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
        assert client.get_experimental().result(timeout=T) == []
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
        assert ok is True
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
