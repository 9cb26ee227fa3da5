#!/usr/bin/env python3
"""The steps of test_cache_l2_lmcache_server.py, run in LMCache's own
environment (the engine venv: lmcache 0.5.6 or 0.5.7rc2, torch, numpy) with
LMCache's own client classes, against a server given by URL: LMCache's
server or kvsidecar, the same code for both. One process serves a whole
test (importing LMCache takes seconds): it reads one JSON request per line
on stdin and answers one JSON line on stdout.

  {"step": "store", "url": U, "model": M, "salt": S, "seed": N, "prompt": P,
   "instance": I}
      registers fresh cpu_shm KV pools (vLLM flash-attn layout, the one
      LMCache's CPU server registers) as instance I, fills pages 0.. with
      bytes drawn from seed N, STOREs prompt P's 4 chunks from them, ends
      the session.
  {"step": "fetch", ... , "expect": E, "timeout": T}
      registers other pools (pages 0.. filled from seed N: the source; the
      pages after them zeroed), LOOKs UP the prompt until E chunks hit (or T
      seconds pass), RETRIEVEs the hit into the zeroed pages and compares
      them with the source, byte for byte.

Answers {"ok": ..., "hit": ..., "equal": ...} (and "error" when a step
raised).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import numpy as np  # noqa: E402
import shm_pool  # noqa: E402
from lmcache.utils import EngineType  # noqa: E402
from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey as Key  # noqa: E402
from lmcache.v1.multiprocess.transport.factory import RequestClientFactory  # noqa: E402
from lmcache.v1.platform.base.ipc_wire import CpuShmIPCData, TensorMetadata  # noqa: E402
from lmcache.v1.platform.devices.cpu.shm import CpuShmTensorWrapper  # noqa: E402

CHUNK, PAGE, LAYERS, HEADS, HEAD_DIM = 256, 16, 2, 8, 128  # 2 MiB per chunk
BPC = CHUNK // PAGE
EVENT = bytes(64)
T = 30.0
PACKED = "token_bytes" in inspect.signature(Key).parameters


def prompt(n_chunks: int, salt: int) -> tuple[int, ...]:
    return tuple((salt * 1_000_003 + i * 7919) % 150_000 for i in range(n_chunks * CHUNK))


def key(a, rid: str, worker: int | None):
    toks = prompt(a.chunks, a.prompt)
    if PACKED:
        from lmcache.v1.multiprocess.token_codec import pack_token_ids
        p = {"token_bytes": pack_token_ids(toks)}
    else:
        p = {"token_ids": toks}
    return Key(model_name=a.model, world_size=1, worker_id=worker, start=0,
               end=a.chunks * CHUNK, request_id=rid, num_kv_readers=1, cache_salt=a.salt, **p)


def region(pools, first_block: int, n_blocks: int) -> bytes:
    out = []
    for kv in range(2):
        for layer in range(pools.num_layers):
            m, off = pools._page_location(kv, layer, first_block)
            out.append(bytes(m[off:off + n_blocks * pools.page_bytes]))
    return b"".join(out)


CLIENTS: dict = {}


def client(url: str):
    if url not in CLIENTS:
        CLIENTS[url] = RequestClientFactory.create(url)
    return CLIENTS[url]


def run(a) -> dict:
    n = a.chunks
    pools = shm_pool.vllm_flash_attn_pools(LAYERS, 2 * n * BPC, PAGE, HEADS, HEAD_DIM,
                                           prefix=f"kvs_l2i_{a.instance}")
    c = client(a.url)
    out: dict = {"ok": False, "hit": 0, "equal": False}
    try:
        rng = np.random.default_rng(a.seed)
        for kv in range(2):  # source pages 0..n*BPC from the seed, the rest zero
            for layer in range(LAYERS):
                m, off = pools._page_location(kv, layer, 0)
                m[off:off + n * BPC * pools.page_bytes] = rng.bytes(n * BPC * pools.page_bytes)
        wrappers = [CpuShmTensorWrapper.from_wire(CpuShmIPCData(
            version=1, metadata=TensorMetadata(**d["metadata"]), shm_name=d["shm_name"],
            nbytes=d["nbytes"])) for d in pools.descriptors()]
        c.register_kv_cache(a.instance, wrappers, a.model, 1, EngineType.VLLM,
                            pools.layout_hints(), []).result(timeout=T)
        if a.step == "store":
            rid = f"store-{a.instance}"
            _, ok = c.store(key(a, rid, 0), a.instance, [list(range(0, n * BPC))],
                            EVENT).result(timeout=T)
            c.end_session(rid).result(timeout=T)
            out.update(ok=bool(ok), hit=n, equal=True)
        else:
            deadline = time.monotonic() + a.timeout
            attempt = 0
            while True:  # L2 writes are asynchronous: look until the hit is there
                rid = f"fetch-{a.instance}-{attempt}"
                c.lookup(key(a, rid, None), 1).result(timeout=T)
                hit = c.wait_prefetch_status(rid, T).result(timeout=T) or 0
                if hit >= a.expect or time.monotonic() > deadline:
                    break
                c.end_session(rid).result(timeout=T)
                attempt += 1
                time.sleep(0.1)
            out["hit"] = hit
            if hit > 0:
                first = n * BPC
                k = key(a, rid, 0)
                k = Key(**{**{f: getattr(k, f) for f in k.__dataclass_fields__}, "end": hit * CHUNK})
                _, ok = c.retrieve(k, a.instance, [list(range(first, first + hit * BPC))],
                                   EVENT, 0).result(timeout=T)
                out["ok"] = bool(ok)
                out["equal"] = region(pools, first, hit * BPC) == region(pools, 0, hit * BPC)
            else:
                out["ok"] = True
            c.end_session(rid).result(timeout=T)
        c.unregister_kv_cache(a.instance).result(timeout=T)
    except Exception as e:  # noqa: BLE001 - reported to the test
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        pools.close()
    return out


def main() -> int:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        a = argparse.Namespace(salt="", chunks=4, prompt=1, expect=0, timeout=10.0)
        vars(a).update(req)
        print(json.dumps(run(a)), flush=True)
    for c in CLIENTS.values():
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
