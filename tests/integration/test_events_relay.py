"""The KV event relay end to end: a fake engine (pyzmq PUB, msgspec-encoded
vLLM / legacy vLLM / vLLM 0.9 / tokenspeed batches, several DP ranks) ->
kvsidecar -> SUB and DEALER clients that decode with the engines' own
msgspec Structs."""

import hashlib
import http.client
import os
import shutil
import socket
import subprocess
import threading
import time

import msgspec
import pytest
import zmq

import tokenspeed_structs as tss
import vllm_structs as vs
from kvsidecar_harness import (END_SEQ, Subscriber, free_port_range, is_fence, read_replay,
                               replay_batches, wait_until)

U64_MAX = (1 << 64) - 1
H_BIG = 0xFEDCBA9876543210  # >= 2**63: must travel as msgpack uint64
TOKENS = [128000, 9125, 0, 1, 127, 128, 255, 256, 65535, 65536, -1, -40000, 2**40, 42, 7, 3]

STORED_FIELDS = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                 "kv_cache_spec_sliding_window", "locality", "ownership", "session_id"]
REMOVED_FIELDS = ["block_hashes", "medium", "group_idx", "locality", "ownership"]

# How many leading fields each input dialect can carry.
DIALECT_FIELDS = {
    "vllm": (14, 5),
    "vllm_legacy": (11, 3),
    "vllm_v09": (5, 1),
    "tokenspeed": (4, 1),
}


def digest(i: int) -> bytes:
    return hashlib.sha256(f"block-{i}".encode()).digest()


def sample_events(k: int, dialect: str) -> list[dict]:
    """Neutral events (a dict of every vLLM field per event) for batch k; the
    ones a dialect cannot carry come out as None after restrict()."""
    bytes_ok = dialect in ("vllm", "vllm_legacy")
    events = [
        {"type": "BlockStored", "block_hashes": [H_BIG + k, U64_MAX - k, 2**63, k, 300, 70000],
         "parent_block_hash": U64_MAX - 7 - k, "token_ids": TOKENS * 6, "block_size": 16,
         "lora_id": 7, "medium": "CPU", "lora_name": "adapter-a",
         "extra_keys": [None, ("lora1", 5), ("mm-" + "x" * 40, b"\x01\x02"), None, None, None],
         "group_idx": 0, "kv_cache_spec_kind": "sliding_window",
         "kv_cache_spec_sliding_window": 4096, "locality": "REMOTE", "ownership": "tier-2",
         "session_id": f"sess-\u00e9-{k}"},
        {"type": "BlockStored", "block_hashes": [k + 1], "parent_block_hash": None,
         "token_ids": list(range(16)), "block_size": 16, "lora_id": None, "medium": "GPU",
         "lora_name": None, "extra_keys": None, "group_idx": None, "kv_cache_spec_kind": None,
         "kv_cache_spec_sliding_window": None, "locality": None, "ownership": None,
         "session_id": None},
        {"type": "BlockRemoved", "block_hashes": [H_BIG, k], "medium": "STORAGE", "group_idx": 2,
         "locality": "LOCAL", "ownership": "tier-2"},
        {"type": "BlockRemoved", "block_hashes": [], "medium": None, "group_idx": None,
         "locality": None, "ownership": None},
        {"type": "AllBlocksCleared"},
    ]
    if bytes_ok:
        events.append(
            {"type": "BlockStored", "block_hashes": [digest(k), digest(k + 1)],
             "parent_block_hash": digest(k + 1000), "token_ids": [1, 2], "block_size": 1,
             "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": None,
             "group_idx": None, "kv_cache_spec_kind": None,
             "kv_cache_spec_sliding_window": None, "locality": None, "ownership": None,
             "session_id": None})
        events.append({"type": "BlockRemoved", "block_hashes": [b"", b"\x01\x02\x03", digest(k)],
                       "medium": "GPU", "group_idx": None, "locality": None, "ownership": None})
    return events


def restrict(ev: dict, dialect: str) -> dict:
    """What survives of ev through a dialect: fields it lacks become None,
    bytes hashes the u64 vLLM would send."""
    ns, nr = DIALECT_FIELDS[dialect]
    if ev["type"] == "AllBlocksCleared":
        return ev
    fields = STORED_FIELDS[:ns] if ev["type"] == "BlockStored" else REMOVED_FIELDS[:nr]
    out = {"type": ev["type"]}
    for f in (STORED_FIELDS if ev["type"] == "BlockStored" else REMOVED_FIELDS):
        out[f] = ev[f] if f in fields else None
    out["block_hashes"] = [vs.wire_hash(h) for h in out["block_hashes"]]
    if out.get("parent_block_hash") is not None:
        out["parent_block_hash"] = vs.wire_hash(out["parent_block_hash"])
    return out


def _args(ev: dict, names: list[str]) -> dict:
    return {f: ev[f] for f in names}


def encode_input(dialect: str, ts: float, events: list[dict], rank: int | None) -> bytes:
    """The payload an engine speaking `dialect` sends for these events."""
    ns, nr = DIALECT_FIELDS[dialect]
    S, R = STORED_FIELDS[:ns], REMOVED_FIELDS[:nr]
    if dialect == "vllm":
        cls = {"BlockStored": vs.BlockStored, "BlockRemoved": vs.BlockRemoved}
        evs = [vs.AllBlocksCleared() if e["type"] == "AllBlocksCleared"
               else cls[e["type"]](**_args(e, S if e["type"] == "BlockStored" else R))
               for e in events]
        return vs.encoder.encode(vs.KVEventBatch(ts=ts, events=evs, data_parallel_rank=rank))
    if dialect == "vllm_legacy":
        cls = {"BlockStored": vs.LegacyBlockStored, "BlockRemoved": vs.LegacyBlockRemoved}
        evs = [vs.LegacyAllBlocksCleared() if e["type"] == "AllBlocksCleared"
               else cls[e["type"]](**_args(e, S if e["type"] == "BlockStored" else R))
               for e in events]
        return vs.encoder.encode(vs.LegacyKVEventBatch(ts=ts, events=evs, data_parallel_rank=rank))
    if dialect == "vllm_v09":
        assert rank is None, "vLLM 0.9 had no rank slot"
        cls = {"BlockStored": vs.V09BlockStored, "BlockRemoved": vs.V09BlockRemoved}
        evs = [vs.V09AllBlocksCleared() if e["type"] == "AllBlocksCleared"
               else cls[e["type"]](**_args(e, S if e["type"] == "BlockStored" else R))
               for e in events]
        return vs.encoder.encode(vs.V09KVEventBatch(ts=ts, events=evs))
    if dialect == "tokenspeed":
        cls = {"BlockStored": tss.BlockStored, "BlockRemoved": tss.BlockRemoved}
        evs = [tss.AllBlocksCleared() if e["type"] == "AllBlocksCleared"
               else cls[e["type"]](**_args(e, S if e["type"] == "BlockStored" else R))
               for e in events]
        return tss.encoder.encode(tss.KVEventBatch(ts=ts, events=evs, attn_dp_rank=rank))
    raise ValueError(dialect)


