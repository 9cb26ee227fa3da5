"""LMCache 0.5.6's own answer to POST /cache/checksums in its block-id form,
computed over shared-memory KV pools: run with the engine venv's python
(torch, lmcache), ``python lmcache_block_checksums.py <json>``, where the
JSON holds the pools' descriptors (tests/tools/shm_pool.py
KVPools.descriptors()) and the request body. Calls LMCache's
``_compute_block_checksums`` (v1/multiprocess/http_apis/cache_api.py) on
torch views of the same bytes, with LMCache's block axis for the format
(1 for [2, NB, ...] flash-attn tensors), and adds ``block_id_ranges`` as its
route does; prints the JSON answer.
"""

from __future__ import annotations

import json
import mmap
import os
import sys


def main(arg: str) -> None:
    import torch
    from lmcache.utils import compress_slot_mapping
    from lmcache.v1.multiprocess.http_apis.cache_api import _compute_block_checksums

    spec = json.loads(arg)
    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    maps, tensors = {}, []
    for d in spec["descriptors"]:
        name = d["shm_name"]
        if name not in maps:
            fd = os.open("/dev/shm" + name, os.O_RDONLY)
            try:
                maps[name] = mmap.mmap(fd, d["nbytes"], prot=mmap.PROT_READ)
            finally:
                os.close(fd)
        m = d["metadata"]
        dt = dtypes[m["dtype"]]
        raw = torch.frombuffer(bytearray(maps[name]), dtype=torch.uint8)
        flat = raw.view(dt)
        tensors.append(torch.as_strided(flat, m["shape"], m["stride"], m["storage_offset"]))
    body = spec["body"]
    axes = [0 if t.shape[0] != 2 else 1 for t in tensors]
    out = _compute_block_checksums(tensors, body["block_ids"], axes, body["chunk_size"],
                                   body.get("layerwise", False))
    out["block_id_ranges"] = compress_slot_mapping(body["block_ids"])
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
