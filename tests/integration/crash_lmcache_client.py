"""A disposable engine for the crash-restart tests (test_cache_crash_restart.py):
LMCache's own client classes (0.5.6 or 0.5.7rc2, ZeroMQ or gRPC, loaded from
the wheel as the other LMCache tests load them) register an instance over
host shared memory it created itself, store two chunks, look them up (the
lookup's read locks stay held: no retrieve, no end_session), register a
second, engine-driven instance (id + 1) and take staging slots with a
prepare_store it never commits. Then it prints one line,
``ready <shm name> <shm name> ...``, and waits to be killed.

Its pools are named /kvs_crash_<pid>_<n>; a SIGKILLed client cannot unlink
them, the test does.

Usage: crash_lmcache_client.py RELEASE(0.5.6|0.5.7) TRANSPORT(zmq|grpc) URL INSTANCE MODE

MODE hold: as above. MODE restart: loads, connects, prints ``standby``; each
line on stdin then tries to register INSTANCE (``refused <why>`` while another
connection owns it; ``registered <seconds>`` once accepted), stores,
retrieves the bytes back, takes and commits a staging slot of INSTANCE + 1,
ends its sessions, prints ``ok`` and stays connected until its stdin says more.
Exit 3 with ``skip: <why>`` when the release cannot be loaded here.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tools"))

MODEL = "test-org/crash-restart"
CHUNK = 256
PAGE = 16
T = 10.0


def load(release: str, transport: str):
    """LMCache's client namespace, as the release's own tests load it."""
    import pytest

    try:
        if release == "0.5.6":
            from lmcache_wheels import client_namespace, wheel_imports
            from test_cache_grpc import _src056
            from test_cache_lmcache_client import _torch_stand_in

            src, why = _src056()
            if src is None:
                raise pytest.skip.Exception(why)
            with wheel_imports(src, _torch_stand_in(), "LMCache 0.5.6's client"):
                return client_namespace(transport)
        from lmcache_wheels import client_namespace, wheel_imports
        from test_cache_lmcache_057 import _src057, _torch_stand_in_057

        with wheel_imports(_src057(), _torch_stand_in_057(), "LMCache 0.5.7's client"):
            return client_namespace(transport)
    except pytest.skip.Exception as e:
        print(f"skip: {e}", flush=True)
        sys.exit(3)


def connect(lmc, release: str, transport: str, url: str):
    if transport == "grpc":
        return lmc.factory.create(url) if release == "0.5.7" else lmc.create_request_client(url)
    return lmc.create_request_client(url)


def key(lmc, release: str, toks, rid: str, worker=0, readers=0):
    K = lmc.IPCCacheServerKey
    if release == "0.5.7":
        return K.from_token_ids(model_name=MODEL, world_size=1, worker_id=worker,
                                token_ids=list(toks), start=0, end=len(toks), request_id=rid,
                                num_kv_readers=readers)
    return K(model_name=MODEL, world_size=1, worker_id=worker, token_ids=tuple(toks), start=0,
             end=len(toks), request_id=rid, num_kv_readers=readers)


def tokens(n_chunks: int, salt: int) -> list[int]:
    return [(salt * 1_000_003 + i * 7919) % 150_000 for i in range(n_chunks * CHUNK)]


def pages_differ(pools, dst: list[int], src: list[int]) -> int:
    return sum(pools.page(kv, layer, d) != pools.page(kv, layer, s)
               for kv in range(2) for layer in range(pools.num_layers) for d, s in zip(dst, src))


def hold(lmc, release: str, c, instance: int, pools) -> None:
    """Register, store, look up (locks held), take staging slots; then wait."""
    toks = tokens(2, salt=instance)
    blocks = list(range(2 * CHUNK // PAGE))
    _, ok = c.store(key(lmc, release, toks, "crash-w"), instance, [blocks],
                    bytes(64)).result(timeout=T)
    assert ok is True
    # The lookup's read locks stay held until the session ends.
    assert c.lookup(key(lmc, release, toks, "crash-r", worker=None, readers=1),
                    1).result(timeout=T) is None
    assert c.wait_prefetch_status("crash-r", 30.0).result(timeout=T) == 2
    # An engine-driven instance with staging slots taken and never given back.
    prep = c.prepare_store(key(lmc, release, tokens(3, salt=instance + 1), "crash-s"),
                           instance + 1).result(timeout=T)
    assert len(prep.context["slots"]) == 3, prep
    print("ready " + " ".join(d["shm_name"] for d in pools.descriptors()), flush=True)
    while True:
        time.sleep(60)


def restart(lmc, release: str, c, instance: int, pools) -> None:
    """Registered again after the old engine died: store, hit, retrieve the
    bytes back, end the sessions, take and give back staging slots."""
    toks = tokens(2, salt=instance + 7)
    src = list(range(2 * CHUNK // PAGE))
    dst = list(range(32, 32 + 2 * CHUNK // PAGE))
    _, ok = c.store(key(lmc, release, toks, "new-w"), instance, [src], bytes(64)).result(timeout=T)
    assert ok is True
    assert c.lookup(key(lmc, release, toks, "new-r", worker=None, readers=1),
                    1).result(timeout=T) is None
    assert c.wait_prefetch_status("new-r", 30.0).result(timeout=T) == 2
    _, ok = c.retrieve(key(lmc, release, toks, "new-r"), instance, [dst], bytes(64),
                       0).result(timeout=T)
    assert ok is True
    assert pages_differ(pools, dst, src) == 0
    for rid in ("new-w", "new-r"):
        assert c.end_session(rid).result(timeout=T) is None
    k = key(lmc, release, tokens(1, salt=instance + 8), "new-s")
    prep = c.prepare_store(k, instance + 1).result(timeout=T)
    assert len(prep.context["slots"]) == 1, prep
    assert c.commit_store(k, instance + 1, b"").result(timeout=T) is True
    assert c.end_session("new-s").result(timeout=T) is None
    print("ok", flush=True)


def main() -> None:
    release, transport, url = sys.argv[1], sys.argv[2], sys.argv[3]
    instance, mode = int(sys.argv[4]), sys.argv[5]
    lmc = load(release, transport)
    import shm_pool
    from test_cache_lmcache_client import lmcache_wrappers

    pools = shm_pool.vllm_flash_attn_pools(2, 64, PAGE, 2, 16, prefix="kvs_crash")
    pools.fill(instance if mode == "hold" else instance + 1000)
    c = connect(lmc, release, transport, url)
    payload = lmc.custom_types.RegisterEngineDrivenContextPayload(
        instance_id=instance + 1, model_name=MODEL, world_size=1, block_size=PAGE, num_layers=2,
        hidden_dim_size=64, dtype_str="bfloat16", use_mla=False, num_physical_slots=CHUNK)
    if mode == "restart":
        # Loaded and connected: wait for the test's word, then register the
        # same ids; a refusal is reported and the next word tries again.
        print("standby", flush=True)
        while True:
            sys.stdin.readline()
            t0 = time.monotonic()
            try:
                c.register_kv_cache(instance, lmcache_wrappers(lmc, pools), MODEL, 1, lmc.EngineType.VLLM,
                                    {"kv_layout": "NHD"}, []).result(timeout=T)
            except Exception as e:  # the failure reply, or gRPC's FAILED_PRECONDITION
                print("refused " + " ".join(str(e).split()), flush=True)
                continue
            break
        print(f"registered {time.monotonic() - t0:.4f}", flush=True)
    else:
        assert c.register_kv_cache(instance, lmcache_wrappers(lmc, pools), MODEL, 1, lmc.EngineType.VLLM,
                                   {"kv_layout": "NHD"}, []).result(timeout=T) is None
    assert c.ping(instance).result(timeout=T) is True
    reg = c.register_kv_cache_engine_driven_context(payload).result(timeout=T)
    assert reg.shm_name, reg
    (hold if mode == "hold" else restart)(lmc, release, c, instance, pools)
    if mode == "restart":
        # Stay connected while the test reads the server's state: leaving
        # would end this connection and release the instances it checks.
        sys.stdin.readline()


if __name__ == "__main__":
    main()