def expected_output(fmt: str, ts: float, events: list[dict], rank: int):
    """The batch (Struct) a consumer of the sidecar's `fmt` must decode."""
    if fmt == "vllm":
        evs = []
        for e in events:
            if e["type"] == "AllBlocksCleared":
                evs.append(vs.AllBlocksCleared())
            elif e["type"] == "BlockStored":
                evs.append(vs.BlockStored(**_args(e, STORED_FIELDS)))
            else:
                evs.append(vs.BlockRemoved(**_args(e, REMOVED_FIELDS)))
        return vs.KVEventBatch(ts=ts, events=evs, data_parallel_rank=rank)
    evs = []
    for e in events:
        if e["type"] == "AllBlocksCleared":
            evs.append(tss.AllBlocksCleared())
        elif e["type"] == "BlockStored":
            evs.append(tss.BlockStored(**_args(e, STORED_FIELDS[:4])))
        else:
            evs.append(tss.BlockRemoved(block_hashes=e["block_hashes"]))
    return tss.KVEventBatch(ts=ts, events=evs, attn_dp_rank=rank)


def decode_output(fmt: str, payload: bytes):
    return (vs.decoder if fmt == "vllm" else tss.decoder).decode(payload)


def assert_output(fmt: str, payload: bytes, expected) -> None:
    """Decodes with the consumer's Structs, compares every field, then the
    bytes: they must be exactly what msgspec writes for the expected batch."""
    got = decode_output(fmt, payload)
    assert got.ts == expected.ts
    assert len(got.events) == len(expected.events), (got.events, expected.events)
    for i, (g, e) in enumerate(zip(got.events, expected.events)):
        assert g == e, f"event {i}:\n got  {g}\n want {e}"
    assert got == expected
    raw = msgspec.msgpack.decode(payload)
    assert isinstance(raw, list) and len(raw) == 3, f"envelope {raw!r}"
    if fmt == "tokenspeed":
        for ev in raw[1]:
            assert isinstance(ev, list) and len(ev) == tss.ARITY[ev[0]], \
                f"tokenspeed event with fields tokenspeed does not have: {ev!r}"
    else:
        for ev in raw[1]:
            assert isinstance(ev, dict) and next(iter(ev)) == "type", f"vLLM event {ev!r}"
    assert payload == (vs.encoder if fmt == "vllm" else tss.encoder).encode(expected), \
        "payload differs from msgspec's encoding of the same batch"


def ts_of(payload: bytes) -> float:
    return msgspec.msgpack.decode(payload)[0]


# --- the relay, every dialect in, both dialects out, two DP ranks ---------------------


@pytest.mark.parametrize("in_dialect", ["vllm", "vllm_legacy", "vllm_v09", "tokenspeed"])
@pytest.mark.parametrize("fmt", ["vllm", "tokenspeed"])
def test_every_field_survives_two_ranks(rig, fmt, in_dialect):
    topic = "kv@pod-1@meta-llama/Llama-3.1-8B"
    r = rig(fmt=fmt, dp_size=2, topic=topic)
    sent = {0: [], 1: []}
    for k in range(6):
        for rank in (0, 1):
            ts = 1757500000.25 + k + rank / 8
            events = sample_events(10 * k + rank, in_dialect)
            # The engine may leave its rank out (the sidecar fills in the rank
            # of the stream it came on) or set it; vLLM 0.9 has no slot.
            send_rank = None if (k % 2 == 0 or in_dialect == "vllm_v09") else rank
            r.engine.send(rank, encode_input(in_dialect, ts, events, send_rank))
            sent[rank].append((ts, [restrict(e, in_dialect) for e in events]))
    for rank in (0, 1):
        got = r.sub.recv_n(len(sent[rank]), rank)
        for i, (m, (ts, events)) in enumerate(zip(got, sent[rank])):
            assert m.topic == topic.encode()
            assert m.seq == r.base[rank] + i, f"dp={rank}: seq {m.seq}, want {r.base[rank] + i}"
            assert_output(fmt, m.payload, expected_output(fmt, ts, events, rank))
        r.sub.assert_silent(rank, 0.1)
        # Replay from 0: every seq of the rank from 0, no gaps, same bytes as live.
        kept = replay_batches(r.replay(0, rank), fmt)
        assert [s for s, _ in kept] == list(range(r.base[rank] + len(sent[rank])))
        assert is_fence(kept[0][1]), "seq 0 of every rank is the start-up AllBlocksCleared"
        assert [p for _, p in kept[r.base[rank]:]] == [m.payload for m in got]
    ing = r.sidecar.wait_stats("ingest", lambda s: s["published"] >= r.ingested[1] + 6, rank=1)
    assert ing["dropped_events"] == 0 and ing["bad_payloads"] == 0 and ing["lost"] == 0


@pytest.mark.parametrize("fmt", ["vllm", "tokenspeed"])
def test_empty_and_minimal_batches(rig, fmt):
    r = rig(fmt=fmt)
    payloads = [
        (vs.encoder.encode(vs.KVEventBatch(ts=0.0, events=[], data_parallel_rank=None)), 0.0, []),
        # tokenspeed's own test batch (seed), its rank kept.
        (msgspec.msgpack.encode([1.5, [["BlockStored", [123], None, [1, 2], 2],
                                       ["BlockRemoved", [123]]], 0]), 1.5,
         [{"type": "BlockStored", "block_hashes": [123], "parent_block_hash": None,
           "token_ids": [1, 2], "block_size": 2},
          {"type": "BlockRemoved", "block_hashes": [123]}]),
        # The vLLM 0.26 capture from the wire notes.
        (msgspec.msgpack.encode([1789095808.84, [{
            "type": "BlockStored", "block_hashes": [15760518052499183552],
            "parent_block_hash": None, "token_ids": list(range(16)), "block_size": 16,
            "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": [None],
            "group_idx": 0, "kv_cache_spec_kind": "full_attention"}], 0]), 1789095808.84,
         [{"type": "BlockStored", "block_hashes": [15760518052499183552],
           "parent_block_hash": None, "token_ids": list(range(16)), "block_size": 16,
           "medium": "GPU", "extra_keys": [None], "group_idx": 0,
           "kv_cache_spec_kind": "full_attention"}]),
    ]
    for p, _, _ in payloads:
        r.engine.send(0, p)
    got = r.sub.recv_n(len(payloads), 0)
    for k, (m, (p, ts, events)) in enumerate(zip(got, payloads)):
        full = []
        for e in events:
            names = STORED_FIELDS if e["type"] == "BlockStored" else REMOVED_FIELDS
            full.append({"type": e["type"], **{f: e.get(f) for f in names}})
        if fmt == "vllm" and k == 2:
            # vLLM 0.26 had fewer BlockStored fields: its msgspec wrote a
            # fixmap, and the relay keeps it (today's map16 would add 2 bytes).
            assert m.payload == p
            assert decode_output(fmt, m.payload) == expected_output(fmt, ts, full, 0)
            continue
        assert_output(fmt, m.payload, expected_output(fmt, ts, full, 0))
    assert [m.seq for m in got] == [r.base[0] + i for i in range(len(payloads))]


