"""Runs LMCache's own `lmcache` CLI (lmcache/cli, of the 0.5.6 or 0.5.7rc2
wheel) as an operator would, against any HTTP endpoint.

Each CLI start imports torch (~5 s here), so one subprocess per release
runs a whole list of commands in turn: this file is also that subprocess's
script (``python lmcache_cli.py <json argv list>``), calling
``lmcache.cli.main.main`` once per command with stdout and stderr
redirected at the file-descriptor level (LMCache's logger writes to the
stderr it found at import), and printing one JSON line of
``[{"rc", "out", "err"}, ...]``.

Releases: 0.5.6 is the engine venv's installed lmcache
(build-venv-engine, scripts/install-deps.sh --with-python); 0.5.7rc2 is its
wheel in build-wheels, unpacked and put first on PYTHONPATH with the same
venv's python (its CLI needs nothing 0.5.6's environment lacks).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("KVS_ENGINE_VENV", REPO_ROOT / "build-venv-engine"))
WHEELS = Path(os.environ.get("KVS_WHEELS", REPO_ROOT / "build-wheels"))


def release_env(release: str) -> tuple[dict[str, str] | None, str]:
    """(environment for the CLI's python, "") or (None, why it is missing)."""
    py = VENV / "bin" / "python"
    if not py.exists():
        return None, f"no engine venv at {VENV} (scripts/install-deps.sh --with-python)"
    env = dict(os.environ, LMCACHE_DISABLE_BANNER="1", PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    if release == "0.5.6":
        return env, ""
    wheels = sorted(WHEELS.glob(f"lmcache-{release}-*.whl"))
    if not wheels:
        return None, f"no lmcache {release} wheel in {WHEELS}"
    from lmcache_wheels import unpack
    env["PYTHONPATH"] = str(unpack(wheels[0], f"lmcache-cli-{release}-"))
    return env, ""


def run_cli(release: str, commands: list[list[str]], timeout: float = 60) -> list[dict]:
    """Runs each argv (without the leading "lmcache") with `release`'s CLI."""
    env, why = release_env(release)
    assert env is not None, why
    r = subprocess.run([str(VENV / "bin" / "python"), __file__, json.dumps(commands)],
                       env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"CLI driver failed ({r.returncode}):\n{r.stderr[-3000:]}"
    results = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(results) == len(commands)
    return results


def fields(text: str) -> dict[str, str]:
    """The CLI's "Label:   value" lines as {label: value}."""
    out = {}
    for line in text.splitlines():
        if ":" in line and not line.startswith(("=", "-", "[")):
            k, v = line.split(":", 1)
            out[k.strip()] = v.strip()
    return out


def _drive(commands: list[list[str]]) -> None:
    real_out = os.dup(1)
    from lmcache.cli.main import main  # imported once: the slow part
    results = []
    for argv in commands:
        with tempfile.TemporaryFile("w+") as o, tempfile.TemporaryFile("w+") as e:
            sys.stdout.flush()
            sys.stderr.flush()
            saved = os.dup(1), os.dup(2)
            os.dup2(o.fileno(), 1)
            os.dup2(e.fileno(), 2)
            sys.argv = ["lmcache", *argv]
            try:
                rc = main() or 0
            except SystemExit as x:
                rc = x.code if isinstance(x.code, int) else (0 if x.code is None else 1)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
            o.seek(0)
            e.seek(0)
            results.append({"rc": rc, "out": o.read(), "err": e.read()})
    os.write(real_out, (json.dumps(results) + "\n").encode())


if __name__ == "__main__":
    _drive(json.loads(sys.argv[1]))
