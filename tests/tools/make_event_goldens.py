#!/usr/bin/env python3
"""Writes tests/unit/events_golden.hpp: KV event batches as msgspec encodes them.

The current engines' structs are the engines' own: vLLM 0.33.0
(vllm/distributed/kv_events.py), SGLang 0.5.23
(sglang/srt/disaggregation/kv_events.py) and tokenspeed 0.1.1
(tokenspeed/runtime/pd/kv_events.py), each loaded out of its released PyPI
wheel by tests/tools/engine_wheels.py (cached in build-wheels/; scripts/
install-deps.sh --with-python downloads them). So the bytes are what those
engines put on the wire. test_events_codec.cpp compares our encoder with them
byte for byte and decodes them back.

Older vLLM layouts (decode only) are declared below as those releases
declared them: vLLM 0.32 (BlockStored without lookahead_token_ids: 14
fields, fixmap header), the pre-#42892 positional layout (array_like events,
fields through kv_cache_spec_sliding_window) and vLLM 0.9's first version
(2-element envelope, BlockStored through lora_id, BlockRemoved with hashes
only). vLLM v1/core/kv_cache_utils.py maybe_convert_block_hash is repeated
for bytes hashes.

Run:  python3 tests/tools/make_event_goldens.py  (needs msgspec and the
wheels; rewrites the header next to the unit test). Check the result in.
"""

from __future__ import annotations

import hashlib
import pathlib
import sys
import textwrap
from typing import Any

import msgspec

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import engine_wheels  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parents[1] / "unit" / "events_golden.hpp"

V = engine_wheels.load("vllm")        # vLLM 0.33.0
S = engine_wheels.load("sglang")      # SGLang 0.5.23
T = engine_wheels.load("tokenspeed")  # tokenspeed 0.1.1

ExternalBlockHash = bytes | int

# --- vLLM 0.33: tagged-map events, positional envelope (from the wheel) ------

EventBatch = V.KVEventBatch
KVCacheEvent = V.KVCacheEvent
BlockStored = V.BlockStored
BlockRemoved = V.BlockRemoved
AllBlocksCleared = V.AllBlocksCleared


# An event type this relay does not know (stands in for a future one).
class BlockMigrated(KVCacheEvent):
    block_hashes: list[int]
    destination: str


# A vLLM newer than 0.33: one more defaulted field (and a bigger map16).
class NewerBlockStored(BlockStored, tag="BlockStored"):
    event_version: int | None = None


# --- vLLM 0.32: BlockStored before lookahead_token_ids (fixmap) --------------


class V032BlockStored(msgspec.Struct, omit_defaults=True, gc=False, tag="BlockStored"):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


# --- vLLM before PR #42892: positional events --------------------------------


class LegacyKVCacheEvent(
    msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True
):
    pass


