"""Snapshots for late routers: ["", "snapshot/1"] on the replay ROUTER.

A router that applies a snapshot (consistent with seq S) and then a replay
from S+1 must hold exactly what a router that saw every published batch
holds. Engines here are the fake engine (exact control) and the real vLLM
0.33 / SGLang publishers from their wheels (real_engines.py).
"""

import random
import threading
import time

import msgspec
import pytest
import zmq

import real_engines
import vllm_structs as vs
from kvsidecar_harness import END_SEQ, read_replay, replay_batches, sync_rank, wait_until, Subscriber

SNAPSHOT = b"snapshot/1"


def snapshot(ctx: zmq.Context, port: int, dialect: str = "vllm",
             timeout: float = 20.0) -> list[list[bytes]]:
    """Sends a snapshot request as a DEALER; every reply (delimiter
    stripped), the end marker last."""
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.setsockopt(zmq.RCVHWM, 0)
    d.connect(f"tcp://127.0.0.1:{port}")
    try:
        d.send_multipart([b"", SNAPSHOT])
        return read_replay(d, dialect, timeout)
    finally:
        d.close(linger=0)


def snapshot_batches(replies, dialect="vllm") -> tuple[int | None, list[bytes]]:
    """(S, payloads): every batch carries the same seq S."""
    batches = replay_batches(replies, dialect)
    seqs = {s for s, _ in batches}
    assert len(seqs) <= 1, f"snapshot batches with different seqs {sorted(seqs)[:5]}"
    return (seqs.pop() if seqs else None), [p for _, p in batches]


# --- a router's state: the blocks it holds ---------------------------------------------------


def _event(e):
    """(tag, fields) from a tagged map or a positional array."""
    if isinstance(e, dict):
        return e["type"], e
    tag = e[0]
    if tag == "BlockStored":
        return tag, {"block_hashes": e[1], "parent_block_hash": e[2], "token_ids": e[3],
                     "block_size": e[4]}
    if tag == "BlockRemoved":
        return tag, {"block_hashes": e[1]}
    return tag, {}


def apply(state: dict, payload: bytes, stored_only: bool = False) -> None:
    """Applies one published batch to `state`: (hash, medium, group) ->
    (parent, tokens, lora_name, extra key)."""
    _, events, _ = msgspec.msgpack.decode(payload)
    for raw in events:
        tag, f = _event(raw)
        if stored_only:
            assert tag == "BlockStored", f"a snapshot carried {tag}"
        medium, group = f.get("medium"), f.get("group_idx")
        if tag == "BlockStored":
            bs = f["block_size"]
            parent = f["parent_block_hash"]
            keys = f.get("extra_keys")
            for i, h in enumerate(f["block_hashes"]):
                toks = tuple(f["token_ids"][i * bs:(i + 1) * bs])
                extra = msgspec.msgpack.encode(keys[i]) if keys else None
                state[(h, medium, group)] = (parent, toks, f.get("lora_name"), extra)
                parent = h
        elif tag == "BlockRemoved":
            for h in f["block_hashes"]:
                state.pop((h, medium, group), None)
        elif tag == "AllBlocksCleared":
            state.clear()


def check_parents_first(payloads: list[bytes]) -> None:
    seen = set()
    for p in payloads:
        for raw in msgspec.msgpack.decode(p)[1]:
            _, f = _event(raw)
            parent = f["parent_block_hash"]
            for h in f["block_hashes"]:
                # A parent the snapshot holds came before.
                assert parent is None or parent in seen or parent not in ALL_HASHES[0], \
                    f"block {h} before its parent {parent}"
                seen.add(h)
                parent = h


ALL_HASHES: list[set] = [set()]


def snapshot_state(ctx, port, dialect="vllm") -> tuple[int | None, dict]:
    s, payloads = snapshot_batches(snapshot(ctx, port, dialect), dialect)
    state: dict = {}
    for p in payloads:
        apply(state, p, stored_only=True)
    ALL_HASHES[0] = {k[0] for k in state}
    check_parents_first(payloads)
    return s, state


