#!/usr/bin/env python3
"""Writes tests/fuzz/seeds/<fuzzer>/*.bin: valid inputs for each libFuzzer
target, so a fuzz run starts from deep coverage instead of from empty input.

Every seed is what an engine really puts on the wire, made by the same
generators as the unit tests' goldens:
  fuzz_events_decode   one KV event payload frame per golden of
                       make_event_goldens.py (msgspec encoding the structs of
                       vLLM, SGLang and tokenspeed, read out of their wheels);
  fuzz_lmcache_decode  the fuzzer's own input layout (tests/fuzz/
                       fuzz_lmcache_decode.cpp): byte 0 = 0 then each request
                       frame as [u16 little-endian length][bytes], for the
                       LMCache 0.5.6 requests of make_lmcache_goldens.py
                       (LMCache's own classes and encoders); byte 0 = 1, then
                       0 (ext 1) or 1 (kvsidecar's host-shm ext) and the
                       payload, for each KV-cache wrapper those requests carry;
  fuzz_pickle          the valid legacy pickled wrappers of make_pickles.py;
  fuzz_tensor_envelope LMCache 0.5.7's inline TensorEnvelope (commit_store's
                       and prepare_retrieve's data) as its
                       transfer_context/tensor_wire.encode_tensors writes it
                       (msgspec: {version: 1, tensors: [{dtype, shape,
                       data}]}), for the chunk shapes an inline worker sends.
Inputs the decoders refuse or only partly decode (unsupported ops and
wrappers, an unknown event type) are left out: every seed must decode, which
tests/unit/test_lmcache_fuzz_seeds.cpp and test_events_fuzz_seeds.cpp check.

Run:  python3 tests/tools/make_fuzz_seeds.py [--lmcache-src DIR]
(needs msgspec and the wheels in build-wheels/, which scripts/install-deps.sh
--with-python downloads; without --lmcache-src or LMCACHE_SRC the LMCache
wheel in build-wheels/ is unpacked to a temporary folder). Check the result in.
"""

from __future__ import annotations

import argparse
import glob
import os
import pathlib
import struct
import sys
import tempfile
import zipfile

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
SEEDS = REPO / "tests" / "fuzz" / "seeds"
sys.path.insert(0, str(HERE))

# Decodes, but drops one event by design (the unit tests check that).
PARTIAL_EVENT_GOLDENS = {"unknown_tag_middle"}
# Requests kvsidecar refuses on purpose (unsupported op or wrapper).
REFUSED_REQUESTS = {"unsupported_prepare_store", "register_kv_cache_vmm"}
LMCACHE_WRAPPER_EXT = 1
KVS_HOST_SHM_EXT = 0x4B


def event_seeds() -> dict[str, bytes]:
    import make_event_goldens

    return {name: data for name, _, data in make_event_goldens.goldens()
            if name not in PARTIAL_EVENT_GOLDENS}


def lmcache_input(frames: list[bytes]) -> bytes:
    out = bytearray(b"\x00")
    for f in frames:
        if len(f) > 0xFFFF:
            raise SystemExit(f"frame of {len(f)} bytes does not fit the fuzzer's u16 length")
        out += struct.pack("<H", len(f)) + f
    return bytes(out)


def wrapper_input(ext: int, payload: bytes) -> bytes:
    return bytes([1, 1 if ext == KVS_HOST_SHM_EXT else 0]) + payload


def lmcache_seeds(src: str) -> dict[str, bytes]:
    import msgspec

    import make_lmcache_goldens

    reqs, _ = make_lmcache_goldens.build(make_lmcache_goldens.load_lmcache(src))
    seeds: dict[str, bytes] = {}
    for name, frames in reqs.items():
        if name in REFUSED_REQUESTS:
            continue
        seeds[f"request_{name}"] = lmcache_input(frames)
        if not name.startswith("register_kv_cache"):
            continue
        # frames: uid, op, instance id, the KV-cache wrapper list, ...
        items = msgspec.msgpack.decode(frames[3], ext_hook=lambda code, data: (code, bytes(data)))
        for i, (code, payload) in enumerate(items or []):
            assert code in (LMCACHE_WRAPPER_EXT, KVS_HOST_SHM_EXT), code
            seeds[f"wrapper_{name}_{i}"] = wrapper_input(code, payload)
    return seeds


def pickle_seeds() -> dict[str, bytes]:
    import make_pickles

    make_pickles.install_torch_stub()
    return {file.removesuffix(".bin"): data for file, data, _ in make_pickles.valid_fixtures()}


