"""Fixtures for the kvsidecar integration tests (see kvsidecar_harness.py).

Run:  KVSIDECAR_BIN=build/kvsidecar python3 -m pytest -q tests/integration
"""

import faulthandler
import os
import sys
from pathlib import Path

import _pytest.faulthandler
import pytest
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kvsidecar_harness import EventsRig, Sidecar, binary_path  # noqa: E402


def pytest_configure(config):
    if not binary_path().exists():
        pytest.exit(f"kvsidecar binary not found at {binary_path()}: build it or set KVSIDECAR_BIN",
                    returncode=4)


# A hang watchdog per test (setup, call and teardown): past its deadline every
# thread's stack is written to stderr (unbuffered, so it survives) and the
# process exits, so CI shows where a test hung instead of ctest's bare
# "Timeout" with pytest's buffered output lost. Every wait in the suite has
# its own, shorter deadline; this one only catches a wait that has none.
# KVS_TEST_HANG_S sets it (default 150 s; 0 turns it off); a module that
# legitimately runs longer per test sets HANG_S (the engine test does).
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    limit = float(getattr(item.module, "HANG_S", 0) or os.environ.get("KVS_TEST_HANG_S", "150"))
    if limit > 0:
        # pytest's own duplicate of the real stderr (its faulthandler plugin
        # takes it before output capture): fd 2 itself is captured, and a
        # dump written there dies with the process.
        fd = item.config.stash.get(_pytest.faulthandler.fault_handler_stderr_fd_key, None)
        faulthandler.dump_traceback_later(limit, exit=True,
                                          file=fd if fd is not None else sys.__stderr__)
    try:
        yield
    finally:
        if limit > 0:
            faulthandler.cancel_dump_traceback_later()


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