# --- what is dropped, alone and counted --------------------------------------------------


class BlockMigrated(vs.KVCacheEvent):
    """An event type a newer engine might send."""
    block_hashes: list[int]
    destination: str


@pytest.mark.parametrize("fmt", ["vllm", "tokenspeed"])
def test_unknown_event_tag_dropped_alone_and_counted(rig, fmt):
    r = rig(fmt=fmt)
    removed = vs.BlockRemoved(block_hashes=[H_BIG], medium="GPU")
    stored = vs.BlockStored(block_hashes=[5], parent_block_hash=None, token_ids=[1],
                            block_size=1, lora_id=None, medium="GPU", lora_name=None)
    r.engine.send(0, vs.encoder.encode(vs.KVEventBatch(
        ts=2.0, events=[removed, BlockMigrated(block_hashes=[1], destination="node-b"), stored])))
    # The same in a positional batch, unknown tag first.
    r.engine.send(0, msgspec.msgpack.encode(
        [3.0, [["BlockMigrated", [1], "node-b"], ["BlockRemoved", [9]]], None]))
    got = r.sub.recv_n(2, 0)
    first = [restrict({**{f: None for f in REMOVED_FIELDS}, "type": "BlockRemoved",
                       "block_hashes": [H_BIG], "medium": "GPU"}, "vllm"),
             restrict({**{f: None for f in STORED_FIELDS}, "type": "BlockStored",
                       "block_hashes": [5], "token_ids": [1], "block_size": 1,
                       "medium": "GPU"}, "vllm")]
    assert_output(fmt, got[0].payload, expected_output(fmt, 2.0, first, 0))
    second = [{**{f: None for f in REMOVED_FIELDS}, "type": "BlockRemoved", "block_hashes": [9]}]
    assert_output(fmt, got[1].payload, expected_output(fmt, 3.0, second, 0))
    assert [m.seq for m in got] == [r.base[0], r.base[0] + 1]
    s = r.sidecar.wait_stats("ingest", lambda s: s["dropped_events"] >= 2)
    assert s["dropped_events"] == 2 and s["bad_payloads"] == 0
    assert r.sidecar.find(r"dropped event unknown_tag"), r.sidecar.tail()


@pytest.mark.parametrize("fmt", ["vllm", "tokenspeed"])
def test_malformed_events_dropped_alone_and_counted(rig, fmt):
    r = rig(fmt=fmt)
    ok_removed = {"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU"}
    stored = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
              "token_ids": [1], "block_size": 1, "lora_id": None, "medium": "GPU",
              "lora_name": None}
    bad = [
        {**stored, "block_size": -1},                 # negative block size
        {**stored, "block_hashes": "not-a-list"},     # wrong type
        {k: v for k, v in stored.items() if k != "block_size"},  # required field missing
        {**stored, "token_ids": [U64_MAX]},           # token id beyond int64
        {**stored, "lora_id": "seven"},               # optional field of the wrong type
        {"block_hashes": [1]},                        # no tag
        42,                                           # not an event at all
    ]
    r.engine.send(0, msgspec.msgpack.encode([5.0, [ok_removed, *bad, {"type": "AllBlocksCleared"}],
                                             None]))
    m = r.sub.recv(0, 5.0)
    assert m is not None and m.seq == r.base[0]
    want = [restrict({**{f: None for f in REMOVED_FIELDS}, **ok_removed}, "vllm"),
            {"type": "AllBlocksCleared"}]
    assert_output(fmt, m.payload, expected_output(fmt, 5.0, want, 0))
    s = r.sidecar.wait_stats("ingest", lambda s: s["dropped_events"] >= len(bad))
    assert s["dropped_events"] == len(bad) and s["bad_payloads"] == 0, s


def test_non_batch_payloads_dropped_and_counted(rig):
    r = rig()
    good = vs.encoder.encode(vs.KVEventBatch(ts=4.0, events=[vs.AllBlocksCleared()]))
    r.engine.send(0, b"\xc1garbage")                            # not msgpack
    r.engine.send(0, msgspec.msgpack.encode({"ts": 1.0, "events": []}))  # a map, not a batch
    r.engine.send(0, msgspec.msgpack.encode([1.0]))               # envelope too short
    r.engine.send(0, msgspec.msgpack.encode([1.0, "events", 0]))  # events not an array
    r.engine.send(0, good[:-1])                                   # truncated
    r.engine.send(0, good + b"\x00")                              # trailing bytes
    r.engine.send_frames(0, [b"", b"\x00" * 8])                   # 2 frames
    r.engine.send_frames(0, [b"", b"\x00" * 7, good])             # 7-byte seq
    r.engine.send(0, good)
    m = r.sub.recv(0, 5.0)
    assert m is not None and m.seq == r.base[0]
    assert m.payload == vs.encoder.encode(
        vs.KVEventBatch(ts=4.0, events=[vs.AllBlocksCleared()], data_parallel_rank=0))
    r.sub.assert_silent(0, 0.2)
    s = r.sidecar.wait_stats("ingest", lambda s: s["bad_payloads"] >= 8)
    assert s["bad_payloads"] == 8, s
    # Bad payloads still advanced the engine's seq: no gap, nothing lost.
    assert s["gaps"] == 0 and s["lost"] == 0 and s["dropped_events"] == 0, s


# --- replay ----------------------------------------------------------------------------------


def publish_n(r, n, rank=0, start=0):
    """n small batches through the relay; returns them as the subscriber got them."""
    for i in range(start, start + n):
        r.engine.send(rank, vs.encoder.encode(vs.KVEventBatch(ts=float(i), events=[
            vs.BlockRemoved(block_hashes=[H_BIG + i], medium="GPU")])))
    return r.sub.recv_n(n, rank)


@pytest.mark.parametrize("fmt", ["vllm", "tokenspeed"])
def test_replay_frames_exact(rig, zctx, fmt):
    topic = "kv@pod@m"
    r = rig(fmt=fmt, topic=topic)
    live = publish_n(r, 20)
    newest = live[-1].seq
    d = zctx.socket(zmq.DEALER)
    d.connect(f"tcp://127.0.0.1:{r.replay_port}")
    d.send_multipart([b"", r.base[0].to_bytes(8, "big")])
    replies = read_replay(d, fmt, 5.0)
    assert len(replies) == 21
    for m, rep in zip(live, replies):
        if fmt == "vllm":
            assert rep == [topic.encode(), m.seq.to_bytes(8, "big"), m.payload]
        else:
            assert rep == [m.seq.to_bytes(8, "big"), m.payload]
    assert replies[-1] == ([b"", END_SEQ, b""] if fmt == "vllm" else [END_SEQ, b""])
    # Start at the newest: just it. Beyond the newest: just the end marker.
    d.send_multipart([b"", newest.to_bytes(8, "big")])
    assert [x[-2] for x in read_replay(d, fmt, 5.0)] == [newest.to_bytes(8, "big"), END_SEQ]
    for start in (newest + 1, newest + 1000, (1 << 63) - 1, U64_MAX - 1):
        d.send_multipart([b"", start.to_bytes(8, "big")])
        assert read_replay(d, fmt, 5.0) == [[b"", END_SEQ, b""] if fmt == "vllm" else
                                            [END_SEQ, b""]]
    d.close(linger=0)


