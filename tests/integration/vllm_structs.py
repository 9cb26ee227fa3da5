"""vLLM's KV event wire structs, declared exactly as vLLM declares them.

Same fields, order, defaults and msgspec options as the engine, so that
msgspec writes the bytes vLLM puts on the wire and decodes what a vLLM-based
consumer (Dynamo's Python tooling, llm-d's tests, vLLM's own subscriber
example) would decode. The engine's ``__hash__`` helpers are left out: they
play no part in encoding.

Sources:
  - current: vllm/distributed/kv_events.py on main (tagged-map events since
    vLLM PR #42892; ``locality``/``ownership`` then ``session_id`` added after
    ``kv_cache_spec_sliding_window``). The envelope stays ``array_like``.
  - legacy: the same file before #42892, where events were ``array_like``
    too (tagged positional arrays), BlockStored through
    ``kv_cache_spec_sliding_window``, BlockRemoved through ``group_idx``.
  - v0.9: the first kv_events.py (2-element envelope, BlockStored through
    ``lora_id``, BlockRemoved with hashes only).
"""

from typing import Any, Union

import msgspec

# vllm/v1/core/kv_cache_utils.py: ExternalBlockHash = bytes | int
ExternalBlockHash = Union[bytes, int]

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"

END_SEQ = (-1).to_bytes(8, "big", signed=True)


# --- vLLM main: positional envelope, tagged-map events -----------------------


class EventBatch(
    msgspec.Struct,
    array_like=True,  # type: ignore[call-arg]
    omit_defaults=True,  # type: ignore[call-arg]
    gc=False,  # type: ignore[call-arg]
):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(
    msgspec.Struct,
    omit_defaults=True,  # type: ignore[call-arg]
    gc=False,  # type: ignore[call-arg]
    tag=True,
):
    """Base class for all KV cache-related events"""


class BlockStored(KVCacheEvent):
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


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


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
