"""vLLM's KV event wire structs.

current: vLLM 0.33.0's own vllm/distributed/kv_events.py, loaded from the
released wheel (tests/tools/engine_wheels.py; build-wheels/, downloaded by
scripts/install-deps.sh --with-python): EventBatch, KVCacheEvent,
BlockStored (with lookahead_token_ids: 15 fields + tag, so msgspec writes a
map16 header), BlockRemoved, AllBlocksCleared, KVEventBatch and the engine's
ZmqEventPublisher.

Older layouts, declared below as those releases declared them (one wheel of
each older vLLM would be 300+ MB for a few lines of structs):
  - legacy: kv_events.py before vLLM PR #42892, where events were
    ``array_like`` too (tagged positional arrays), BlockStored through
    ``kv_cache_spec_sliding_window``, BlockRemoved through ``group_idx``.
  - v0.9: the first kv_events.py (2-element envelope, BlockStored through
    ``lora_id``, BlockRemoved with hashes only).
"""

import sys
from pathlib import Path
from typing import Any, Union

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import engine_wheels  # noqa: E402

vllm = engine_wheels.load("vllm")
VERSION = vllm.ENGINE_VERSION

# vllm/v1/core/kv_cache_utils.py: ExternalBlockHash = bytes | int
ExternalBlockHash = Union[bytes, int]

MEDIUM_GPU = vllm.MEDIUM_GPU
MEDIUM_CPU = vllm.MEDIUM_CPU
MEDIUM_STORAGE = vllm.MEDIUM_STORAGE

END_SEQ = vllm.ZmqEventPublisher.END_SEQ

# --- vLLM 0.33: positional envelope, tagged-map events (the wheel's) ---------

EventBatch = vllm.EventBatch
KVCacheEvent = vllm.KVCacheEvent
BlockStored = vllm.BlockStored
BlockRemoved = vllm.BlockRemoved
AllBlocksCleared = vllm.AllBlocksCleared
KVEventBatch = vllm.KVEventBatch
ZmqEventPublisher = vllm.ZmqEventPublisher


# --- vLLM before PR #42892: positional (array_like) events -------------------


class LegacyKVCacheEvent(
    msgspec.Struct,
    array_like=True,  # type: ignore[call-arg]
    omit_defaults=True,  # type: ignore[call-arg]
    gc=False,  # type: ignore[call-arg]
    tag=True,
):
    """Base class for all KV cache-related events"""


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


class LegacyAllBlocksCleared(LegacyKVCacheEvent, tag="AllBlocksCleared"):
    pass


class LegacyKVEventBatch(EventBatch):
    events: list[LegacyBlockStored | LegacyBlockRemoved | LegacyAllBlocksCleared]


# --- vLLM 0.9: the first kv_events.py ----------------------------------------


class V09EventBatch(
    msgspec.Struct,
    array_like=True,  # type: ignore[call-arg]
    omit_defaults=True,  # type: ignore[call-arg]
    gc=False,  # type: ignore[call-arg]
):
    ts: float
    events: list[Any]


class V09KVCacheEvent(
    msgspec.Struct,
    array_like=True,  # type: ignore[call-arg]
    omit_defaults=True,  # type: ignore[call-arg]
    gc=False,  # type: ignore[call-arg]
    tag=True,
):
    """Base class for all KV cache-related events"""


class V09BlockStored(V09KVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class V09BlockRemoved(V09KVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[int]


class V09AllBlocksCleared(V09KVCacheEvent, tag="AllBlocksCleared"):
    pass


class V09KVEventBatch(V09EventBatch):
    events: list[V09BlockStored | V09BlockRemoved | V09AllBlocksCleared]


# --- helpers for tests ---------------------------------------------------------


def wire_hash(h: ExternalBlockHash) -> int:
    """The u64 vLLM sends for a block hash (maybe_convert_block_hash with int
    hashes): an int as is, bytes as their low 64 bits read big-endian."""
    if isinstance(h, bytes):
        return int.from_bytes(h, "big") & ((1 << 64) - 1)
    return h


encoder = msgspec.msgpack.Encoder()
decoder = msgspec.msgpack.Decoder(KVEventBatch)
legacy_decoder = msgspec.msgpack.Decoder(LegacyKVEventBatch)
