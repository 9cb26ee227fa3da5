"""LMCache 0.5.6's fleet coordinator (``lmcache coordinator`` from the engine
venv) as a test process: started on a port, answering /instances, stopped
and started again (it forgets everything: its state is in memory). The
`coordinator` fixture (pytest_plugins = ["lmcache_coordinator"]) starts
them with a test's options, skips without the engine venv, and stops them
after the test."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from kvsidecar_harness import free_port_range, wait_until
from lmcache_cli import VENV, release_env


class Coordinator:
    def __init__(self, tmp_path, port: int, args: tuple[str, ...] = ()):
        self.port, self.url = port, f"http://127.0.0.1:{port}"
        self.args = list(args)
        self.log = tmp_path / f"coordinator-{port}.log"
        self.proc = None

    def start(self) -> "Coordinator":
        env = dict(os.environ, LMCACHE_DISABLE_BANNER="1", PYTHONUNBUFFERED="1")
        env.pop("PYTHONPATH", None)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(VENV / "bin" / "lmcache"), "coordinator", "--host", "127.0.0.1",
                 "--port", str(self.port), *self.args], stdout=out, stderr=subprocess.STDOUT, env=env)
        wait_until(lambda: self.instances() is not None, 60, "the coordinator answering")
        return self

    def instances(self):
        import urllib.request
        try:
            with urllib.request.urlopen(self.url + "/instances", timeout=2) as r:
                return json.loads(r.read())["instances"]
        except OSError:
            if self.proc.poll() is not None:
                raise AssertionError(f"coordinator exited:\n{self.log.read_text()[-3000:]}")
            return None

    def registered(self, http_port: int, timeout: float = 10) -> str:
        """Waits until an instance at `http_port` is registered; its id."""
        def mine():
            ids = [i["instance_id"] for i in self.instances() or [] if i["http_port"] == http_port]
            return ids[0] if ids else None
        return wait_until(mine, timeout, f"the server at HTTP port {http_port} registered",
                          interval=0.05)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()



@pytest.fixture
def coordinator(tmp_path):
    """Factory: coordinator(*options) -> a started Coordinator on a free port."""
    made: list[Coordinator] = []

    def start(*args: str) -> Coordinator:
        env, why = release_env("0.5.6")
        if env is None:
            pytest.skip(why)
        made.append(Coordinator(tmp_path, free_port_range(1), args).start())
        return made[-1]
    yield start
    for c in made:
        c.stop()