@pytest.mark.parametrize("fmt", ["vllm", "tokenspeed"])
def test_replay_of_a_fresh_sidecar_is_its_fence_then_the_end_marker(rig, fmt):
    """Before any engine batch the buffer holds only seq 0, the start-up
    AllBlocksCleared; past it a replay is just the end marker."""
    r = rig(fmt=fmt, sync=False)
    kept = replay_batches(r.replay(0), fmt)
    assert [sq for sq, _ in kept] == [0] and is_fence(kept[0][1]), kept
    assert r.replay(1) == ([[b"", END_SEQ, b""]] if fmt == "vllm" else [[END_SEQ, b""]])


@pytest.mark.parametrize("fmt", ["vllm", "tokenspeed"])
def test_replay_start_older_than_buffer_starts_at_oldest(rig, fmt):
    r = rig(fmt=fmt, overrides={"events.buffer_steps": 8})
    live = publish_n(r, 20)
    for start in (0, live[0].seq, live[-8].seq - 1):
        kept = replay_batches(r.replay(start), fmt)
        assert [s for s, _ in kept] == [m.seq for m in live[-8:]]
        assert [p for _, p in kept] == [m.payload for m in live[-8:]]
    kept = replay_batches(r.replay(live[-3].seq), fmt)
    assert [s for s, _ in kept] == [m.seq for m in live[-3:]]
    s = r.sidecar.wait_stats("replay", lambda s: s.get("kept") == 8)
    assert s["seq"] == f"{live[-8].seq}..{live[-1].seq}"


def test_large_payloads_exact_through_reused_memory(rig):
    """Payloads of 16 KiB and more are copied into buffers the relay reuses
    once the replay buffer has dropped them (events_wire/kv_event_payload_pool.hpp):
    the bytes published and replayed are still exactly the engine's (a batch
    without dp_rank: the engine's with the rank set), the memory is reused,
    and what is kept for reuse stays within events.buffer_bytes."""
    budget = 1 << 20
    r = rig(overrides={"events.buffer_steps": 3, "events.buffer_bytes": "1MiB"})

    def big(i, rank):
        # 300 events of fixed-size fields: every payload is the same size.
        return vs.KVEventBatch(ts=float(i), data_parallel_rank=rank, events=[
            vs.BlockStored(block_hashes=[H_BIG + i * 1000 + k], parent_block_hash=None,
                           token_ids=list(range(i, i + 16)), block_size=16, lora_id=None,
                           medium="GPU", lora_name=None) for k in range(300)])

    n = 40
    want = []
    for i in range(n):
        r.engine.send(0, vs.encoder.encode(big(i, 0 if i % 2 else None)))
        want.append(vs.encoder.encode(big(i, 0)))
        # One at a time: at most the ring's three batches and this one are alive.
        got = r.sub.recv_n(1, 0)
        assert [m.payload for m in got] == want[-1:], f"batch {i}"
    assert len(want[0]) >= 16 << 10
    kept = replay_batches(r.replay(got[-1].seq - 2), "vllm")
    assert [p for _, p in kept] == want[-3:]
    # All but the first few reuse a buffer the ring dropped.
    s = r.sidecar.wait_stats("ingest", lambda s: s.get("payloads_reused", 0) >= n - 10,
                             what=f"payloads_reused >= {n - 10}")
    assert 0 < s["payload_pool_bytes"] <= budget, s


def test_malformed_replay_requests_ignored_server_keeps_serving(rig, zctx):
    r = rig()
    live = publish_n(r, 10)
    bad = zctx.socket(zmq.DEALER)
    bad.connect(f"tcp://127.0.0.1:{r.replay_port}")
    bad.send_multipart([r.base[0].to_bytes(8, "big")])                 # 2 frames at the ROUTER
    bad.send_multipart([b"", r.base[0].to_bytes(8, "big"), b"more"])  # 4 frames
    bad.send_multipart([b"", b"\x00" * 7])                             # 7-byte seq
    assert not bad.poll(300), "a malformed request was answered"
    # Another client is served, completely.
    kept = replay_batches(r.replay(r.base[0]), "vllm")
    assert [p for _, p in kept] == [m.payload for m in live]
    # And the client that misbehaved is served once it asks properly.
    bad.send_multipart([b"", live[-1].seq.to_bytes(8, "big")])
    rep = read_replay(bad, "vllm", 5.0)
    assert [x[-2] for x in rep] == [live[-1].seq.to_bytes(8, "big"), END_SEQ]
    bad.close(linger=0)
    s = r.sidecar.wait_stats("replay_bridge", lambda s: s["rejected"] >= 3 and s["requests"] >= 2)
    assert s["rejected"] == 3 and s["requests"] == 2, s


def test_many_replay_clients_at_once(rig, zctx):
    r = rig()
    n = 1500
    live = publish_n(r, n)
    want = [(m.seq, m.payload) for m in live]
    clients = []
    for _ in range(8):
        d = zctx.socket(zmq.DEALER)
        d.setsockopt(zmq.RCVHWM, 100)  # small pipes: the server must pace each client
        d.connect(f"tcp://127.0.0.1:{r.replay_port}")
        clients.append(d)
    for d in clients:
        d.send_multipart([b"", r.base[0].to_bytes(8, "big")])
    got = {i: [] for i in range(len(clients))}
    done = set()
    poller = zmq.Poller()
    for d in clients:
        poller.register(d, zmq.POLLIN)
    deadline = time.monotonic() + 30
    while len(done) < len(clients):
        assert time.monotonic() < deadline, {i: len(v) for i, v in got.items()}
        for sock, _ in poller.poll(100):
            i = clients.index(sock)
            frames = sock.recv_multipart()
            assert len(frames) == 4 and frames[0] == b""
            got[i].append(frames[1:])
            if frames[2] == END_SEQ:
                done.add(i)
                poller.unregister(sock)
    for i, replies in got.items():
        assert replay_batches(replies, "vllm") == want, f"client {i}"
    for d in clients:
        d.close(linger=0)


