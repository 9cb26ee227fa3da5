#!/usr/bin/env python3
"""msgspec's decode + encode of the very payloads `bench_relay codec --dump`
wrote: what a Python relay built on the engines' own structs would spend per
batch. Decoding is typed, into the engine's Structs (vLLM 0.33's
KVEventBatch, or tokenspeed 0.1.1's, from their wheels via
tests/tools/engine_wheels.py), like kvsidecar's typed decode; encoding uses
one reused msgspec Encoder, like the engines' publishers.

Prints one line per run:
  RESULT mode=msgspec format=F batch=B decode_ns_per_batch=.. encode_ns_per_batch=..
It also checks that msgspec re-encodes each payload to the same bytes (the
payloads are kvsidecar's encoding: this is the byte-exactness check too).
"""

import argparse
import struct
import sys
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import engine_wheels  # noqa: E402


def read_payloads(path: str) -> list[bytes]:
    data = Path(path).read_bytes()
    out, i = [], 0
    while i < len(data):
        (n,) = struct.unpack_from(">I", data, i)
        out.append(data[i + 4:i + 4 + n])
        i += 4 + n
    return out


def per_batch_ns(fn, items, seconds: float) -> float:
    n = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    k = len(items)
    while time.perf_counter() < end:
        for i in range(64):
            fn(items[(n + i) % k])
        n += 64
    return (time.perf_counter() - t0) * 1e9 / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--payloads", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--format", default="vllm", choices=["vllm", "tokenspeed"])
    ap.add_argument("--seconds", type=float, default=1.0)
    a = ap.parse_args()

    mod = engine_wheels.load("vllm" if a.format == "vllm" else "tokenspeed")
    dec = msgspec.msgpack.Decoder(mod.KVEventBatch)
    enc = msgspec.msgpack.Encoder()
    payloads = read_payloads(a.payloads)
    objs = [dec.decode(p) for p in payloads]
    for p, o in zip(payloads, objs):
        if enc.encode(o) != p:
            sys.exit("msgspec re-encodes a payload differently: not msgspec's bytes")
        if len(o.events) != a.batch:
            sys.exit(f"payload holds {len(o.events)} events, expected {a.batch}")
    d = per_batch_ns(dec.decode, payloads, a.seconds)
    e = per_batch_ns(enc.encode, objs, a.seconds)
    print(f"RESULT mode=msgspec format={a.format} batch={a.batch} decode_ns_per_batch={d:.0f} "
          f"encode_ns_per_batch={e:.0f} payload_bytes={len(payloads[0])} msgspec={msgspec.__version__}")


if __name__ == "__main__":
    main()
