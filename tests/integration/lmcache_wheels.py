"""LMCache's own client classes, imported from a release's wheel.

Each LMCache release is loaded in its own pytest process (ctest runs every
test file alone): unpack the wheel, put it first on sys.path, stand in for
torch while its modules import (the client classes need none of torch's
code, only its names), and bypass the packages whose __init__ needs a device
(CUDA, NPU). Used by test_cache_lmcache_client.py / test_cache_lmcache_057.py
(ZeroMQ) and test_cache_grpc.py / test_cache_grpc_057.py (gRPC).
"""

from __future__ import annotations

import atexit
import importlib
import shutil
import sys
import tempfile
import types
import zipfile
from contextlib import contextmanager
from pathlib import Path

import pytest

# Packages whose __init__ imports device code; their submodules import fine.
BYPASSED_PACKAGES = ["lmcache.v1.distributed", "lmcache.v1.distributed.transfer_channel",
                     "lmcache.v1.gpu_connector", "lmcache.v1.gpu_connector.kv_format"]


def unpack(wheel: Path, prefix: str) -> Path:
    """The wheel extracted into a temporary folder (removed at exit)."""
    out = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, out, True)
    with zipfile.ZipFile(wheel) as z:
        z.extractall(out)
    return out


@contextmanager
def wheel_imports(src: Path, torch: types.ModuleType, what: str):
    """Imports inside the block come from `src` with `torch` standing in;
    torch is restored afterwards. Skips the test when another lmcache is
    already imported in this process, or when an import fails (naming it)."""
    loaded = sys.modules.get("lmcache")
    if loaded is not None and not str(Path(loaded.__file__).resolve()).startswith(
            str(src.resolve())):
        pytest.skip(f"another lmcache is imported ({loaded.__file__}), not {src}")
    had_torch = sys.modules.get("torch")
    sys.modules["torch"] = torch
    sys.path.insert(0, str(src))
    try:
        for pkg in BYPASSED_PACKAGES:
            if pkg not in sys.modules:
                m = types.ModuleType(pkg)
                m.__path__ = [str(src.joinpath(*pkg.split(".")))]
                sys.modules[pkg] = m
        yield
    except ImportError as e:
        pytest.skip(f"{what} does not import here: {e}")
    finally:
        if had_torch is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = had_torch


def client_namespace(transport: str) -> types.SimpleNamespace:
    """What every test uses of a release (call inside wheel_imports):
    `create_request_client` of `transport` ("zmq" or "grpc"), the key and
    custom types, host shared-memory wrappers, EngineType."""
    ns = types.SimpleNamespace()
    base = "lmcache.v1.multiprocess.transport." + ("zmq_impl" if transport == "zmq" else "grpc_impl")
    impl = importlib.import_module(base)
    # create_request_client imports these lazily: import them while torch
    # stands in (gRPC: proto_codec imports torch, and the codec registry is
    # built from the type hints).
    if transport == "zmq":
        importlib.import_module(base + ".mq")
        importlib.import_module(base + ".client")
    else:
        importlib.import_module(base + ".client")
        importlib.import_module(base + ".method_registry").get_method_codec_registry()
        ns.factory = importlib.import_module(
            "lmcache.v1.multiprocess.transport.factory").RequestClientFactory
    ns.create_request_client = impl.create_request_client
    ct = importlib.import_module("lmcache.v1.multiprocess.custom_types")
    ns.custom_types = ct
    ns.IPCCacheServerKey = ct.IPCCacheServerKey
    ns.KVEventBatch = getattr(ct, "KVEventBatch", None)
    wire = importlib.import_module("lmcache.v1.platform.base.ipc_wire")
    ns.CpuShmIPCData, ns.TensorMetadata = wire.CpuShmIPCData, wire.TensorMetadata
    ns.CpuShmTensorWrapper = importlib.import_module(
        "lmcache.v1.platform.devices.cpu.shm").CpuShmTensorWrapper
    ns.utils = importlib.import_module("lmcache.utils")
    ns.EngineType = ns.utils.EngineType
    return ns