def test_replay_client_leaving_or_stalling_does_not_hurt_others(rig, zctx):
    # More batches than the replay ROUTER's per-client pipe (10,000 messages)
    # holds: a client that does not read really holds its stream back.
    n = 25_000
    r = rig(overrides={"events.buffer_steps": n})
    for k in range(n):
        r.engine.send(0, batch_at(float(k)))
    live = r.sub.recv_n(n, 0, timeout=20)
    want = [(m.seq, m.payload) for m in live]

    def client():
        d = zctx.socket(zmq.DEALER)
        d.setsockopt(zmq.RCVHWM, 10)
        d.setsockopt(zmq.RCVBUF, 8192)
        d.connect(f"tcp://127.0.0.1:{r.replay_port}")
        d.send_multipart([b"", r.base[0].to_bytes(8, "big")])
        return d

    leaver, staller = client(), client()
    for _ in range(5):  # reads a little, then goes away mid-stream
        assert leaver.poll(5000)
        leaver.recv_multipart()
    assert staller.poll(5000)  # served, then never read again
    leaver.close(linger=0)
    # A third client still gets its whole stream, twice over.
    for _ in range(2):
        assert replay_batches(r.replay(r.base[0], timeout=20), "vllm") == want
    # The leaver's stream ends (abandoned, or completed into kernel buffers
    # before the disconnect was seen); at most the staller's is still open.
    s = r.sidecar.wait_stats("replay_bridge", lambda s: s["streaming"] <= 1, timeout=10)
    assert s["abandoned"] <= 1 and s["requests"] == 4, s
    # SIGTERM with a replay client stalled mid-stream: exit 0 within 5 s.
    r.sidecar.stop()
    staller.close(linger=0)


def test_late_subscriber_recovers_through_replay(rig, zctx):
    r = rig()
    first = publish_n(r, 50)
    late = Subscriber(zctx, r.pub_port)
    # Keep publishing until the late subscriber is joined (it sees one).
    live_b = []
    i = 50
    while not live_b:
        assert i < 2000, "late subscriber never joined"
        r.engine.send(0, vs.encoder.encode(vs.KVEventBatch(ts=float(i), events=[
            vs.BlockRemoved(block_hashes=[i], medium="GPU")])))
        i += 1
        m = late.recv(0, 0.02)
        if m:
            live_b.append(m)
    for k in range(i, i + 50):
        r.engine.send(0, vs.encoder.encode(vs.KVEventBatch(ts=float(k), events=[
            vs.BlockRemoved(block_hashes=[k], medium="GPU")])))
    total = i + 50
    a = first + r.sub.recv_n(total - 50, 0)
    # The late one asks for everything before its first live batch.
    missed = replay_batches(r.replay(0), "vllm")
    live_b += late.recv_n(a[-1].seq - live_b[0].seq, 0)
    b = {s: p for s, p in missed if s >= r.base[0]}
    b.update({m.seq: m.payload for m in live_b})
    assert sorted(b) == [m.seq for m in a], "the late subscriber's seqs differ"
    events_a = [decode_output("vllm", m.payload) for m in a]
    events_b = [decode_output("vllm", b[s]) for s in sorted(b)]
    assert events_a == events_b
    late.close()


# --- ingest gaps --------------------------------------------------------------------------------


def batch_at(i: float) -> bytes:
    return vs.encoder.encode(vs.KVEventBatch(ts=i, events=[
        vs.BlockStored(block_hashes=[H_BIG + int(i)], parent_block_hash=None, token_ids=[1, 2],
                       block_size=2, lora_id=None, medium="GPU", lora_name=None)]))


def send_until_received_live(r, first_ts: int) -> int:
    """Sends live batches on rank 0 (ts first_ts, first_ts + 1, ...) until the
    sidecar's ingest has received one (its subscription reached the engine);
    returns how many were sent. Those sent before are only in the engine's
    buffer."""
    k = 0

    def seen():
        nonlocal k
        r.engine.send(0, batch_at(first_ts + k))
        k += 1
        s = r.sidecar.stats("ingest")
        return s is not None and s["received"] >= 1

    wait_until(seen, 10, "the sidecar to receive a live batch")
    return k


def test_started_after_the_engine_catches_up_from_its_replay(rig):
    """A sidecar that starts after the engine (or restarts) first publishes
    what the engine published before it subscribed, from the engine's replay,
    in order: routers learn the blocks the engine already holds."""
    r = rig(start=False, engine_replay="vllm5")
    e = r.engine
    for k in range(5):  # nobody subscribed yet: only the engine's buffer has them
        e.send(0, batch_at(900 + k))
    r.start(sync=False)
    total = 5 + send_until_received_live(r, 1000)
    s = r.sidecar.wait_stats("ingest", lambda s: s["published"] >= total, timeout=10)
    assert s["caught_up"] >= 5 and s["gaps"] == 0 and s["lost"] == 0, s
    engine_order = [ts_of(p) for _, p in sorted(e.history[0].items())]
    kept = replay_batches(r.replay(0), "vllm")
    # Seq 0 is the sidecar's own start-up fence, then the engine's batches.
    assert is_fence(kept[0][1])
    relayed = [ts_of(p) for _, p in kept[1:]]
    assert relayed == engine_order
    assert r.sidecar.find(r"caught up: \d+ earlier engine batches published")


def test_batches_missed_while_joining_are_caught_up_not_a_gap(rig):
    """What the engine sends after the sidecar's catch-up answer but before
    its subscription reaches the engine's PUB never arrives live (ZeroMQ's
    slow joiner): the first live batch after a catch-up jumps. Those batches
    are fetched from the engine's replay and counted as caught up: no gap, no
    loss, no warning at every start. Made deterministic here: two batches go
    only to the engine's buffer once the catch-up is done."""
    r = rig(start=False, engine_replay="vllm5")
    e = r.engine
    for k in range(3):
        e.send(0, batch_at(700 + k))
    r.start(sync=False)
    r.sidecar.wait_log(r"caught up: 3 earlier engine batches published", timeout=10)
    e.send(0, batch_at(703), live=False)
    e.send(0, batch_at(704), live=False)
    total = 5 + send_until_received_live(r, 800)
    s = r.sidecar.wait_stats("ingest", lambda s: s["published"] >= total, timeout=10)
    assert s["published"] == total and s["gaps"] == 0 and s["refilled"] == 0, s
    assert s["lost"] == 0 and s["caught_up"] >= 5, s
    engine_order = [ts_of(p) for _, p in sorted(e.history[0].items())]
    kept = replay_batches(r.replay(0), "vllm")
    assert is_fence(kept[0][1])
    assert [ts_of(p) for _, p in kept[1:]] == engine_order
    assert r.sidecar.find(r"went out after the catch-up, before our subscription reached the "
                          r"engine: fetching them")
    assert not r.sidecar.find(r"gap in engine seq")


