"""The engines' own publishers, from their released PyPI wheels, in front of
kvsidecar: vLLM 0.33.0's, SGLang 0.5.23's and tokenspeed 0.1.1's
ZmqEventPublisher (tests/tools/engine_wheels.py loads each kv_events.py out
of its wheel; no torch needed). Their batches are decoded back on the far
side with the engines' own msgspec decoders and compared byte for byte with
what the engine itself puts on the wire."""

import atexit

import msgspec
import pytest

import tokenspeed_structs as tss
import vllm_structs as vs
from kvsidecar_harness import (Sidecar, Subscriber, free_port_range, replay,
                               replay_batches, warm_up_publisher)

import engine_wheels  # noqa: E402

sgl = engine_wheels.load("sglang")

H_BIG = 0xFEDCBA9876543210
U64_MAX = (1 << 64) - 1


def vllm_batch(ts: float, k: int):
    """Every field of vLLM 0.33's structs, lookahead_token_ids included."""
    return vs.KVEventBatch(ts=ts, events=[
        vs.BlockStored(block_hashes=[H_BIG + k, U64_MAX - k, k], parent_block_hash=U64_MAX - k,
                       token_ids=[128000, 0, 127, 65536, -1, k], block_size=2, lora_id=7,
                       medium=vs.MEDIUM_CPU, lora_name="adapter-a",
                       extra_keys=[("adapter-a", "salt"), None, (("mm-1", 0),)], group_idx=1,
                       kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=4096,
                       locality="REMOTE", ownership="tier-2", session_id=f"sess-{k}",
                       lookahead_token_ids=[[1, 2], [], [70000]]),
        vs.BlockStored(block_hashes=[k + 1], parent_block_hash=None,
                       token_ids=list(range(16)), block_size=16, lora_id=None,
                       medium=vs.MEDIUM_GPU, lora_name=None),
        vs.BlockRemoved(block_hashes=[H_BIG, k], medium=vs.MEDIUM_GPU, group_idx=1,
                        locality="LOCAL", ownership="tier-2"),
        vs.AllBlocksCleared()])


def sglang_batch(ts: float, k: int):
    """SGLang 0.5.23's structs: cache_salt, session_id, lora_name, a chain
    start and a continuation."""
    return sgl.KVEventBatch(ts=ts, events=[
        sgl.BlockStored(block_hashes=[k + 1, k + 2], parent_block_hash=None,
                        token_ids=[1, 2, 3, 4], block_size=2, lora_id=None,
                        medium=sgl.StorageMedium.GPU.value, cache_salt="tenant-a",
                        session_id=f"sess-{k}", lora_name="adapter-a"),
        sgl.BlockStored(block_hashes=[-(k + 3)], parent_block_hash=k + 2, token_ids=[5, 6],
                        block_size=2, lora_id=None, cache_salt="tenant-a"),
        sgl.BlockRemoved(block_hashes=[k + 1], medium="CPU_PINNED"),
        sgl.AllBlocksCleared()])


def sglang_as_vllm(b):
    """What a vLLM 0.33 consumer must decode for an SGLang batch: cache_salt
    in block 0's extra_keys entry of a chain start (as vLLM publishes a
    salt), implied by the parent in a continuation; negative hashes as u64."""
    out = []
    for e in b.events:
        if isinstance(e, sgl.BlockStored):
            extra = None
            if e.cache_salt is not None and e.parent_block_hash is None:
                extra = [(e.cache_salt,)] + [None] * (len(e.block_hashes) - 1)
            out.append(vs.BlockStored(
                block_hashes=[h & U64_MAX for h in e.block_hashes],
                parent_block_hash=e.parent_block_hash, token_ids=e.token_ids,
                block_size=e.block_size, lora_id=e.lora_id, medium=e.medium,
                lora_name=e.lora_name, extra_keys=extra, session_id=e.session_id))
        elif isinstance(e, sgl.BlockRemoved):
            out.append(vs.BlockRemoved(block_hashes=e.block_hashes, medium=e.medium))
        else:
            out.append(vs.AllBlocksCleared())
    return vs.KVEventBatch(ts=b.ts, events=out, data_parallel_rank=b.attn_dp_rank)


def tokenspeed_batch(ts: float, k: int):
    return tss.KVEventBatch(ts=ts, events=[
        tss.BlockStored(block_hashes=[H_BIG + k, k], parent_block_hash=None,
                        token_ids=[128000, 0, -1, k], block_size=2),
        tss.BlockRemoved(block_hashes=[H_BIG + k]),
        tss.AllBlocksCleared()])