def stored(hashes, parent, medium="GPU", bs=4, **kw):
    kw.setdefault("lora_name", None)
    return vs.BlockStored(block_hashes=hashes, parent_block_hash=parent,
                          token_ids=[h * 100 + j for h in hashes for j in range(bs)],
                          block_size=bs, lora_id=None, medium=medium, **kw)


def send(r, *events, ts=1.0):
    r.engine.send(0, vs.encoder.encode(vs.KVEventBatch(ts=ts, events=list(events))))


def received_state(r, n: int, state: dict) -> int:
    """Applies the next n batches the rig's subscriber receives; returns the
    last seq, once the rank's index has applied it too (the index runs on its
    own thread: a snapshot asked before it caught up is consistent with an
    earlier seq, which is right for a router but not what these tests compare)."""
    last = -1
    for m in r.sub.recv_n(n, 0, timeout=20.0):
        apply(state, m.payload)
        last = m.seq
    r.sidecar.wait_stats("index", lambda s: isinstance(s.get("seq"), int) and s["seq"] >= last,
                         timeout=10,
                         what=f"the index to apply seq {last}")
    return last


# --- tests --------------------------------------------------------------------------------------


def test_snapshot_before_any_engine_batch_holds_no_block(rig, zctx):
    """Nothing published: just the end marker (a router replays from 0).
    With restart fencing the sidecar itself publishes seq 0 at start: then
    one empty batch at that seq."""
    r = rig(sync=False)
    replies = snapshot(zctx, r.replay_port)
    assert replies[-1] == [b"", END_SEQ, b""]
    assert len(replies) <= 2
    for topic, seq, payload in replies[:-1]:
        assert msgspec.msgpack.decode(payload)[1] == []
        assert int.from_bytes(seq, "big") == 0


@pytest.mark.parametrize("fmt", ["vllm", "tokenspeed"])
def test_snapshot_then_replay_is_exactly_the_routers_state(rig, zctx, fmt):
    r = rig(fmt=fmt)
    live: dict = {}
    lora = {"lora_name": "ad1"} if fmt == "vllm" else {}
    send(r, stored([1, 2, 3], None, extra_keys=[["a"], None, [7]], **lora),
         stored([4, 5], 3))
    send(r, stored([10, 11], None, bs=4))
    send(r, vs.BlockRemoved(block_hashes=[2, 99], medium="GPU"))  # 3 stays, orphaned
    if fmt == "vllm":  # the same hash on another medium is another block
        send(r, stored([1], None, medium="CPU"), vs.BlockRemoved(block_hashes=[10], medium="CPU"))
    last = received_state(r, 4 if fmt == "vllm" else 3, live)

    s, snap = snapshot_state(zctx, r.replay_port, fmt)
    assert s == last, "the snapshot is consistent with the last published seq"
    assert snap == live
    assert len(snap) == (7 if fmt == "vllm" else 6)

    # Later batches: snapshot at S + replay from S+1 == everything seen.
    send(r, vs.AllBlocksCleared(), stored([20, 21], None))
    send(r, stored([22], 21), vs.BlockRemoved(block_hashes=[20], medium="GPU"))
    last = received_state(r, 2, live)
    for seq, p in replay_batches(r.replay(s + 1), fmt):
        apply(snap, p)
    assert snap == live
    s2, snap2 = snapshot_state(zctx, r.replay_port, fmt)
    assert s2 == last and snap2 == live


