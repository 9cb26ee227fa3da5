"""A process that owns KV pools and never shares them (test_cache_shm_possession.py):
it creates pools of the test's geometry (sglang or vllm layout), fills them with a seed,
prints ``ready <pid> <shm name> ...``, then answers each line on stdin with
``sha <hex>``: the sha256 of all its pools' bytes, so the test sees whether
anyone wrote into them without mapping them itself.

Usage: shm_victim.py NUM_BLOCKS SEED [LAYOUT: sglang (default) | vllm]
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tools"))

import shm_pool  # noqa: E402


def main() -> None:
    blocks, seed = int(sys.argv[1]), int(sys.argv[2])
    layout = sys.argv[3] if len(sys.argv) > 3 else "sglang"
    make = shm_pool.vllm_flash_attn_pools if layout == "vllm" else shm_pool.sglang_mha_pools
    pools = make(2, blocks, 16, 2, 16, prefix="kvs_victim")
    pools.fill(seed)
    print("ready", os.getpid(), " ".join(o.name for o in pools.objects), flush=True)
    try:
        for _ in sys.stdin:
            h = hashlib.sha256()
            for o in pools.objects:
                h.update(bytes(o.map))
            print("sha", h.hexdigest(), flush=True)
    finally:
        pools.close()


if __name__ == "__main__":
    main()