ENGINES = {
    # engine: (publisher class, rank keyword, batch maker, empty batch)
    "vllm": (vs.ZmqEventPublisher, "data_parallel_rank", vllm_batch,
             lambda ts: vs.KVEventBatch(ts=ts, events=[])),
    "sglang": (sgl.ZmqEventPublisher, "attn_dp_rank", sglang_batch,
               lambda ts: sgl.KVEventBatch(ts=ts, events=[])),
    "tokenspeed": (tss.ZmqEventPublisher, "attn_dp_rank", tokenspeed_batch,
                   lambda ts: tss.KVEventBatch(ts=ts, events=[])),
}


def rank_of(b):
    return getattr(b, "data_parallel_rank", None) if hasattr(b, "data_parallel_rank") \
        else b.attn_dp_rank


def expected_payload(engine: str, fmt: str, b) -> bytes:
    """The bytes the sidecar must publish for batch b."""
    if fmt == "vllm":
        if engine == "vllm":
            return msgspec.msgpack.encode(b)  # what vLLM's publisher sends
        if engine == "sglang":
            return msgspec.msgpack.encode(sglang_as_vllm(b))
        return msgspec.msgpack.encode(vs.KVEventBatch(ts=b.ts, events=[
            vs.BlockStored(block_hashes=e.block_hashes, parent_block_hash=e.parent_block_hash,
                           token_ids=e.token_ids, block_size=e.block_size, lora_id=None,
                           medium=None, lora_name=None) if isinstance(e, tss.BlockStored)
            else vs.BlockRemoved(block_hashes=e.block_hashes, medium=None)
            if isinstance(e, tss.BlockRemoved) else vs.AllBlocksCleared()
            for e in b.events], data_parallel_rank=b.attn_dp_rank))
    assert engine == "tokenspeed"
    return msgspec.msgpack.encode(b)


@pytest.mark.parametrize("engine,fmt", [("vllm", "vllm"), ("sglang", "vllm"),
                                        ("tokenspeed", "tokenspeed"), ("tokenspeed", "vllm")])
def test_engine_publisher_from_wheel_through_kvsidecar(zctx, tmp_path, engine, fmt):
    cls, rank_kw, make, empty = ENGINES[engine]
    dp = 2
    ingest, pub_port, replay_port = (free_port_range(dp) for _ in range(3))
    sc = Sidecar(tmp_path, {
        "cache.enabled": False, "sidecar.stats_interval": "200ms", "events.format": fmt,
        "events.dp_size": dp, "events.ingest_endpoint": f"tcp://127.0.0.1:{ingest}",
        "events.endpoint": f"tcp://*:{pub_port}",
        "events.replay_endpoint": f"tcp://*:{replay_port}"})
    pubs = []
    sub = None
    try:
        # The engines' default: bind tcp://*:PORT, the port offset by rank.
        pubs = [cls(**{rank_kw: r}, endpoint=f"tcp://*:{ingest}") for r in range(dp)]
        sc.start()
        sub = Subscriber(zctx, pub_port, dp)
        base = [warm_up_publisher(pubs[r], empty, sub, r) for r in range(dp)]

        sent = {r: [] for r in range(dp)}
        for k in range(4):
            for r in range(dp):
                b = make(1757500000.5 + k + r / 4, k * 10 + r)
                pubs[r].publish(b)  # the publisher fills in its rank
                sent[r].append(b)
        vllm_decoder = msgspec.msgpack.Decoder(vs.KVEventBatch)  # vLLM's own types
        for r in range(dp):
            got = sub.recv_n(len(sent[r]), r)
            assert [m.seq for m in got] == list(range(base[r], base[r] + len(sent[r])))
            for m, b in zip(got, sent[r]):
                assert rank_of(b) == r
                want = expected_payload(engine, fmt, b)
                assert m.payload == want, (m.payload.hex(), want.hex())
                if fmt == "vllm":
                    back = vllm_decoder.decode(m.payload)
                    if engine == "vllm":
                        # Every field, lookahead_token_ids included: what vLLM's
                        # decoder reads from the engine's own bytes.
                        assert back == vllm_decoder.decode(msgspec.msgpack.encode(b))
                        assert back.events[0].lookahead_token_ids == [[1, 2], [], [70000]]
                    assert back.data_parallel_rank == r
                else:
                    assert msgspec.msgpack.Decoder(tss.KVEventBatch).decode(m.payload) == b
            kept = replay_batches(replay(zctx, replay_port + r, base[r], fmt), fmt)
            assert [p for _, p in kept] == [m.payload for m in got]
        # The ingest publishes every sidecar seq but 0 (the sidecar's own fence).
        s = sc.wait_stats("ingest", lambda s: s["published"] >= base[1] + 4 - 1, rank=1)
        assert s["dropped_events"] == 0 and s["bad_payloads"] == 0 and s["gaps"] == 0, s
    finally:
        for p in pubs:
            p.shutdown()
            atexit.unregister(p.shutdown)  # SGLang's registers itself
        if sub is not None:
            sub.close()
        if sc.running():
            sc.stop()
        sc.kill()