class LegacyBlockStored(LegacyKVCacheEvent, tag="BlockStored"):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class LegacyBlockRemoved(LegacyKVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None


# --- vLLM 0.9 (first kv_events.py) ------------------------------------------


class V09EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class V09BlockStored(LegacyKVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class V09BlockRemoved(LegacyKVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[int]


# --- tokenspeed 0.1.1 (from the wheel) -------------------------------------

TsEventBatch = T.KVEventBatch
TsBlockStored = T.BlockStored
TsBlockRemoved = T.BlockRemoved
TsAllBlocksCleared = T.AllBlocksCleared


# --- values (repeated by hand in test_events_codec.cpp) ----------------------

TS = 1757500000.25
H_BIG = 0xFEDCBA9876543210  # >= 2**63: must be uint64, never int64
U64_MAX = 2**64 - 1
# One hash per msgpack uint width.
HASHES_WIDTHS = [H_BIG, 1, 200, 300, 70000, 2**40]
# Sixteen tokens spanning every int width a 128k vocabulary reaches.
TOKENS_A = [128000, 128006, 9125, 128007, 271, 0, 1, 127, 128, 255, 256, 65535, 65536,
            128255, 42, 2]
# Negative ints of every width (msgspec writes them as int8..int64).
TOKENS_NEG = [-1, -32, -33, -200, -40000, -(2**40), 5]


def maybe_convert_block_hash(hash_bytes: bytes) -> int:
    """vllm/v1/core/kv_cache_utils.py, with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES."""
    return int.from_bytes(hash_bytes, byteorder="big") & ((1 << 64) - 1)


def digest(i: int) -> bytes:
    return hashlib.sha256(f"block-{i}".encode()).digest()


def stored_all_fields(cls=BlockStored) -> Any:
    return cls(
        block_hashes=[H_BIG],
        parent_block_hash=U64_MAX,
        token_ids=TOKENS_NEG,
        block_size=16,
        lora_id=7,
        medium="CPU",
        lora_name="adapter-a",
        extra_keys=[None, ("lora1", 5), ("x" * 40, b"\x01\x02")],
        group_idx=1,
        kv_cache_spec_kind="sliding_window",
        kv_cache_spec_sliding_window=4096,
        locality="REMOTE",
        ownership="tier-2",
        session_id="sess-\u00e9",
        lookahead_token_ids=[[5, 70000, -1]],
    )


def chain_16x16() -> list[Any]:
    """The relay's benchmark shape: 16 events, one block of 16 tokens each."""
    events = []
    parent = None
    for i in range(16):
        h = 0x9E3779B97F4A7C15 * (i + 1) & U64_MAX
        events.append(BlockStored(
            block_hashes=[h], parent_block_hash=parent,
            token_ids=[1000 * i + t for t in range(16)], block_size=16,
            lora_id=None, medium="GPU", lora_name=None))
        parent = h
    return events


def goldens() -> list[tuple[str, str, bytes]]:
    enc = msgspec.msgpack.Encoder()
    g: list[tuple[str, str, bytes]] = []

    def add(name: str, what: str, obj: Any) -> None:
        g.append((name, what, enc.encode(obj)))

    # -- encode + decode, vLLM dialect --
    add("vllm_stored_required", "vLLM BlockStored, only the fields without a default",
        EventBatch(ts=TS, events=[BlockStored(
            block_hashes=HASHES_WIDTHS, parent_block_hash=None, token_ids=TOKENS_A,
            block_size=16, lora_id=None, medium="GPU", lora_name=None)],
            data_parallel_rank=0))
    add("vllm_stored_all_fields", "vLLM BlockStored, every field set",
        EventBatch(ts=TS, events=[stored_all_fields()], data_parallel_rank=3))
    add("vllm_removed_required", "vLLM BlockRemoved, only the fields without a default",
        EventBatch(ts=TS, events=[BlockRemoved(block_hashes=[H_BIG, 5], medium="GPU")],
                   data_parallel_rank=1))
    add("vllm_removed_all_fields", "vLLM BlockRemoved, every field set",
        EventBatch(ts=TS, events=[BlockRemoved(block_hashes=[7], medium=None, group_idx=2,
                                               locality="LOCAL", ownership="tier-2")],
                   data_parallel_rank=0))
    add("vllm_cleared", "vLLM AllBlocksCleared",
        EventBatch(ts=0.0, events=[AllBlocksCleared()], data_parallel_rank=0))
    add("vllm_mixed_no_rank", "vLLM, all three types, data_parallel_rank None, empty lists",
        EventBatch(ts=-2.5, events=[
            BlockStored(block_hashes=[], parent_block_hash=3, token_ids=[], block_size=0,
                        lora_id=None, medium=None, lora_name=None),
            BlockRemoved(block_hashes=[H_BIG], medium="STORAGE"),
            AllBlocksCleared()]))
    add("vllm_16x16", "vLLM, 16 BlockStored of one 16-token block each (benchmark shape)",
        EventBatch(ts=TS, events=chain_16x16(), data_parallel_rank=0))
    add("vllm_empty", "vLLM, no events",
        EventBatch(ts=TS, events=[], data_parallel_rank=7))

    # -- encode + decode, tokenspeed dialect --
    add("tokenspeed_seed_example", "tokenspeed's own test batch (seed 000)",
        TsEventBatch(ts=1.5, events=[
            TsBlockStored(block_hashes=[123], parent_block_hash=None, token_ids=[1, 2],
                          block_size=2),
            TsBlockRemoved(block_hashes=[123])], attn_dp_rank=2))
    add("tokenspeed_all_types", "tokenspeed, all three types, attn_dp_rank None",
        TsEventBatch(ts=TS, events=[
            TsBlockStored(block_hashes=HASHES_WIDTHS, parent_block_hash=H_BIG,
                          token_ids=TOKENS_A, block_size=16),
            TsBlockRemoved(block_hashes=[H_BIG, 5]),
            TsAllBlocksCleared()]))
    add("tokenspeed_from_all_fields",
        "tokenspeed encoding of vllm_stored_all_fields: vLLM-only fields dropped",
        TsEventBatch(ts=TS, events=[TsBlockStored(
            block_hashes=[H_BIG], parent_block_hash=U64_MAX, token_ids=TOKENS_NEG,
            block_size=16)], attn_dp_rank=3))

    # -- decode only: what other engines and versions send --
    add("vllm_bytes_hashes", "vLLM with bytes hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)",
        EventBatch(ts=TS, events=[
            BlockStored(block_hashes=[digest(1), digest(2)], parent_block_hash=digest(0),
                        token_ids=[1, 2], block_size=1, lora_id=None, medium="GPU",
                        lora_name=None),
            BlockRemoved(block_hashes=[b"", b"\x01\x02\x03", digest(1)], medium="GPU")],
            data_parallel_rank=0))
    add("vllm_bytes_hashes_as_int", "vllm_bytes_hashes with maybe_convert_block_hash applied",
        EventBatch(ts=TS, events=[
            BlockStored(block_hashes=[maybe_convert_block_hash(digest(1)),
                                      maybe_convert_block_hash(digest(2))],
                        parent_block_hash=maybe_convert_block_hash(digest(0)),
                        token_ids=[1, 2], block_size=1, lora_id=None, medium="GPU",
                        lora_name=None),
            BlockRemoved(block_hashes=[0, 0x010203, maybe_convert_block_hash(digest(1))],
                         medium="GPU")],
            data_parallel_rank=0))
    legacy_kwargs = dict(
        block_hashes=[H_BIG], parent_block_hash=U64_MAX, token_ids=TOKENS_NEG, block_size=16,
        lora_id=7, medium="CPU", lora_name="adapter-a",
        extra_keys=[None, ("lora1", 5), ("x" * 40, b"\x01\x02")], group_idx=1,
        kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=4096)
    add("vllm_legacy_positional", "vLLM before #42892: 12-element positional events",
        EventBatch(ts=TS, events=[
            LegacyBlockStored(**legacy_kwargs),
            LegacyBlockRemoved(block_hashes=[7], medium="GPU", group_idx=2)],
            data_parallel_rank=0))
    add("vllm_legacy_equivalent", "vllm_legacy_positional in today's tagged maps",
        EventBatch(ts=TS, events=[
            BlockStored(**legacy_kwargs),
            BlockRemoved(block_hashes=[7], medium="GPU", group_idx=2)],
            data_parallel_rank=0))
    add("vllm_v09_positional", "vLLM 0.9: 2-element envelope, 6-element BlockStored",
        V09EventBatch(ts=TS, events=[
            V09BlockStored(block_hashes=[H_BIG], parent_block_hash=None, token_ids=[1, 2],
                           block_size=2, lora_id=3),
            V09BlockRemoved(block_hashes=[H_BIG])]))
    add("vllm_v09_equivalent", "vllm_v09_positional in today's tagged maps",
        EventBatch(ts=TS, events=[
            BlockStored(block_hashes=[H_BIG], parent_block_hash=None, token_ids=[1, 2],
                        block_size=2, lora_id=3, medium=None, lora_name=None),
            BlockRemoved(block_hashes=[H_BIG], medium=None)]))
    add("mixed_dialects", "tagged map, tokenspeed array and legacy array in one batch",
        EventBatch(ts=TS, events=[
            BlockRemoved(block_hashes=[1], medium="GPU"),
            TsBlockStored(block_hashes=[2], parent_block_hash=1, token_ids=[5], block_size=1),
            LegacyBlockRemoved(block_hashes=[3], medium="CPU", group_idx=None),
            TsAllBlocksCleared()],
            data_parallel_rank=0))
    add("mixed_dialects_equivalent", "mixed_dialects in today's tagged maps",
        EventBatch(ts=TS, events=[
            BlockRemoved(block_hashes=[1], medium="GPU"),
            BlockStored(block_hashes=[2], parent_block_hash=1, token_ids=[5], block_size=1,
                        lora_id=None, medium=None, lora_name=None),
            BlockRemoved(block_hashes=[3], medium="CPU"),
            AllBlocksCleared()],
            data_parallel_rank=0))
    add("unknown_tag_middle", "vLLM batch with an unknown event type at index 1",
        EventBatch(ts=TS, events=[
            BlockRemoved(block_hashes=[1], medium="GPU"),
            BlockMigrated(block_hashes=[2], destination="node-b"),
            AllBlocksCleared()],
            data_parallel_rank=0))
    add("type_not_first", "tagged map whose 'type' key comes last (a plain dict)",
        [TS, [{"block_hashes": [9], "medium": "GPU", "type": "BlockRemoved"}], 0])
    add("newer_vllm_map16", "a vLLM newer than 0.33 (16 fields: map16 header, unknown key)",
        EventBatch(ts=TS, events=[NewerBlockStored(
            block_hashes=[1], parent_block_hash=None, token_ids=[1], block_size=1,
            lora_id=None, medium="GPU", lora_name=None, event_version=1)],
            data_parallel_rank=0))
    v032 = dict(block_hashes=[H_BIG], parent_block_hash=5, token_ids=[1, 2], block_size=2,
                lora_id=None, medium="GPU", lora_name=None, group_idx=0, session_id="s")
    add("vllm_032_fixmap", "vLLM 0.32 BlockStored (14 fields: fixmap header)",
        EventBatch(ts=TS, events=[V032BlockStored(**v032)], data_parallel_rank=0))
    add("vllm_032_equivalent", "vllm_032_fixmap as vLLM 0.33 writes it (map16)",
        EventBatch(ts=TS, events=[BlockStored(**v032)], data_parallel_rank=0))
    # SGLang 0.5.23's own structs: medium defaulted, cache_salt, session_id and
    # lora_name after it, attn_dp_rank in the envelope.
    add("sglang_salted", "SGLang: a chain start with cache_salt, a removal, a clear",
        S.KVEventBatch(ts=TS, events=[
            S.BlockStored(block_hashes=[11, 12, 13], parent_block_hash=None,
                          token_ids=[1, 2, 3, 4, 5, 6], block_size=2, lora_id=None,
                          medium="GPU", cache_salt="tenant-a", session_id="sess-1",
                          lora_name="adapter-a"),
            S.BlockRemoved(block_hashes=[11], medium="GPU"),
            S.AllBlocksCleared()], attn_dp_rank=1))
    add("sglang_salted_equivalent",
        "sglang_salted in vLLM 0.33: the salt in block 0's extra_keys entry, as vLLM does",
        EventBatch(ts=TS, events=[
            BlockStored(block_hashes=[11, 12, 13], parent_block_hash=None,
                        token_ids=[1, 2, 3, 4, 5, 6], block_size=2, lora_id=None,
                        medium="GPU", lora_name="adapter-a",
                        extra_keys=[("tenant-a",), None, None], session_id="sess-1"),
            BlockRemoved(block_hashes=[11], medium="GPU"),
            AllBlocksCleared()], data_parallel_rank=1))
    add("sglang_continuation", "SGLang: a salted continuation (parent set), medium unset",
        S.KVEventBatch(ts=TS, events=[
            S.BlockStored(block_hashes=[-5], parent_block_hash=13, token_ids=[7, 8],
                          block_size=2, lora_id=None, cache_salt="tenant-a")],
            attn_dp_rank=0))
    add("sglang_continuation_equivalent",
        "sglang_continuation in vLLM 0.33: the salt is implied by the parent chain",
        EventBatch(ts=TS, events=[
            BlockStored(block_hashes=[2**64 - 5], parent_block_hash=13, token_ids=[7, 8],
                        block_size=2, lora_id=None, medium=None, lora_name=None)],
            data_parallel_rank=0))
    return g


def render(g: list[tuple[str, str, bytes]]) -> str:
    out = [
        "// Generated by tests/tools/make_event_goldens.py with msgspec "
        f"{msgspec.__version__}. Do not edit;",
        "// rerun the script instead. Each array is one KV event payload frame exactly as",
        "// msgspec encodes the engine's structs (see the script for their declarations).",
        "#pragma once",
        "",
        "#include <cstddef>",
        "",
        "namespace kvs_golden {",
        "",
    ]
    for name, what, data in g:
        shown = repr(msgspec.msgpack.decode(data))
        out.append(f"// {what}")
        for line in textwrap.wrap(shown, 96):
            out.append(f"//   {line}")
        body = ", ".join(f"0x{b:02x}" for b in data)
        out.append(f"inline constexpr unsigned char {name}[] = {{")
        for line in textwrap.wrap(body, 96):
            out.append(f"    {line}")
        out.append("};")
        out.append("")
    out.append("} // namespace kvs_golden")
    out.append("")
    return "\n".join(out)


def main() -> None:
    OUT.write_text(render(goldens()))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
