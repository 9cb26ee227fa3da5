"""NVIDIA Dynamo's standalone KV indexer (ai-dynamo-runtime, `python -m
dynamo.indexer`) as the router, vLLM 0.33's own ZmqEventPublisher as the
engine, kvsidecar between them.

The indexer subscribes to kvsidecar's PUB and, on a gap (including a first
batch with seq > 0), asks kvsidecar's replay ROUTER for the missed batches
(vLLM's replay protocol; it cannot use snapshots). /query hashes token ids
into Dynamo's own block hashes, so a block counts when its BlockStored
carried its tokens.
"""

import time

import pytest
import zmq

import dynamo_indexer
import real_engines
from kvsidecar_harness import wait_until

pytest.importorskip("dynamo.llm", reason="ai-dynamo-runtime is not installed "
                    "(tests/integration/requirements.txt)")

BS = 16
MODEL = "m"


class DynamoIndexer(dynamo_indexer.DynamoIndexer):
    def __init__(self, logdir):
        super().__init__(logdir, BS, MODEL)


@pytest.fixture
def dynamo(tmp_path):
    made = []

    def make():
        d = DynamoIndexer(tmp_path)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


def chain(v, first_token, n, parent=None, first_hash=1):
    tokens = list(range(first_token, first_token + n * BS))
    return tokens, v.BlockStored(block_hashes=list(range(first_hash, first_hash + n)),
                                 parent_block_hash=parent, token_ids=tokens, block_size=BS,
                                 lora_id=None, medium="GPU", lora_name=None)


def new_publisher(v, port):
    """vLLM's publisher on `port`; a restarted one retries while the old
    socket is still being closed (address in use)."""
    def make():
        try:
            return v.ZmqEventPublisher(0, endpoint=f"tcp://*:{port}")
        except zmq.ZMQError as e:
            if e.errno != zmq.EADDRINUSE:
                raise
            return None
    return wait_until(make, 10, f"port {port} free for the restarted engine", interval=0.05)