def test_snapshot_under_live_traffic_is_consistent_with_its_seq(rig, zctx):
    """A snapshot of ~20k blocks streams in many parts while the engine keeps
    storing and removing: snapshot(S) + replay(S+1..) == the live view."""
    r = rig(overrides={"events.buffer_steps": 100000})
    live: dict = {}
    n0 = 0
    for b in range(40):  # 20,000 blocks in chains of 500
        base = 1_000_000 * (b + 1)
        send(r, stored(list(range(base, base + 500)), None, bs=2))
        n0 += 1
    received_state(r, n0, live)

    rng = random.Random(7)
    stop = threading.Event()
    sent = [0]

    def traffic():
        k = 0
        while not stop.is_set():
            k += 1
            if rng.random() < 0.5:
                chain = 1_000_000 * rng.randint(1, 40)
                hs = [chain + rng.randint(0, 499) for _ in range(20)]
                send(r, vs.BlockRemoved(block_hashes=hs, medium="GPU"))
            else:
                send(r, stored([900_000_000 + k * 4 + i for i in range(4)], None, bs=2))
            sent[0] += 1
            time.sleep(0.0005)

    t = threading.Thread(target=traffic, daemon=True)
    t.start()
    try:
        time.sleep(0.05)
        replies = snapshot(zctx, r.replay_port)
    finally:
        stop.set()
        t.join()
    s, payloads = snapshot_batches(replies)
    assert len(payloads) > 4 * 2, "the snapshot came in several parts"
    snap: dict = {}
    for p in payloads:
        apply(snap, p, stored_only=True)
    received_state(r, sent[0], live)
    last = s
    for seq, p in replay_batches(r.replay(s + 1)):
        apply(snap, p)
        last = max(last, seq)
    assert snap == live
    # The indexer applies batches on its own thread, behind the live stream:
    # compare once a stats line says it has applied the last seq.
    st = r.sidecar.wait_stats("index", lambda x: x.get("snapshots", 0) >= 1
                              and str(x.get("seq")) == str(last), what=f"seq={last}")
    assert st["index_blocks"] == len(live)
    assert st["index_bytes"] > 0


def test_malformed_snapshot_request_is_ignored_and_counted(rig, zctx):
    r = rig()
    d = zctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(f"tcp://127.0.0.1:{r.replay_port}")
    d.send_multipart([b"", b"snapshot/2"])
    r.sidecar.wait_stats("replay_bridge", lambda x: x.get("rejected", 0) >= 1)
    assert not d.poll(100), "a malformed request got an answer"
    d.close(linger=0)
    assert snapshot(zctx, r.replay_port)[-1] == [b"", END_SEQ, b""]


def test_index_bound_counts_refused_blocks(rig, zctx):
    r = rig(overrides={"events.index_max_blocks": 10})
    send(r, stored(list(range(1, 16)), None))
    live: dict = {}
    received_state(r, 1, live)
    st = r.sidecar.wait_stats("index", lambda x: x.get("index_refused", 0) == 5)
    assert st["index_blocks"] == 10
    r.sidecar.wait_log(r"block index full \(10 blocks, events.index_max_blocks\)")
    _, snap = snapshot_state(zctx, r.replay_port)
    assert sorted(k[0] for k in snap) == list(range(1, 11))


# --- the real engines' publishers ----------------------------------------------------------