@pytest.mark.parametrize("layout", ["vllm5", "ts4"])
def test_ingest_gap_filled_from_engine_replay_in_order(rig, layout):
    r = rig(dp_size=2, engine_replay=layout)
    rank = 1  # the engine replay endpoint of rank 1 is base + 1
    e = r.engine
    e.send(rank, batch_at(100))
    gap = [e.send(rank, batch_at(101), live=False), e.send(rank, batch_at(102), live=False)]
    e.send(rank, batch_at(103))
    e.send(rank, batch_at(104))
    got = r.sub.recv_n(5, rank)
    assert [ts_of(m.payload) for m in got] == [100, 101, 102, 103, 104]
    assert [m.seq for m in got] == [r.base[rank] + k for k in range(5)]
    assert (rank, gap[0]) in e.replay_requests, e.replay_requests
    s = r.sidecar.wait_stats("ingest", lambda s: s["refilled"] >= 2, rank=rank)
    assert s["gaps"] == 1 and s["refilled"] == 2 and s["lost"] == 0, s
    assert r.sidecar.find(r"gap \d+\.\.\d+: all 2 batches recovered")


def test_ingest_gap_partly_served_counts_the_rest_lost(rig):
    r = rig(engine_replay="vllm5")
    e = r.engine
    e.send(0, batch_at(400))
    gap = [e.send(0, batch_at(401 + k), live=False) for k in range(3)]
    del e.history[0][gap[1]]  # the engine's buffer no longer has this one
    e.send(0, batch_at(404))
    got = r.sub.recv_n(4, 0)
    assert [ts_of(m.payload) for m in got] == [400, 401, 403, 404]
    assert [m.seq for m in got] == list(range(r.base[0], r.base[0] + 4))
    s = r.sidecar.wait_stats("ingest", lambda s: s["refilled"] + s["lost"] >= 3)
    assert s["gaps"] == 1 and s["refilled"] == 2 and s["lost"] == 1, s


@pytest.mark.parametrize("engine_replay", ["end_only", "silent", None])
def test_ingest_gap_engine_cannot_serve_counts_lost(rig, engine_replay):
    r = rig(engine_replay=engine_replay, overrides={"events.ingest_gap_timeout": "300ms"})
    e = r.engine
    e.send(0, batch_at(200))
    for k in range(3):
        e.send(0, batch_at(201 + k), live=False)
    t0 = time.monotonic()
    e.send(0, batch_at(204))
    e.send(0, batch_at(205))
    got = r.sub.recv_n(3, 0)
    waited = time.monotonic() - t0
    assert [ts_of(m.payload) for m in got] == [200, 204, 205]
    assert [m.seq for m in got] == [r.base[0], r.base[0] + 1, r.base[0] + 2]
    if engine_replay == "silent":
        assert waited >= 0.25, "later batches were not held back for the gap timeout"
    s = r.sidecar.wait_stats("ingest", lambda s: s["lost"] >= 3)
    assert s["gaps"] == 1 and s["lost"] == 3 and s["refilled"] == 0, s


# --- back-pressure and shutdown ----------------------------------------------------------------


def test_queue_full_drops_counted_never_hangs(rig):
    r = rig(overrides={"events.max_queue_size": 1})
    # What the ingest received during the warm-up: with a queue of one, a
    # warm-up can already have been dropped (the indexer had not applied the
    # one before), so it may be more than the ingested[0] that got a seq.
    # Read once the last warm-up is published: every earlier one came first.
    received0 = r.sidecar.wait_stats("ingest",
                                     lambda s: s["published"] >= r.ingested[0])["received"]
    n = 3000
    for i in range(n):
        r.engine.send(0, batch_at(float(i)))
    s = r.sidecar.wait_stats("ingest", lambda s: s["received"] >= received0 + n, timeout=15)
    assert s["received"] == received0 + n, s
    assert s["dropped_queue_full"] > 0, f"no drop with max_queue_size=1 and a burst: {s}"
    assert s["published"] + s["dropped_queue_full"] == s["received"], s
    published = s["published"] - r.ingested[0]
    got = r.sub.recv_n(published, 0, timeout=15)
    # Dropped before a seq was given: what arrives is gap-free and in order.
    assert [m.seq for m in got] == list(range(r.base[0], r.base[0] + published))
    tss_ = [ts_of(m.payload) for m in got]
    assert tss_ == sorted(tss_)
    r.sub.assert_silent(0, 0.2)
    p = r.sidecar.wait_stats("publisher", lambda p: p["dropped_queue_full"] > 0)
    assert p["dropped_queue_full"] == s["dropped_queue_full"]
    # Still relaying after the storm.
    r.engine.send(0, batch_at(99999.0))
    m = r.sub.recv(0, 5.0)
    assert m is not None and ts_of(m.payload) == 99999.0


def test_sigterm_after_burst_publishes_everything_accepted(rig):
    r = rig()
    n = 5000
    for i in range(n):
        r.engine.send(0, batch_at(float(i)))
    r.sidecar.wait_stats("ingest", lambda s: s["received"] >= r.ingested[0] + n, timeout=15)
    r.sidecar.stop()  # SIGTERM, exit 0 within 5 s
    got = r.sub.recv_n(n, 0, timeout=10)
    assert [m.seq for m in got] == list(range(r.base[0], r.base[0] + n))
    assert [ts_of(m.payload) for m in got] == [float(i) for i in range(n)]
    assert "drained: every accepted batch was published" in r.sidecar.log_text()


# --- live traffic is not stalled by a big replay --------------------------------------------------


def test_live_latency_during_full_buffer_replay(rig, zctx):
    r = rig()
    n = 10000
    for i in range(n):
        r.engine.send(0, batch_at(float(i)))
    r.sub.recv_n(n, 0, timeout=30)
    r.sidecar.wait_stats("replay", lambda s: s.get("kept") == n)

    # A replay client that reads at a modest pace, so the replay spans the
    # whole live window (small pipe: the server must hold and resume it).
    d = zctx.socket(zmq.DEALER)
    d.setsockopt(zmq.RCVHWM, 200)
    d.connect(f"tcp://127.0.0.1:{r.replay_port}")
    replayed = []
    replay_done = threading.Event()

    def read_all():
        while True:
            if not d.poll(10000):
                return
            frames = d.recv_multipart()
            if frames[-2] == END_SEQ:
                replay_done.set()
                return
            replayed.append(int.from_bytes(frames[2], "big"))
            if len(replayed) % 25 == 0:
                time.sleep(0.001)

    d.send_multipart([b"", (0).to_bytes(8, "big")])
    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    wait_until(lambda: len(replayed) > 0, 5, "the replay to start")

    live = 200
    sent_at = {}
    received = []

    def recv_live():
        for _ in range(live):
            m = r.sub.recv(0, 10.0)
            if m is None:
                return
            received.append(m)

    rx = threading.Thread(target=recv_live, daemon=True)
    rx.start()
    overlapped = 0
    for i in range(live):
        sent_at[float(n + i)] = time.monotonic()
        r.engine.send(0, batch_at(float(n + i)))
        if not replay_done.is_set():
            overlapped += 1
        time.sleep(0.002)
    rx.join(15)
    reader.join(30)
    d.close(linger=0)
    assert len(received) == live, f"{len(received)} of {live} live batches arrived"
    assert replay_done.is_set() and replayed == list(range(r.base[0], r.base[0] + n)), \
        f"replay incomplete: {len(replayed)} batches"
    assert overlapped >= live // 4, f"the replay finished too early to overlap ({overlapped})"
    lat = sorted(m.t_recv - sent_at[ts_of(m.payload)] for m in received)
    p99 = lat[int(len(lat) * 0.99) - 1]
    assert p99 < 0.050, f"live p99 latency {p99 * 1000:.1f} ms during a replay (max {lat[-1] * 1000:.1f} ms)"