def publish_until(pub, v, cond, what, timeout=20.0):
    """Publishes empty batches (each one a new seq) until cond() holds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        pub.publish(v.KVEventBatch(ts=time.time(), events=[]))
        time.sleep(0.05)


def test_dynamo_started_late_recovers_the_blocks_from_the_sidecar(rig, dynamo):
    v = real_engines.vllm_kv_events()
    r = rig(engine=False, start=False)
    pub = v.ZmqEventPublisher(0, endpoint=f"tcp://*:{r.ingest_port}")
    try:
        r.start(sync=False)
        tokens, ev = chain(v, 1000, 4)
        # Until the sidecar has it (its SUB joined): then Dynamo is late.
        publish_until(pub, v, lambda: r.sub.recv(0, 0.0) is not None, "the sidecar's first batch")
        pub.publish(v.KVEventBatch(ts=time.time(), events=[ev]))
        r.sidecar.wait_stats("index", lambda s: s.get("index_blocks", 0) == 4)
        d = dynamo()
        d.register(r.pub_port, r.replay_port)
        # Its first live batch has seq > 0: it replays 0.. from the sidecar.
        publish_until(pub, v, lambda: d.matched(tokens) == 4 * BS, "Dynamo to hold the blocks")
    finally:
        pub.shutdown()


def test_dynamo_drops_a_restarted_engines_blocks(rig, dynamo):
    v = real_engines.vllm_kv_events()
    r = rig(engine=False, start=False)
    d = dynamo()
    pub = v.ZmqEventPublisher(0, endpoint=f"tcp://*:{r.ingest_port}")
    old_tokens, old = chain(v, 1000, 3)
    new_tokens, new = chain(v, 5000, 2, first_hash=100)
    try:
        r.start(sync=False)
        d.register(r.pub_port, r.replay_port)
        # Re-published until Dynamo's SUB has joined (storing twice is harmless).
        publish_until_stored = lambda: d.matched(old_tokens) == 3 * BS  # noqa: E731
        deadline = time.monotonic() + 20
        while not publish_until_stored():
            assert time.monotonic() < deadline, "Dynamo never got the first engine's blocks"
            pub.publish(v.KVEventBatch(ts=time.time(), events=[old]))
            time.sleep(0.1)
        # The engine runs on a while (seq 1..5) before it dies.
        for _ in range(5):
            pub.publish(v.KVEventBatch(ts=time.time(), events=[]))
        r.sidecar.wait_stats("ingest", lambda s: s.get("received", 0) >= 6)
    finally:
        pub.shutdown()
    # The engine restarts: a new publisher, seq from 0, nothing of the old
    # cache left (no BlockRemoved ever comes for the old blocks).
    pub = new_publisher(v, r.ingest_port)
    try:
        deadline = time.monotonic() + 20
        while d.matched(new_tokens) != 2 * BS:
            assert time.monotonic() < deadline, "Dynamo never got the new engine's blocks"
            pub.publish(v.KVEventBatch(ts=time.time(), events=[new]))
            time.sleep(0.1)
        assert d.matched(old_tokens) == 0, "Dynamo still routes to the dead engine's blocks"
    finally:
        pub.shutdown()


def test_dynamo_after_a_sidecar_restart_with_seq_start_clock(tmp_path, dynamo):
    """The sidecar itself restarts (same ports, the engine keeps running).
    Dynamo's indexer drops every batch whose seq is not above the last one
    it saw, the new sidecar's fence included: with events.seq_start = "zero"
    it would keep the old blocks (and miss new ones until the new seq passed
    the old); with "clock" the new seq is above the old at once, so the fence
    clears the stale blocks and the new ones arrive."""
    seq_start = "clock"
    from kvsidecar_harness import Sidecar, free_port_range
    v = real_engines.vllm_kv_events()
    ingest, pub_port, rep = free_port_range(1), free_port_range(1), free_port_range(1)
    o = {"cache.enabled": False, "sidecar.stats_interval": "200ms",
         "events.seq_start": seq_start,
         "events.ingest_endpoint": f"tcp://127.0.0.1:{ingest}",
         "events.endpoint": f"tcp://*:{pub_port}", "events.replay_endpoint": f"tcp://*:{rep}"}
    pub = v.ZmqEventPublisher(0, endpoint=f"tcp://*:{ingest}")
    s1 = Sidecar(tmp_path / "s1", o, name="s1").start()
    s2 = None
    try:
        d = dynamo()
        d.register(pub_port, rep)
        old_tokens, old = chain(v, 1000, 3)
        deadline = time.monotonic() + 20
        while d.matched(old_tokens) != 3 * BS:
            assert time.monotonic() < deadline, "Dynamo never got the first blocks"
            pub.publish(v.KVEventBatch(ts=time.time(), events=[old]))
            time.sleep(0.1)
        for _ in range(20):  # the first sidecar's seq runs on a while
            pub.publish(v.KVEventBatch(ts=time.time(), events=[]))
        s1.wait_stats("ingest", lambda s: s.get("received", 0) >= 21)
        s1.stop(timeout=10)
        s2 = Sidecar(tmp_path / "s2", o, name="s2").start()
        new_tokens, new = chain(v, 5000, 2, first_hash=100)
        deadline = time.monotonic() + 20
        while d.matched(new_tokens) != 2 * BS:
            assert time.monotonic() < deadline, "Dynamo never got the new sidecar's blocks"
            pub.publish(v.KVEventBatch(ts=time.time(), events=[new]))
            time.sleep(0.1)
        # The fence went out before the new blocks, and Dynamo applied it.
        assert d.matched(old_tokens) == 0, "the new sidecar's fence did not clear them"
    finally:
        pub.shutdown()
        for s in (s1, s2):
            if s is not None and s.proc is not None and s.proc.poll() is None:
                s.stop(timeout=10)
