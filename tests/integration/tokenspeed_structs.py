"""tokenspeed's KV event wire structs: tokenspeed 0.1.1's own
tokenspeed/runtime/pd/kv_events.py, loaded from the released wheel
(tests/tools/engine_wheels.py). Everything is ``array_like``: events are
tagged positional arrays with every field written, the envelope's third slot
is ``attn_dp_rank``. test_events_seed.py also checks them against the seed
(shared/seeds/000_*.txt) when that is present.
"""

import sys
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import engine_wheels  # noqa: E402

tokenspeed = engine_wheels.load("tokenspeed")
VERSION = tokenspeed.ENGINE_VERSION

END_SEQ = tokenspeed.ZmqEventPublisher.END_SEQ

EventBatch = tokenspeed.EventBatch
KVCacheEvent = tokenspeed.KVCacheEvent
BlockStored = tokenspeed.BlockStored
BlockRemoved = tokenspeed.BlockRemoved
AllBlocksCleared = tokenspeed.AllBlocksCleared
KVEventBatch = tokenspeed.KVEventBatch
ZmqEventPublisher = tokenspeed.ZmqEventPublisher

# Positional arity of each event on the wire, tag included: what a tokenspeed
# consumer sees and nothing more.
ARITY = {"BlockStored": 5, "BlockRemoved": 2, "AllBlocksCleared": 1}

encoder = msgspec.msgpack.Encoder()
decoder = msgspec.msgpack.Decoder(KVEventBatch)
