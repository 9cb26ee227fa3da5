"""Fixtures for the kvsidecar integration tests (see kvsidecar_harness.py).

Run:  KVSIDECAR_BIN=build/kvsidecar python3 -m pytest -q tests/integration
"""

import sys
from pathlib import Path

import pytest
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kvsidecar_harness import EventsRig, Sidecar, binary_path  # noqa: E402


def pytest_configure(config):
    if not binary_path().exists():
        pytest.exit(f"kvsidecar binary not found at {binary_path()}: build it or set KVSIDECAR_BIN",
                    returncode=4)


@pytest.fixture
def zctx():
    """A fresh ZeroMQ context per test; sockets are closed with linger 0."""
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def sidecar(tmp_path):
    """Factory: sidecar(overrides, config_text=None, extra_args=()) -> a
    not-yet-started Sidecar. Any still running at teardown is stopped with
    SIGTERM and must exit 0 within 5 s."""
    made: list[Sidecar] = []

    def make(overrides=None, config_text=None, extra_args=(), name=None):
        sc = Sidecar(tmp_path, overrides, config_text, extra_args,
                     name=name or f"kvsidecar{len(made)}")
        made.append(sc)
        return sc

    yield make
    errors = []
    for sc in made:
        try:
            if sc.running():
                sc.stop()
        except AssertionError as e:
            errors.append(str(e))
        finally:
            sc.kill()
    assert not errors, "\n".join(errors)


@pytest.fixture
def rig(zctx, tmp_path):
    """Factory: rig(fmt="vllm", dp_size=1, ...) -> a started EventsRig
    (engine, sidecar, subscriber, ranks synced). Torn down with SIGTERM, exit 0."""
    made: list[EventsRig] = []

    def make(start=True, sync=True, **kw):
        r = EventsRig(zctx, tmp_path / f"rig{len(made)}", **kw)
        made.append(r)
        if start:
            r.start(sync=sync)
        return r

    yield make
    errors = []
    for r in made:
        try:
            r.close()
        except AssertionError as e:
            errors.append(str(e))
    assert not errors, "\n".join(errors)