# --- engine restarts ---------------------------------------------------------------------------------


def test_engine_restart_seq_back_to_zero_is_fenced(rig):
    r = rig()
    for i in range(3):
        r.engine.send(0, batch_at(300.0 + i))
    for i in range(3):  # the engine restarted: its seq starts over
        r.engine.send(0, batch_at(310.0 + i), seq=i)
    got = r.sub.recv_n(7, 0)
    # Routers drop the dead engine's blocks (AllBlocksCleared) before any
    # event of the new stream.
    assert [ts_of(m.payload) for m in got[:3]] == [300, 301, 302]
    assert is_fence(got[3].payload), got[3].payload
    assert [ts_of(m.payload) for m in got[4:]] == [310, 311, 312]
    # Our seq does not go back: routers would ignore the batches as stale.
    assert [m.seq for m in got] == list(range(r.base[0], r.base[0] + 7))
    r.sidecar.wait_log(r"engine seq went back from \d+ to 0 \(engine restarted\).*AllBlocksCleared")
    s = r.sidecar.wait_stats("ingest", lambda s: s["published"] >= r.ingested[0] + 7)
    assert s["gaps"] == 0 and s["lost"] == 0 and s["engine_restarts"] == 1, s


# --- slow routers ----------------------------------------------------------------------------------


def join_stalled_subscriber(r, zctx, rcvhwm=10):
    """A second router that subscribes, receives one batch and then stops
    reading. Returns it and the sidecar seq of the next batch (the fast
    subscriber r.sub is drained up to the same point)."""
    stalled = zctx.socket(zmq.SUB)
    stalled.setsockopt(zmq.RCVHWM, rcvhwm)
    # A small fixed kernel buffer: what the sidecar can push into this peer
    # is bounded (its own send buffer, at most net.ipv4.tcp_wmem's 4 MiB, plus
    # this), so a burst larger than that surely fills its pipe.
    stalled.setsockopt(zmq.RCVBUF, 8192)
    stalled.setsockopt(zmq.LINGER, 0)
    stalled.setsockopt(zmq.SUBSCRIBE, b"")
    stalled.connect(f"tcp://127.0.0.1:{r.pub_port}")
    i = 10_000
    deadline = time.monotonic() + 10
    while True:
        r.engine.send(0, vs.encoder.encode(vs.KVEventBatch(ts=-1.0 - i, events=[])))
        i += 1
        if stalled.poll(20):
            break
        assert time.monotonic() < deadline, "the second subscriber never joined"
    last = -1.0 - (i - 1)
    while True:
        m = r.sub.recv(0, 5.0)
        assert m is not None
        if ts_of(m.payload) == last:
            return stalled, m.seq + 1


BIG_TOKENS = list(range(70000, 80000))


def big_batch(k: float) -> bytes:
    # ~30 KB; 600 of them (18 MB) overrun everything a stalled peer can buffer.
    return vs.encoder.encode(vs.KVEventBatch(ts=float(k), events=[vs.BlockStored(
        block_hashes=[H_BIG + int(k)], parent_block_hash=None, token_ids=BIG_TOKENS,
        block_size=16, lora_id=None, medium="GPU", lora_name=None)]))


def burst_with_fast_reader(r, n, quiet=1.0, window=None):
    """Publishes n big batches while r.sub reads; returns the seqs it got
    (it stops after `quiet` seconds without a batch). With `window`, at most
    that many batches are ahead of the reader (a router that keeps up)."""
    got = []

    def read():
        while len(got) < n:
            m = r.sub.recv(0, quiet)
            if m is None:
                return
            got.append(m.seq)

    th = threading.Thread(target=read, daemon=True)
    th.start()
    for k in range(n):
        if window is not None:
            wait_until(lambda: k - len(got) < window or not th.is_alive(), 10,
                       "the reading subscriber to keep up")
        r.engine.send(0, big_batch(k))
    th.join(30)
    return got


STORM = 600


def test_stalled_subscriber_never_blocks_the_relay(rig, zctx):
    r = rig(overrides={"events.hwm": 10})
    stalled, base = join_stalled_subscriber(r, zctx)
    burst_with_fast_reader(r, STORM)
    # Every batch was handed to the PUB socket; the ones the stalled peer
    # had to miss are counted as HWM drops...
    s = r.sidecar.wait_stats("pub", lambda s: s["sent"] >= base + STORM, timeout=15)
    assert s["sent"] == base + STORM, s
    assert 0 < s["hwm_drops"] <= STORM, f"a stalled subscriber and no HWM drop counted: {s}"
    # ...every one is in the replay buffer for routers to recover...
    kept = replay_batches(r.replay(base), "vllm")
    assert [sq for sq, _ in kept] == list(range(base, base + STORM))
    # ...and the relay keeps taking the engine's batches.
    r.engine.send(0, batch_at(123456.0))
    r.sidecar.wait_stats("pub", lambda s: s["sent"] >= base + STORM + 1)
    kept = replay_batches(r.replay(base + STORM), "vllm")
    assert [ts_of(p) for _, p in kept] == [123456.0]
    # SIGTERM with the stalled peer still connected: exit 0 within 5 s.
    r.sidecar.stop()
    stalled.close(linger=0)


def test_stalled_subscriber_does_not_make_others_lose_batches(rig, zctx):
    """vLLM's plain PUB drops only for the peer whose pipe is full; a router
    that reads must get every batch although another one stalls."""
    # Room for the reading router to absorb a burst (a PUB drops for any
    # peer whose pipe is full, the reading one included), far less than the
    # stalled one needs: only the stalled one may lose batches.
    r = rig(overrides={"events.hwm": 200})
    stalled, base = join_stalled_subscriber(r, zctx)
    got = burst_with_fast_reader(r, STORM, window=50)
    pub = r.sidecar.wait_stats("pub", lambda s: s["sent"] >= base + STORM, timeout=15)
    r.engine.send(0, batch_at(123456.0))
    after = r.sub.recv(0, 2.0)
    stalled.close(linger=0)
    assert got == list(range(base, base + STORM)), (
        f"the reading subscriber got {len(got)} of {STORM} batches while another subscriber "
        f"stalled (pub stats: {pub})")
    assert after is not None and ts_of(after.payload) == 123456.0, \
        "a stalled subscriber cut the reading one off"
    assert pub["hwm_drops"] > 0, f"the stalled subscriber never hit its HWM: {pub}"


