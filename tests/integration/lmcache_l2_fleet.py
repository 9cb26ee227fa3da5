"""LMCache's own client, run in the engine venv by lmcache_l2_driver.py, as
one process serving a test's steps against any server (LMCache's or
kvsidecar): test_cache_l2_lmcache_server.py, test_cache_l2_quota_lmcache.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINE_VENV = Path(os.environ.get("KVS_ENGINE_VENV", ROOT / "build-venv-engine"))
PYTHON = ENGINE_VENV / "bin" / "python"
DRIVER = Path(__file__).resolve().parent / "lmcache_l2_driver.py"
LMC057 = Path(os.environ.get("KVS_LMCACHE057_DIR", ENGINE_VENV / "lmcache-0.5.7"))


def release_env(release: str) -> dict[str, str]:
    env = dict(os.environ, LMCACHE_TRACK_USAGE="false", DO_NOT_TRACK="1")
    env.pop("PYTHONPATH", None)
    if release == "0.5.7":
        if not (LMC057 / "lmcache" / "__init__.py").is_file():
            pytest.skip("LMCache 0.5.7rc2 not unpacked into build-venv-engine/lmcache-0.5.7 "
                        "(scripts/install-deps.sh --with-python does it)")
        env["PYTHONPATH"] = str(LMC057)
    return env


class Fleet:
    """Runs steps with LMCache's client (lmcache_l2_driver.py, one process
    for the test) against either server."""

    def __init__(self, env: dict):
        self.instance = 100
        self.proc = subprocess.Popen([str(PYTHON), str(DRIVER)], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        assert json.loads(self._line()) == {"ready": True}

    def _line(self) -> str:
        while True:
            line = self.proc.stdout.readline()
            assert line, f"the driver exited ({self.proc.poll()})"
            if line.startswith("{"):
                return line

    def step(self, step: str, url: str, **kw) -> dict:
        self.instance += 1
        self.proc.stdin.write(json.dumps({"step": step, "url": url, "instance": self.instance,
                                          **kw}) + "\n")
        self.proc.stdin.flush()
        out = json.loads(self._line())
        assert "error" not in out, f"{step} on {url}: {out['error']}"
        return out

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
