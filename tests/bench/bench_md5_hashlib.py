#!/usr/bin/env python3
"""hashlib.md5 (what LMCache hashes KV blocks with for POST /cache/checksums)
on the sizes tests/bench/bench_chunk_hash.cpp times kvsidecar's MD5 on:
256 MiB as 8 chunks of 32 MiB and as 16 of 16 MiB, one chunk after another
as LMCache hashes them. Median of 5 runs, MB/s (10^6 bytes, as Google
Benchmark's M/s is 2^20: both are printed). BENCHMARKS.md, "MD5 in SIMD lanes".

    python3 tests/bench/bench_md5_hashlib.py
"""
import hashlib
import os
import statistics
import time

TOTAL = 256 << 20


def main():
    data = os.urandom(TOTAL)
    view = memoryview(data)
    print(f"hashlib: {hashlib.md5().name}, OpenSSL {__import__('ssl').OPENSSL_VERSION}")
    for chunks in (8, 16):
        each = TOTAL // chunks
        times = []
        for _ in range(5):
            t = time.perf_counter()
            for c in range(chunks):
                hashlib.md5(view[c * each:(c + 1) * each]).hexdigest()
            times.append(time.perf_counter() - t)
        med = statistics.median(times)
        print(f"hashlib.md5 {chunks} x {each >> 20} MiB: median {med * 1000:.0f} ms, "
              f"{TOTAL / med / 1e6:.0f} MB/s ({TOTAL / med / 2**20:.0f} MiB/s)")


if __name__ == "__main__":
    main()
