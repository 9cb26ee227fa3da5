"""The real engines' KV-event publishers, from their released wheels.

The wheels are fetched once with `pip download --no-deps` into
build-wheels/ (ignored by git) and only the publisher's module file is
loaded, standalone: the few imports it has on the rest of the engine
(config, logger, network helpers) get minimal stand-ins here. A test that
needs a wheel skips, saying why, when it cannot be fetched (no network).
"""

import importlib.util
import logging
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
WHEELS = REPO_ROOT / "build-wheels"

VLLM = "vllm==0.33.0"
SGLANG = "sglang==0.5.23"


def wheel(spec: str) -> Path:
    """The wheel for `spec` (name==version) in build-wheels/, downloaded once."""
    name, version = spec.split("==")
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    found = sorted(WHEELS.glob(pattern))
    if not found:
        WHEELS.mkdir(exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                            "-d", str(WHEELS), spec], capture_output=True, text=True,
                           timeout=600)
        found = sorted(WHEELS.glob(pattern))
        if r.returncode != 0 or not found:
            pytest.skip(f"cannot fetch {spec} from PyPI: {r.stderr.strip()[-300:]}")
    return found[-1]


def _module_source(spec: str, path: str) -> str:
    with zipfile.ZipFile(wheel(spec)) as z:
        return z.read(path).decode("utf-8")


def _stub(name: str, **attrs: Any) -> types.ModuleType:
    m = sys.modules.get(name) or types.ModuleType(name)
    for k, v in attrs.items():
        setattr(m, k, v)
    sys.modules[name] = m
    return m


def _load(name: str, source: str) -> types.ModuleType:
    if name in sys.modules and hasattr(sys.modules[name], "ZmqEventPublisher"):
        return sys.modules[name]
    spec = importlib.util.spec_from_loader(name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    exec(compile(source, f"<{name} from its wheel>", "exec"), mod.__dict__)
    return mod


class _Config(types.SimpleNamespace):
    def __init__(self, **kw: Any):
        super().__init__(**kw)


def vllm_kv_events() -> types.ModuleType:
    """vllm/distributed/kv_events.py of vLLM 0.33.0: its msgspec structs
    (BlockStored with lookahead_token_ids, ...) and its ZmqEventPublisher."""
    src = _module_source(VLLM, "vllm/distributed/kv_events.py")
    for pkg in ("vllm", "vllm.config", "vllm.utils", "vllm.v1", "vllm.v1.core",
                "vllm.distributed"):
        _stub(pkg)
    _stub("vllm.config.kv_events", KVEventsConfig=_Config)
    _stub("vllm.logger", init_logger=logging.getLogger)
    _stub("vllm.utils.network_utils", get_ip=lambda: "127.0.0.1",
          get_tcp_uri=lambda ip, port: f"tcp://{ip}:{port}",
          is_valid_ipv6_address=lambda ip: ":" in ip,
          split_zmq_path=lambda p: tuple(p.replace("//", "").split(":")))
    _stub("vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int)
    return _load("vllm.distributed.kv_events", src)


class _Address:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port

    @classmethod
    def parse(cls, s: str) -> "_Address":
        host, _, port = s.rpartition(":")
        return cls(host.strip("[]"), int(port))

    def to_tcp(self) -> str:
        return f"tcp://{self.host}:{self.port}"


def sglang_kv_events() -> types.ModuleType:
    """sglang/srt/disaggregation/kv_events.py of SGLang 0.5.23: its structs
    (BlockStored with cache_salt, ...) and its ZmqEventPublisher."""
    src = _module_source(SGLANG, "sglang/srt/disaggregation/kv_events.py")
    for pkg in ("sglang", "sglang.srt", "sglang.srt.utils", "sglang.srt.disaggregation"):
        _stub(pkg)
    _stub("sglang.srt.runtime_context", get_parallel=lambda: types.SimpleNamespace(
        pp_rank=0, attn_tp_rank=0, attn_cp_rank=0))
    _stub("sglang.srt.utils.network", NetworkAddress=_Address)
    return _load("sglang.srt.disaggregation.kv_events", src)