def tensor_envelope_seeds() -> dict[str, bytes]:
    """TensorEnvelopes as LMCache 0.5.7's tensor_wire.encode_tensors writes
    them: the msgspec Structs TensorEnvelope(version, tensors) and
    TensorFrame(dtype, shape, data), encoded as maps in field order."""
    import random

    import msgspec

    elem = {"float16": 2, "bfloat16": 2, "float32": 4}
    rng = random.Random(7)

    def env(dtype: str, shape: list[int], n: int) -> bytes:
        size = elem[dtype]
        for d in shape:
            size *= d
        return msgspec.msgpack.encode({"version": 1, "tensors": [
            {"dtype": dtype, "shape": shape, "data": rng.randbytes(size)} for _ in range(n)]})

    def grouped(groups: list[tuple[list[int], str, list[int]]]) -> bytes:
        # 0.5.7's GroupedTensorEnvelope(version, groups) of TensorGroup
        # (chunk_indices, tensors): a hybrid-KV worker's inline data.
        out = []
        for indices, dtype, shape in groups:
            size = elem[dtype]
            for d in shape:
                size *= d
            out.append({"chunk_indices": indices, "tensors": [
                {"dtype": dtype, "shape": shape, "data": rng.randbytes(size)} for _ in indices]})
        return msgspec.msgpack.encode({"version": 1, "groups": out})

    seeds = {
        "empty": env("float16", [2, 1, 1, 1], 0),
        # [2, NL, T, H]: K and V, layers, tokens, heads * head_dim
        "two_chunks_bf16_2x2x16x8": env("bfloat16", [2, 2, 16, 8], 2),
        "three_chunks_f32_2x1x4x4": env("float32", [2, 1, 4, 4], 3),
        # [NL, T, H] with use_mla
        "one_chunk_mla_f16_2x16x8": env("float16", [2, 16, 8], 1),
    }
    # Multi-group: a full-attention group and a sliding-window group holding
    # only its last chunk (all-null chunks are left out).
    seeds["grouped_full_and_window"] = grouped([([0, 1, 2], "bfloat16", [2, 2, 16, 8]),
                                                ([2], "float32", [1, 8, 8])])
    seeds["grouped_window_gaps"] = grouped([([0, 1], "float16", [2, 1, 4, 4]),
                                            ([1], "float16", [1, 2, 4]), ([], "float16", [1, 2, 4])])
    return seeds


def write(fuzzer: str, seeds: dict[str, bytes]) -> None:
    d = SEEDS / fuzzer
    d.mkdir(parents=True, exist_ok=True)
    for old in d.glob("*.bin"):
        # request_053_* / request_057_*: frames of other LMCache releases,
        # written by hand (this script loads 0.5.6 only); kept.
        if not old.name.startswith(("request_053_", "request_057_")):
            old.unlink()
    for name, data in sorted(seeds.items()):
        (d / f"{name}.bin").write_bytes(data)
    print(f"{d.relative_to(REPO)}: {len(seeds)} seeds")


def unpacked_lmcache(tmp: str) -> str:
    wheels = sorted(glob.glob(str(REPO / "build-wheels" / "lmcache-0.5.6-*.whl")))
    if not wheels:
        raise SystemExit("need --lmcache-src (or LMCACHE_SRC), or build-wheels/lmcache-0.5.6-*.whl "
                         "(scripts/install-deps.sh --with-python)")
    with zipfile.ZipFile(wheels[0]) as z:
        z.extractall(tmp, [n for n in z.namelist() if n.startswith("lmcache/") and n.endswith(".py")])
    return tmp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lmcache-src", default=os.environ.get("LMCACHE_SRC"),
                    help="the unpacked lmcache-0.5.6 wheel (default: unpack build-wheels/'s)")
    args = ap.parse_args()
    write("fuzz_events_decode", event_seeds())
    write("fuzz_tensor_envelope", tensor_envelope_seeds())
    with tempfile.TemporaryDirectory() as tmp:
        write("fuzz_lmcache_decode", lmcache_seeds(args.lmcache_src or unpacked_lmcache(tmp)))
    # Last: make_pickles puts stand-in modules named like LMCache's (the
    # legacy wrapper classes) into sys.modules, which would shadow the real
    # ones lmcache_seeds imports.
    write("fuzz_pickle", pickle_seeds())


if __name__ == "__main__":
    main()
