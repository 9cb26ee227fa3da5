"""An engine that crashes and restarts gets its cache back at once (issue 43).

An instance id belongs to the connection that registered it; when that
connection ends (the engine was SIGKILLed) the sidecar frees the instance,
the sessions only it used, their read locks and its staging slots at once,
so the restarted engine registers the same id immediately (LMCache's SGLang
adapter uses instance_id = os.getpid(), which a restarted container often
gets again). A live owner keeps its id: another connection is still
refused.

Both engines are LMCache's own client classes, 0.5.6 and 0.5.7rc2, over
ZeroMQ and over gRPC, each in a process of its own
(crash_lmcache_client.py): the old one registers, stores, holds lookup locks
and staging slots; the new one, loaded and connected beforehand, is told to
register the same ids: refused while the old one lives, accepted within a
second of its SIGKILL, and its stores and retrieves work byte for byte.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvsidecar_harness import free_port_range

pytest_plugins = ["conftest_cache"]

HERE = Path(__file__).resolve().parent
CLIENT = HERE / "crash_lmcache_client.py"
SLOTS = 16  # cache.engine_driven_slots' default: staging chunks per instance
GRPC_BOUND = r"grpc_bridge#\d+ bound (\S+) \(cache\.grpc_endpoint\)"


class Engine:
    """One crash_lmcache_client.py process; its stdout read line by line."""

    def __init__(self, release: str, transport: str, url: str, instance: int, mode: str):
        self.p = subprocess.Popen(
            [sys.executable, str(CLIENT), release, transport, url, str(instance), mode],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=HERE)
        self.shm: list[str] = []

    def line(self, timeout: float = 120.0) -> str:
        """The next line it prints; fails (with its stderr) when it exits or
        says nothing within `timeout`; skips the test on ``skip:``."""
        ready, _, _ = select.select([self.p.stdout], [], [], timeout)
        out = self.p.stdout.readline() if ready else ""
        if out.startswith("skip: "):
            self.kill()
            pytest.skip(out[6:].strip())
        if not out:
            self.kill()
            raise AssertionError(f"client said nothing within {timeout} s (rc {self.p.poll()}):\n"
                                 + self.p.stderr.read()[-3000:])
        return out.strip()

    def tell(self) -> None:
        self.p.stdin.write("go\n")
        self.p.stdin.flush()

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
        self.p.wait(timeout=10)

    def unlink_shm(self) -> None:
        prefix = f"kvs_crash_{self.p.pid}_"
        for name in os.listdir("/dev/shm"):
            if name.startswith(prefix):
                os.unlink("/dev/shm/" + name)


def server(cache_server, transport: str, in_place: bool = True):
    mode = {"cache.engine_driven_in_place": in_place}
    if transport == "zmq":
        srv = cache_server(overrides=mode)
        return srv, srv.endpoint
    url = f"grpc://127.0.0.1:{free_port_range(1)}"
    srv = cache_server(overrides={**mode, "cache.grpc_endpoint": url})
    srv.wait_log(GRPC_BOUND)
    return srv, url


@pytest.mark.parametrize("in_place", [True, False], ids=["in_place", "staged"])
@pytest.mark.parametrize("transport", ["zmq", "grpc"])
@pytest.mark.parametrize("release", ["0.5.6", "0.5.7"])
def test_killed_engine_id_registers_again_at_once(cache_server, release, transport, in_place):
    srv, url = server(cache_server, transport, in_place)
    inst = 4300 + (10 if release == "0.5.7" else 0) + (100 if transport == "grpc" else 0)
    old = Engine(release, transport, url, inst, "hold")
    new = Engine(release, transport, url, inst, "restart")
    try:
        assert old.line().startswith("ready ")
        assert new.line() == "standby"
        # The old engine holds its lookup's read locks and 3 chunks it never
        # committed: L1 slots of its arena reserved (in place), or 3 staging
        # slots taken (staged; the L1 slots are reserved at commit).
        held = srv.wait_stats(lambda s: s["locks"] >= 1 and s["sessions"] >= 1, timeout=15)
        if in_place:
            srv.wait_stats(lambda s: s["reserved"] == 3, timeout=15)
        else:
            srv.wait_stats(lambda s: s["staging_free"] == SLOTS - 3, actor="gpu_transfer",
                           timeout=15)
        # A live owner keeps its id: another connection is refused, naming why.
        new.tell()
        refused = new.line()
        assert refused.startswith("refused ") and f"instance {inst} belongs to another " \
            "connection" in refused, refused
        srv.wait_log(rf"op register_kv_cache: foreign_instance: instance {inst} was "
                     r"registered by connection \w+")
        mark = srv.mark()
        old.kill()
        killed = time.monotonic()
        # The restarted engine registers the same id at once.
        new.tell()
        while (got := new.line(10)).startswith("refused "):
            assert time.monotonic() - killed < 1.0, f"still refused 1 s after the kill: {got}"
            new.tell()
        assert got.startswith("registered "), got
        took = time.monotonic() - killed
        assert took < 1.0, f"registered {took:.3f} s after the kill"
        print(f"\n[{release} {transport}] re-registered {took * 1000:.0f} ms after SIGKILL")
        srv.wait_log(rf"connection \w+ ended \([^)]+\): released instance\(s\) {inst}, {inst + 1}",
                     mark)
        srv.wait_log(rf"instance {inst} released: the connection that registered it ended", mark)
        assert new.line() == "ok"
        # Nothing of the dead engine is left: no lock, no session, and the
        # one pool of instance inst + 1 is the new engine's, every slot free.
        srv.wait_idle()
        srv.wait_stats(lambda s: s["staging_free"] == SLOTS and s["staged_instances"] == 1,
                       actor="gpu_transfer")
        reg = srv.wait_stats(lambda s: s["released"] == 2 and s["instances"] == 2,
                             actor="registry")
        assert reg["reaped"] == 0, reg
        assert held["locks"] >= 1
    finally:
        for e in (old, new):
            e.kill()
            e.unlink_shm()
