"""A disposable LMCache client process for the chaos tests
(test_chaos_cache_copy.py): it registers its own host shared-memory pools,
then stores, looks up, retrieves and ends sessions in a loop with several
requests always in flight, until it is killed. It pings its instance every
round, as LMCache's vLLM adapter does, so a killed client is reaped after
cache.heartbeat_timeout (one that never pinged would get
cache.registration_grace). It prints "ready" once its first request was
answered.

Its shared-memory objects are named /kvs_chaos_<pid>_<n>: a SIGKILLed client
cannot unlink them, the test does (unlink_objects_of).

Usage: chaos_cache_client.py ENDPOINT INSTANCE_ID
"""

from __future__ import annotations

import os
import sys
from collections import deque
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tools"))

import _posixshmem  # noqa: E402

import shm_pool  # noqa: E402
from lmcache_client import EVENT_HANDLE, MPClient, cache_key, pool_wrappers  # noqa: E402

CHUNK = 256  # LMCache's chunk size (the sidecar's default cache.chunk_size)
PREFIX = "kvs_chaos"
MODEL = "chaos-model"
PAGE = 16
CHUNKS = 4  # per request
PAGES = CHUNKS * CHUNK // PAGE
MAX_IN_FLIGHT = 8


def tokens(n_chunks: int, salt: int) -> list[int]:
    return [(salt * 1_000_003 + i * 7919) % 150_000 for i in range(n_chunks * CHUNK)]


def unlink_objects_of(pid: int) -> int:
    """Unlinks what a (dead) client process left in /dev/shm; returns how many."""
    n = 0
    for name in os.listdir("/dev/shm"):
        if name.startswith(f"{PREFIX}_{pid}_"):
            try:
                _posixshmem.shm_unlink("/" + name)
                n += 1
            except FileNotFoundError:
                pass
    return n


def main() -> None:
    endpoint, instance = sys.argv[1], int(sys.argv[2])
    pools = shm_pool.sglang_mha_pools(2, 2 * PAGES, PAGE, 2, 64, prefix=PREFIX)
    c = MPClient(endpoint)
    c.call("register_kv_cache", instance, pool_wrappers(pools), MODEL, 1, "sglang",
           {"tokens_per_block": PAGE}, [], timeout=10)
    in_flight: deque[int] = deque()
    src, dst = [list(range(PAGES))], [list(range(PAGES, 2 * PAGES))]
    end = CHUNKS * CHUNK
    announced = False
    i = 0
    while True:
        toks = tokens(CHUNKS, salt=instance * 100_000 + i)
        rid = f"{instance}-{i}"
        in_flight.append(c.submit("ping", instance))
        in_flight.append(c.submit("store", cache_key(MODEL, 1, 0, toks, 0, end, rid), instance,
                                  src, EVENT_HANDLE))
        in_flight.append(c.submit("lookup", cache_key(MODEL, 1, None, toks, 0, end, rid), 1))
        in_flight.append(c.submit("retrieve", cache_key(MODEL, 1, 0, toks, 0, end, rid),
                                  instance, dst, EVENT_HANDLE, 0))
        if i >= 2:  # the request before last is over: end it, as the connectors do
            in_flight.append(c.submit("end_session", f"{instance}-{i - 2}"))
        while len(in_flight) > MAX_IN_FLIGHT:
            c.reply(in_flight.popleft(), timeout=10)
            if not announced:
                print("ready", flush=True)
                announced = True
        i += 1


if __name__ == "__main__":
    main()
