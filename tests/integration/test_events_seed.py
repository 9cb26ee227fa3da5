"""tokenspeed's own publisher (the seed: python/tokenspeed/runtime/pd/
kv_events.py, ZmqEventPublisher) as the engine in front of kvsidecar, in
both socket modes, with its KVEventBatch objects decoded back on the far
side with every field."""

import atexit
import json
import time
from types import SimpleNamespace

import msgspec
import pytest

import tokenspeed_structs as tss
import vllm_structs as vs
from kvsidecar_harness import (Sidecar, Subscriber, free_port_range, is_fence, replay,
                               replay_batches)
from seed_publisher import find_seed, find_shared_dir, load_seed

H_BIG = 0xFEDCBA9876543210
U64_MAX = (1 << 64) - 1


@pytest.fixture(scope="module")
def seed():
    shared = find_shared_dir()
    if shared is None:
        pytest.skip("shared/ not found (set KVS_SHARED_DIR)")
    path = find_seed(shared)
    if path is None:
        pytest.skip(f"no tokenspeed kv_events seed in {shared / 'seeds'}")
    return load_seed(path)


def test_seed_loads_and_matches_declared_structs(seed):
    # The Structs the other tests decode with are tokenspeed's, field for field.
    for name in ("EventBatch", "KVCacheEvent", "BlockStored", "BlockRemoved", "AllBlocksCleared",
                 "KVEventBatch"):
        theirs, ours = getattr(seed, name), getattr(tss, name)
        assert [(f.name, f.default) for f in msgspec.structs.fields(theirs)] == \
               [(f.name, f.default) for f in msgspec.structs.fields(ours)], name
        tc, oc = theirs.__struct_config__, ours.__struct_config__
        assert (tc.array_like, tc.omit_defaults, tc.gc, tc.tag, tc.tag_field) == \
               (oc.array_like, oc.omit_defaults, oc.gc, oc.tag, oc.tag_field), name
    batch = seed_batch(seed, 1.5)
    mine = tss.KVEventBatch(ts=1.5, events=[
        tss.BlockStored(block_hashes=e.block_hashes, parent_block_hash=e.parent_block_hash,
                        token_ids=e.token_ids, block_size=e.block_size)
        if isinstance(e, seed.BlockStored) else
        tss.BlockRemoved(block_hashes=e.block_hashes) if isinstance(e, seed.BlockRemoved) else
        tss.AllBlocksCleared() for e in batch.events])
    assert msgspec.msgpack.encode(batch) == tss.encoder.encode(mine)
    # tokenspeed's own test shape.
    ex = seed.KVEventBatch(ts=1.5, events=[
        seed.BlockStored(block_hashes=[123], parent_block_hash=None, token_ids=[1, 2],
                         block_size=2), seed.BlockRemoved(block_hashes=[123])], attn_dp_rank=2)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(ex)) == \
        [1.5, [["BlockStored", [123], None, [1, 2], 2], ["BlockRemoved", [123]]], 2]


def seed_batch(seed, ts: float, k: int = 0):
    """A batch as tokenspeed builds it: scheduler events through the seed's
    own scheduler_kv_events_to_wire_events, plus a clear."""
    scheduler_events = [
        SimpleNamespace(kind="BlockStored", block_hashes=[H_BIG + k, U64_MAX - k, 2**63, k],
                        parent_block_hash=U64_MAX - k, token_ids=[128000, 0, 127, 65536, -1, k],
                        block_size=16),
        SimpleNamespace(kind="BlockStored", block_hashes=[k + 1], parent_block_hash=None,
                        token_ids=list(range(16)), block_size=16),
        SimpleNamespace(kind="BlockRemoved", block_hashes=[H_BIG, k]),
    ]
    events = seed.scheduler_kv_events_to_wire_events(scheduler_events)
    events.append(seed.AllBlocksCleared())
    return seed.KVEventBatch(ts=ts, events=events)


def as_vllm(seed, batch):
    """What a vLLM consumer must decode for a tokenspeed batch."""
    out = []
    for e in batch.events:
        if isinstance(e, seed.BlockStored):
            out.append(vs.BlockStored(block_hashes=e.block_hashes,
                                      parent_block_hash=e.parent_block_hash,
                                      token_ids=e.token_ids, block_size=e.block_size,
                                      lora_id=None, medium=None, lora_name=None))
        elif isinstance(e, seed.BlockRemoved):
            out.append(vs.BlockRemoved(block_hashes=e.block_hashes, medium=None))
        else:
            out.append(vs.AllBlocksCleared())
    return vs.KVEventBatch(ts=batch.ts, events=out, data_parallel_rank=batch.attn_dp_rank)


def payload_ok(payload: bytes, expected) -> bool:
    """Byte for byte what msgspec (vLLM) writes for the expected batch."""
    return payload == vs.encoder.encode(expected)


