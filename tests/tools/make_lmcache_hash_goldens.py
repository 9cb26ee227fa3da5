#!/usr/bin/env python3
"""Golden chunk hashes from LMCache's own TokenHasher (blake3), for
tests/unit/test_cache_lmcache_hash.cpp.

The token lists are not stored: case i's are drawn from splitmix64 seeded
with i (the unit test draws the same ones), so thousands of cases fit a
small file. Each line: case, chunk size, token count, chunk count, then the
first 16 bytes of the last chunk's hash in hex (it chains every chunk
before it). 0.5.6 and 0.5.7rc2 give the same file. The first
FULL_CASES cases list every chunk's hash.

The hasher is the wheel's own lmcache/v1/multiprocess/token_hasher.py,
imported from the unpacked wheel (it needs numpy, numba and blake3: the
engine venv has them).

Usage:
  unzip -q build-wheels/lmcache-0.5.6-*.whl -d /tmp/lmc056
  build-venv-engine/bin/python tests/tools/make_lmcache_hash_goldens.py \
      --lmcache-src /tmp/lmc056 > tests/fixtures/lmcache_token_hash_goldens.txt
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

MASK = (1 << 64) - 1
CASES = 3000
FULL_CASES = 20
CHUNK_SIZES = [1, 2, 3, 16, 64, 256]


class SplitMix64:
    def __init__(self, seed: int) -> None:
        self.s = seed & MASK

    def next(self) -> int:
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)


def case_tokens(i: int) -> tuple[int, list[int]]:
    """Case i's chunk size and tokens (mirrored in the unit test)."""
    r = SplitMix64(i)
    cs = CHUNK_SIZES[r.next() % len(CHUNK_SIZES)]
    n = r.next() % (cs * 9 + 1)  # up to 9 chunks, partial tails included
    big = r.next() % 4 == 0       # a quarter use the whole uint32 range
    toks = [r.next() % (1 << 32) if big else r.next() % 152064 for _ in range(n)]
    return cs, toks


def load_token_hasher(src: str):
    path = f"{src}/lmcache/v1/multiprocess/token_hasher.py"
    sys.path.insert(0, src)
    spec = importlib.util.spec_from_file_location("lmcache_token_hasher", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.TokenHasher


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lmcache-src", required=True, help="an unpacked LMCache wheel")
    args = ap.parse_args()
    TokenHasher = load_token_hasher(args.lmcache_src)
    hashers = {cs: TokenHasher(chunk_size=cs, hash_algorithm="blake3") for cs in CHUNK_SIZES}
    print(f"# LMCache TokenHasher(blake3) goldens from {args.lmcache_src}; "
          "see tests/tools/make_lmcache_hash_goldens.py")
    print(f"none {hashers[1].none_hash.hex()}")
    for i in range(CASES):
        cs, toks = case_tokens(i)
        hs = hashers[cs].compute_chunk_hashes(toks)
        last = hs[-1].hex()[:32] if hs else "-"
        print(f"case {i} {cs} {len(toks)} {len(hs)} {last}")
        if i < FULL_CASES:
            for k, h in enumerate(hs):
                print(f"chunk {i} {k} {h.hex()}")


if __name__ == "__main__":
    main()
