"""vLLM 0.34.0's own KV event structs and ZmqEventPublisher (read out of its
wheel by tests/tools/engine_wheels.py, next to 0.33's) in front of kvsidecar.

0.34's vllm/distributed/kv_events.py is byte-identical to 0.33's: same
structs, fields, defaults and msgspec options. What 0.34 changes is which
shapes it puts on that wire:
  - the offloading connector's recurrent (Mamba) groups: a BlockStored with
    one hash (the chunk's last), its parent, token_ids=[], the group's
    block_size and kv_cache_spec_kind="mamba" (offloading/events.py);
  - the offloading placeholder (block_size=0, token_ids=[]) kept for
    windowed groups;
  - kv_cache_report_mode="full" (as in 0.33): prefix-cache hits re-announce
    BlockStored for hashes already stored, with the reusing request's
    session_id; no extra BlockRemoved comes for them.

Checked: the relayed payloads are the engine's own bytes (and what 0.33's
decoder/encoder round-trips to), nothing is dropped, re-announced blocks are
indexed once (and one BlockRemoved removes them), and a snapshot holds each
block once. Skipped without build-wheels/vllm-0.34.0-*.whl
(scripts/install-deps.sh --with-python downloads it).
"""


import msgspec
import pytest
import zmq

import vllm_structs as vs  # puts tests/tools on sys.path
from kvsidecar_harness import EventsRig, read_replay, replay_batches, warm_up_publisher

import engine_wheels  # noqa: E402

VERSION = "0.34.0"
try:
    v34 = engine_wheels.load("vllm", VERSION)
except engine_wheels.WheelMissing as e:
    pytest.skip(f"vLLM {VERSION} wheel not in build-wheels/ ({e})", allow_module_level=True)

H = 0xFEDCBA9876543210
A, B, C = H + 1, H + 2, H + 3
M = (1 << 64) - 5  # the Mamba state checkpoint (u64 top range)
P = 77  # an offloading placeholder's hash
BS = 4


def toks(hashes):
    return [(h % 1000) * 10 + j for h in hashes for j in range(BS)]


def stored_gpu(hashes, session):
    """kv_cache_manager/block_pool's BlockStored (cache_full_blocks and, in
    "full" report mode, emit_cached_block_events: the same shape)."""
    return v34.BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=toks(hashes),
                           block_size=BS, lora_id=None, medium=v34.MEDIUM_GPU, lora_name=None,
                           extra_keys=[("tenant-a",)] + [None] * (len(hashes) - 1),
                           group_idx=0, session_id=session)


def stored_mamba():
    """offloading/events.py _as_state_checkpoint: the last hash only, chained
    to the one before, no tokens, the group's block size."""
    return v34.BlockStored(block_hashes=[M], parent_block_hash=C, token_ids=[], block_size=BS,
                           lora_id=None, medium=v34.MEDIUM_CPU, lora_name=None, extra_keys=None,
                           group_idx=1, kv_cache_spec_kind="mamba", locality="LOCAL")


def stored_placeholder():
    """offloading/events.py _placeholder_stored (windowed attention groups)."""
    return v34.BlockStored(block_hashes=[P], parent_block_hash=None, token_ids=[], lora_id=None,
                           block_size=0, medium=v34.MEDIUM_CPU, lora_name=None, group_idx=2,
                           kv_cache_spec_kind="sliding_window",
                           kv_cache_spec_sliding_window=4096, locality=None, ownership=None)


# (batch events, index_blocks once applied): (hash, medium, group) keys.
STEPS = [
    ([stored_gpu([A, B, C], "sess-a")], 3),
    ([stored_gpu([A, B, C], "sess-b")], 3),  # "full": the whole hit re-announced
    ([stored_gpu([A, B], "sess-c")], 3),  # "full": a shorter hit
    ([stored_mamba(), stored_placeholder()], 5),
    ([stored_mamba()], 5),  # the same checkpoint offloaded again
    ([v34.BlockRemoved(block_hashes=[A], medium=v34.MEDIUM_GPU, group_idx=0)], 4),
    ([v34.BlockRemoved(block_hashes=[M], medium=v34.MEDIUM_CPU, group_idx=1)], 3),
]


def snapshot_hashes(ctx, port) -> list[tuple]:
    """Every (hash, medium, group, token_ids, session_id) a snapshot
    carries, duplicates kept."""
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(f"tcp://127.0.0.1:{port}")
    try:
        d.send_multipart([b"", b"snapshot/1"])
        replies = read_replay(d, "vllm", 20.0)
    finally:
        d.close(linger=0)
    out = []
    for _, p in replay_batches(replies):
        for e in msgspec.msgpack.decode(p)[1]:
            assert e["type"] == "BlockStored", e
            bs = e["block_size"]
            for i, h in enumerate(e["block_hashes"]):
                t = tuple(e["token_ids"][i * bs:(i + 1) * bs]) if bs else ()
                out.append((h, e.get("medium"), e.get("group_idx"), t, e.get("session_id")))
    return out