def sync_seed(seed, pub, sub, rank, timeout=10.0) -> int:
    """Warm-up through the seed publisher until the subscriber sees it;
    returns the sidecar seq of the next batch on this rank."""
    deadline = time.monotonic() + timeout
    i = 0
    while True:
        pub.publish(seed.KVEventBatch(ts=-1.0 - i, events=[]))
        i += 1
        if sub.socks[rank].poll(20):
            break
        assert time.monotonic() < deadline, f"dp={rank}: nothing came through the seed publisher"
    last = -1.0 - (i - 1)
    while True:
        m = sub.recv(rank, max(0.0, deadline - time.monotonic()))
        assert m is not None, f"dp={rank}: last warm-up never arrived"
        if not is_fence(m.payload) and msgspec.msgpack.decode(m.payload)[0] == last:
            return m.seq + 1


@pytest.mark.parametrize("fmt", ["tokenspeed", "vllm"])
@pytest.mark.parametrize("mode", ["seed_binds", "sidecar_binds"])
def test_seed_publisher_through_kvsidecar(seed, zctx, tmp_path, fmt, mode):
    dp = 2
    ingest, pub_port, replay_port = (free_port_range(dp) for _ in range(3))
    if mode == "seed_binds":
        # tokenspeed's default style: the engine binds tcp://*:PORT.
        seed_ep, sidecar_ep = f"tcp://*:{ingest}", f"tcp://127.0.0.1:{ingest}"
    else:
        # The sidecar binds its ingest; the engine connects (no * in its endpoint).
        seed_ep, sidecar_ep = f"tcp://127.0.0.1:{ingest}", f"tcp://*:{ingest}"
    sc = Sidecar(tmp_path, {
        "cache.enabled": False, "sidecar.stats_interval": "200ms", "events.format": fmt,
        "events.dp_size": dp, "events.ingest_endpoint": sidecar_ep,
        "events.endpoint": f"tcp://*:{pub_port}",
        "events.replay_endpoint": f"tcp://*:{replay_port}"})
    pubs = []
    sub = None
    try:
        if mode == "seed_binds":
            # As tokenspeed creates it: JSON config through its factory (pydantic).
            cfg = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                              "endpoint": seed_ep, "buffer_steps": 100})
            pubs = [seed.EventPublisherFactory.create(cfg, attn_dp_rank=r) for r in range(dp)]
            assert all(isinstance(p, seed.ZmqEventPublisher) for p in pubs)
            sc.start()
        else:
            sc.start()
            pubs = [seed.ZmqEventPublisher(attn_dp_rank=r, endpoint=seed_ep) for r in range(dp)]
        bound = "listening for" if mode == "sidecar_binds" else "subscribed to"
        for r in range(dp):
            assert sc.find(rf"ingest\[dp={r}\]#\d+ {bound} engine events at tcp://[^ ]*:{ingest + r} ")
        sub = Subscriber(zctx, pub_port, dp)
        base = [sync_seed(seed, pubs[r], sub, r) for r in range(dp)]

        sent = {r: [] for r in range(dp)}
        for k in range(5):
            for r in range(dp):
                b = seed_batch(seed, 1757500000.5 + k + r / 4, k * 10 + r)
                pubs[r].publish(b)  # fills in attn_dp_rank = r
                sent[r].append(b)
        for r in range(dp):
            got = sub.recv_n(len(sent[r]), r)
            assert [m.seq for m in got] == list(range(base[r], base[r] + len(sent[r])))
            for m, b in zip(got, sent[r]):
                assert b.attn_dp_rank == r
                if fmt == "tokenspeed":
                    back = msgspec.msgpack.Decoder(seed.KVEventBatch).decode(m.payload)
                    assert back == b
                    # Byte for byte what tokenspeed itself puts on the wire.
                    assert m.payload == msgspec.msgpack.encode(b)
                else:
                    back = vs.decoder.decode(m.payload)
                    assert back == as_vllm(seed, b)
                    assert payload_ok(m.payload, as_vllm(seed, b))
            sub.assert_silent(r, 0.1)
            kept = replay_batches(replay(zctx, replay_port + r, base[r], fmt), fmt)
            assert [p for _, p in kept] == [m.payload for m in got]
        # The ingest's count lacks seq 0, the sidecar's own start-up fence.
        s = sc.wait_stats("ingest", lambda s: s["published"] >= base[1] - 1 + 5, rank=1)
        assert s["dropped_events"] == 0 and s["bad_payloads"] == 0 and s["gaps"] == 0, s
    finally:
        for p in pubs:
            p.shutdown()
            # It registered itself with atexit; a second shutdown at exit
            # would wait a second on a queue no thread reads any more.
            atexit.unregister(p.shutdown)
        if sub is not None:
            sub.close()
        if sc.running():
            sc.stop()
        sc.kill()