def has_cap_sys_nice() -> bool:
    with open("/proc/self/status") as f:
        eff = next(int(l.split()[1], 16) for l in f if l.startswith("CapEff:"))
    return bool(eff & (1 << 23))  # CAP_SYS_NICE


def setpriv_drops_cap_sys_nice() -> bool:
    """This process may run a child without CAP_SYS_NICE (root with setpriv,
    itself holding the capability to drop)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None or not has_cap_sys_nice():
        return False
    cmd = ["setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice", "--", "true"]
    return subprocess.run(cmd, capture_output=True).returncode == 0


def nice_by_thread(sc) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for name, nice in sc.threads():
        out.setdefault(name, set()).add(nice)
    return out


APPLIED = r"ZeroMQ I/O thread at nice (-?\d+) \(sidecar.io_nice\)"
NOT_APPLIED = r"sidecar.io_nice = (-?\d+) not applied \((.*); a value below"


def test_io_thread_runs_at_io_nice_and_every_actor_at_the_process_priority(rig):
    r = rig()  # the default config: sidecar.io_nice = -5
    if has_cap_sys_nice():  # the sidecar inherits it (root, as in CI)
        assert r.sidecar.wait_log(APPLIED).group(1) == "-5"
        want = -5
    else:
        assert r.sidecar.wait_log(NOT_APPLIED).group(1) == "-5"
        want = 0
    # The bridges name their threads before they report ready, the indexer
    # as it starts.
    named = {"ingest:0", "pub:0", "index:0"}
    wait_until(lambda: named <= set(r.sidecar.thread_names()), 5, f"threads named {named}")
    threads = nice_by_thread(r.sidecar)
    # The live context's threads (its I/O thread, its reaper) at io_nice ...
    assert threads["ZMQbg/IO/0"] == {want} and threads["ZMQbg/Reaper"] == {want}, threads
    # ... every other thread (the main one, which started them, included)
    # at the process's priority; the replay context's at events.replay_nice.
    others = {n: v for n, v in threads.items()
              if n not in ("ZMQbg/IO/0", "ZMQbg/Reaper") and not n.startswith("2/ZMQbg/")
              and n != "replay_bridge:0"}
    assert {"kvsidecar"} | named <= others.keys(), threads
    assert all(v == {0} for v in others.values()), sorted(threads.items())
    # io_nice = 0 leaves the I/O thread alone.
    zero = rig(overrides={"sidecar.io_nice": 0})
    assert not zero.sidecar.find(APPLIED) and not zero.sidecar.find(NOT_APPLIED)
    assert nice_by_thread(zero.sidecar)["ZMQbg/IO/0"] == {0}
    for x in (r, zero):
        x.engine.send(0, vs.encoder.encode(vs.KVEventBatch(ts=2.0, events=[])))
        assert x.sub.recv_n(1, 0)[0].seq == x.base[0]


@pytest.mark.skipif(not setpriv_drops_cap_sys_nice(),
                    reason="dropping CAP_SYS_NICE from the sidecar needs root, the "
                           "capability and setpriv")
def test_io_nice_without_cap_sys_nice_says_why_and_relays(rig):
    r = rig(start=False)
    r.sidecar.wrapper = ["setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice", "--"]
    r.start()
    m = r.sidecar.wait_log(NOT_APPLIED)
    assert m.group(1) == "-5" and "setpriority(-5)" in m.group(2), m.group(0)
    assert all(v == {0} for n, v in nice_by_thread(r.sidecar).items()
               if not n.startswith("2/ZMQbg/") and n != "replay_bridge:0")
    r.engine.send(0, vs.encoder.encode(vs.KVEventBatch(ts=3.0, events=[])))
    assert r.sub.recv_n(1, 0)[0].seq == r.base[0]


def test_worker_threads_auto_is_one_for_the_relay_alone_and_threads_are_named(rig):
    auto = rig()
    auto.sidecar.wait_log(r"starting: events on, cache off, .* 1 worker thread\(s\)")
    three = rig(overrides={"sidecar.worker_threads": 3})
    three.sidecar.wait_log(r"starting: events on, cache off, .* 3 worker thread\(s\)")
    assert auto.sidecar.scheduler_threads() == 1
    assert three.sidecar.scheduler_threads() == 3
    # Each rank's bridges and indexer run on threads named after them (each
    # names its own as it starts).
    two = rig(dp_size=2)
    want = sorted(f"{actor}:{rank}" for rank in (0, 1)
                  for actor in ("ingest", "pub", "replay_bridge", "index"))
    wait_until(lambda: sorted(n for n in two.sidecar.thread_names() if n in want) == want, 5,
               f"threads named {want}")
    # Both relay alike.
    for r in (auto, three):
        r.engine.send(0, vs.encoder.encode(vs.KVEventBatch(ts=1.0, events=[])))
        assert r.sub.recv_n(1, 0)[0].seq == r.base[0]


def test_ipv6_endpoints_serve_ipv6_and_ipv4_routers(rig, zctx):
    """events.endpoint, events.replay_endpoint and http.listen on [::]: a
    router on ::1 subscribes and replays, one on 127.0.0.1 too (the rig's
    own subscriber: [::] is dual stack), and the probes answer on both.
    Before, binding tcp://[::]:… failed with libzmq's "No such device"."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        socket.socket(socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 on this host")
    pub, rep, http_port = free_port_range(1), free_port_range(1), free_port_range(1)
    r = rig(start=False, overrides={"events.endpoint": f"tcp://[::]:{pub}",
                                    "events.replay_endpoint": f"tcp://[::]:{rep}",
                                    "http.listen": f"[::]:{http_port}"})
    r.pub_port, r.replay_port = pub, rep
    r.start()  # syncs over 127.0.0.1
    sub6 = zctx.socket(zmq.SUB)
    sub6.setsockopt(zmq.IPV6, 1)
    sub6.setsockopt(zmq.LINGER, 0)
    sub6.setsockopt(zmq.SUBSCRIBE, b"")
    sub6.connect(f"tcp://[::1]:{pub}")
    try:
        def got_one():
            r.engine.send(0, batch_at(6000))
            return sub6.poll(50) != 0
        wait_until(got_one, 10, "an IPv6 subscriber to receive a batch")
        frames = sub6.recv_multipart()
        assert len(frames) == 3 and ts_of(frames[2]) == 6000
    finally:
        sub6.close()
    d = zctx.socket(zmq.DEALER)
    d.setsockopt(zmq.IPV6, 1)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(f"tcp://[::1]:{rep}")
    try:
        d.send_multipart([b"", (0).to_bytes(8, "big")])
        replies = replay_batches(read_replay(d, "vllm", 10), "vllm")
        assert replies and is_fence(replies[0][1])
    finally:
        d.close()
    for host in ("::1", "127.0.0.1"):
        conn = http.client.HTTPConnection(host, http_port, timeout=2)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200, host
        conn.close()
    assert r.sidecar.find(r"tcp://\[::\]:" + str(pub))