@pytest.fixture
def rig034(zctx, tmp_path):
    r = EventsRig(zctx, tmp_path, engine=False)
    pub = None
    try:
        # vLLM's default: bind tcp://*:PORT (+ rank); the sidecar connects.
        pub = v34.ZmqEventPublisher(data_parallel_rank=0, endpoint=f"tcp://*:{r.ingest_port}")
        r.start(sync=False)
        r.base[0] = warm_up_publisher(pub, lambda ts: v34.KVEventBatch(ts=ts, events=[]), r.sub)
        r.ingested[0] = r.base[0] - 1
        yield r, pub
    finally:
        if pub is not None:
            pub.shutdown()
        r.close()


def test_vllm034_shapes_pass_through_and_index_once(rig034, zctx):
    r, pub = rig034
    assert v34.ENGINE_VERSION == VERSION and v34.__file__.startswith(f"vllm-{VERSION}-")
    dec33 = msgspec.msgpack.Decoder(vs.KVEventBatch)  # 0.33's own types
    dec34 = msgspec.msgpack.Decoder(v34.KVEventBatch)
    for n, (events, want_blocks) in enumerate(STEPS):
        b = v34.KVEventBatch(ts=1757600000.25 + n, events=events)
        pub.publish(b)  # fills in data_parallel_rank
        (m,) = r.sub.recv_n(1, 0)
        want = msgspec.msgpack.encode(b)  # 0.34's encoder: what it put on the wire
        assert m.seq == r.base[0] + n
        assert m.payload == want, f"step {n}: got {m.payload.hex()} want {want.hex()}"
        assert dec34.decode(m.payload) == b
        assert msgspec.msgpack.encode(dec33.decode(m.payload)) == want  # same wire as 0.33
        st = r.sidecar.wait_stats("index", lambda x, s=m.seq: str(x.get("seq")) == str(s),
                                  what=f"seq={m.seq}")
        assert st["index_blocks"] == want_blocks, (n, st)
        assert st["index_refused"] == 0, st

    ing = r.sidecar.wait_stats("ingest", lambda s: s["published"] >= r.ingested[0] + len(STEPS))
    assert ing["published"] == r.ingested[0] + len(STEPS), ing
    assert ing["dropped_events"] == 0 and ing["bad_payloads"] == 0, ing
    assert ing["lost"] == 0 and ing["gaps"] == 0, ing

    # Each block once; the re-announces' latest session wins for B (C was
    # only re-announced by sess-b); P keeps its empty tokens.
    snap = snapshot_hashes(zctx, r.replay_port)
    assert sorted(snap) == sorted([
        (B, "GPU", 0, tuple(toks([B])), "sess-c"),
        (C, "GPU", 0, tuple(toks([C])), "sess-b"),
        (P, "CPU", 2, (), None),
    ]), snap

    # And the replay service keeps the engine's bytes.
    kept = replay_batches(r.replay(r.base[0]))
    assert [p for _, p in kept] == [msgspec.msgpack.encode(
        v34.KVEventBatch(ts=1757600000.25 + n, events=ev, data_parallel_rank=0))
        for n, (ev, _) in enumerate(STEPS)]


def test_vllm034_mamba_checkpoint_in_snapshot(rig034, zctx):
    """A Mamba BlockStored (one hash, token_ids=[], block_size>0) comes back
    from a snapshot as it went in."""
    r, pub = rig034
    b = v34.KVEventBatch(ts=1757600100.5, events=[stored_gpu([A, B, C], "sess-a"),
                                                   stored_mamba()])
    pub.publish(b)
    (m,) = r.sub.recv_n(1, 0)
    assert m.payload == msgspec.msgpack.encode(b)
    r.sidecar.wait_stats("index", lambda x: str(x.get("seq")) == str(m.seq) and
                         x["index_blocks"] == 4, what="4 blocks")
    snap = snapshot_hashes(zctx, r.replay_port)
    assert (M, "CPU", 1, (), None) in snap, snap
    assert len(snap) == 4, snap
    # The ingest's stats line that counts this batch (it may not be written yet).
    ing = r.sidecar.wait_stats("ingest", lambda s: s["published"] >= r.ingested[0] + 1)
    assert ing["dropped_events"] == 0 and ing["bad_payloads"] == 0, ing