def _engine_sync(pub_send, sub: Subscriber, timeout=10.0) -> None:
    """Publishes empty warm-up batches through a real publisher until one
    comes out of the sidecar, then drains them."""
    deadline = time.monotonic() + timeout
    i = 0
    while not sub.socks[0].poll(20):
        pub_send(-1.0 - i)
        i += 1
        assert time.monotonic() < deadline, "no warm-up batch came through the sidecar"
    while sub.recv(0, 0.3) is not None:
        pass


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_real_publisher_blocks_come_back_in_a_snapshot(rig, zctx, engine):
    mod = real_engines.vllm_kv_events() if engine == "vllm" else real_engines.sglang_kv_events()
    r = rig(engine=False, start=False)
    pub = mod.ZmqEventPublisher(0, endpoint=f"tcp://*:{r.ingest_port}")
    try:
        r.start(sync=False)
        _engine_sync(lambda ts: pub.publish(mod.KVEventBatch(ts=ts, events=[])), r.sub)
        if engine == "vllm":
            events = [mod.BlockStored(block_hashes=[11, 12], parent_block_hash=None,
                                      token_ids=list(range(32)), block_size=16, lora_id=None,
                                      medium="GPU", lora_name="ad", extra_keys=[("ad",), None],
                                      group_idx=0, kv_cache_spec_kind="full_attention")]
        else:
            events = [mod.BlockStored(block_hashes=[11, 12], parent_block_hash=None,
                                      token_ids=list(range(32)), block_size=16, lora_id=None,
                                      medium="GPU", lora_name="ad")]
        events.append(mod.BlockStored(block_hashes=[13], parent_block_hash=12,
                                      token_ids=list(range(32, 48)), block_size=16,
                                      lora_id=None, medium="GPU", lora_name="ad"))
        pub.publish(mod.KVEventBatch(ts=5.0, events=events))
        live: dict = {}
        received_state(r, 1, live)
        _, snap = snapshot_state(zctx, r.replay_port)
        assert snap == live
        assert sorted(k[0] for k in snap) == [11, 12, 13]
        # vLLM's own decoder reads the snapshot (the published dialect).
        v = real_engines.vllm_kv_events()
        _, payloads = snapshot_batches(snapshot(zctx, r.replay_port))
        dec = msgspec.msgpack.Decoder(v.KVEventBatch)
        got = [e for p in payloads for e in dec.decode(p).events]
        assert [e.block_hashes for e in got] in ([[11, 12, 13]], [[11, 12], [13]])
        assert got[0].lora_name == "ad" and got[0].medium == "GPU"
        if engine == "vllm":
            assert got[0].extra_keys == [("ad",), None]
            assert got[0].group_idx == 0 and got[0].kv_cache_spec_kind == "full_attention"
    finally:
        pub.shutdown()


def thread_nice(sidecar) -> dict[str, list[int]]:
    """Nice value of each thread of the sidecar, by thread name."""
    out: dict[str, list[int]] = {}
    for name, nice in sidecar.threads():
        out.setdefault(name, []).append(nice)
    return out


@pytest.mark.parametrize("nice", [10, 0])
def test_replay_threads_run_at_replay_nice(rig, zctx, nice):
    """events.replay_nice lowers the replay bridge's thread and the replay
    context's I/O thread (so streaming yields the CPU to live publishing);
    every other thread keeps the process's priority."""
    # sidecar.io_nice = 0: the live I/O thread at the process's priority too
    # (its own test is in test_events_relay.py).
    r = rig(overrides={"events.replay_nice": nice, "sidecar.io_nice": 0})
    assert snapshot(zctx, r.replay_port)[-1] == [b"", END_SEQ, b""]  # streams
    threads = thread_nice(r.sidecar)
    assert threads["2/ZMQbg/IO/0"] == [nice], threads  # the replay context's I/O thread
    assert threads["replay_bridge:0"] == [nice], threads
    # Every thread outside the replay context and its bridge (the live
    # context's I/O thread, ingest, pub, index, the scheduler) keeps the
    # process's priority.
    others = {n: v for n, v in threads.items()
              if not n.startswith("2/ZMQbg/") and n != "replay_bridge:0"}
    assert {"ZMQbg/IO/0", "ingest:0", "pub:0", "index:0"} <= others.keys(), threads
    assert all(v == 0 for vs in others.values() for v in vs), sorted(threads.items())


# --- events.join_endpoint: the state, then live, for a router that replays only on a gap ----


def join_sub(ctx: zmq.Context, port: int) -> zmq.Socket:
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVHWM, 0)
    s.subscribe(b"")
    s.connect(f"tcp://127.0.0.1:{port}")
    return s


