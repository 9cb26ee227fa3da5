"""tokenspeed's KV event wire structs, declared exactly as tokenspeed does.

Source: tokenspeed python/tokenspeed/runtime/pd/kv_events.py (the seed
shared/seeds/000_*.txt). Everything is ``array_like``: events are tagged
positional arrays with every field written, the envelope's third slot is
``attn_dp_rank``. test_events_seed.py loads the seed itself and checks these
against it.
"""

from typing import Any

import msgspec

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class EventBatch(
    msgspec.Struct,
    array_like=True,  # type: ignore[call-arg]
    omit_defaults=True,  # type: ignore[call-arg]
    gc=False,  # type: ignore[call-arg]
):
    ts: float
    events: list[Any]
    attn_dp_rank: int | None = None


class KVCacheEvent(
    msgspec.Struct,
    array_like=True,  # type: ignore[call-arg]
    omit_defaults=True,  # type: ignore[call-arg]
    gc=False,  # type: ignore[call-arg]
    tag=True,
):
    """Base class for all KV cache-related events."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


# Positional arity of each event on the wire, tag included: what a tokenspeed
# consumer sees and nothing more.
ARITY = {"BlockStored": 5, "BlockRemoved": 2, "AllBlocksCleared": 1}

encoder = msgspec.msgpack.Encoder()
decoder = msgspec.msgpack.Decoder(KVEventBatch)