def follow_as_smg_relay(r, sub: zmq.Socket, until: int, state: dict) -> list[int]:
    """What smg-grpc-servicer's relay does with a stream: the first batch is
    its cursor, a seq going back is fatal, a gap is filled from the replay
    ROUTER from cursor + 1. Applies everything to `state` until seq `until`;
    returns the seqs that came on `sub` (not the replayed ones)."""
    cursor, seen = None, []
    while cursor is None or cursor < until:
        assert sub.poll(10_000), f"nothing on the join endpoint after seq {cursor}"
        _, seqb, payload = sub.recv_multipart()
        seq = int.from_bytes(seqb, "big")
        seen.append(seq)
        if cursor is not None:
            assert seq > cursor, f"seq went back from {cursor} to {seq}: the relay would resync"
            if seq > cursor + 1:
                for sq, p in replay_batches(r.replay(cursor + 1)):
                    if sq >= seq:
                        break
                    apply(state, p)
                    cursor = sq
                assert cursor == seq - 1, f"replay did not fill the gap before {seq}"
        apply(state, payload)
        cursor = seq
    return seen


def test_join_endpoint_gives_a_late_router_the_state_then_live(rig, zctx):
    """A router that subscribes to events.join_endpoint first gets the
    rank's blocks as BlockStored batches numbered up to the seq S they are
    consistent with, then the live batches; following it as smg's relay
    does (gap -> replay) ends with exactly the state of a router that saw
    everything, also while the engine keeps publishing. A second router on
    the same endpoint gets live only; once both left, the next one gets the
    state again."""
    from kvsidecar_harness import free_port_range
    port = free_port_range(1)
    r = rig(overrides={"events.join_endpoint": f"tcp://*:{port}"})
    live: dict = {}
    for b in range(30):  # 3,000 blocks: several snapshot batches
        base = 1_000_000 * (b + 1)
        send(r, stored(list(range(base, base + 100)), None, bs=2), ts=float(b))
    send(r, vs.BlockRemoved(block_hashes=[1_000_000 + 5, 2_000_000 + 99], medium="GPU"))
    last = received_state(r, 31, live)

    stop, sent = threading.Event(), [0]

    def traffic():
        k = 0
        while not stop.is_set() and k < 400:
            k += 1
            if k % 3 == 0:
                send(r, vs.BlockRemoved(block_hashes=[1_000_000 * (k % 30 + 1) + k % 100],
                                        medium="GPU"))
            else:
                send(r, stored([500_000_000 + k * 2, 500_000_000 + k * 2 + 1], None, bs=2))
            sent[0] += 1
            time.sleep(0.0005)

    t = threading.Thread(target=traffic, daemon=True)
    t.start()
    sub = join_sub(zctx, port)
    assert sub.poll(10_000), "nothing on the join endpoint"
    t.join()
    last = received_state(r, sent[0], live)
    snap: dict = {}
    seqs = follow_as_smg_relay(r, sub, last, snap)
    assert snap == live
    j = r.sidecar.wait_stats("join", lambda s: s["joins"] == 1 and s["subscribers"] == 1)
    k = j["snapshot_batches"]
    assert k > 1 and j["snapshot_blocks"] > 0, j
    assert seqs[:k] == list(range(seqs[0], seqs[0] + k)), "snapshot batches not contiguous"

    # A second router on the same endpoint: live only.
    other = join_sub(zctx, port)
    r.sidecar.wait_stats("join", lambda s: s["subscribers"] == 2)
    send(r, stored([777], None, bs=2), ts=9.0)
    new = received_state(r, 1, live)
    for s in (sub, other):
        assert s.poll(10_000)
        assert int.from_bytes(s.recv_multipart()[1], "big") == new
    assert r.sidecar.stats("join")["joins"] == 1

    # Both leave; the next router gets the state again.
    sub.close(linger=0)
    other.close(linger=0)
    r.sidecar.wait_stats("join", lambda s: s["subscribers"] == 0)
    again = join_sub(zctx, port)
    r.sidecar.wait_stats("join", lambda s: s["joins"] == 2)
    send(r, stored([778], None, bs=2), ts=10.0)
    newest = received_state(r, 1, live)
    state: dict = {}
    follow_as_smg_relay(r, again, newest, state)
    assert state == live
    assert r.sidecar.wait_stats("join", lambda s: s["joins"] == 2)["dropped"] == 0
    again.close(linger=0)
