"""NVIDIA Dynamo's standalone KV indexer (ai-dynamo-runtime, `python -m
dynamo.indexer`) as the router, vLLM 0.33's own ZmqEventPublisher as the
engine, kvsidecar between them.

The indexer subscribes to kvsidecar's PUB and, on a gap (including a first
batch with seq > 0), asks kvsidecar's replay ROUTER for the missed batches
(vLLM's replay protocol; it cannot use snapshots). /query hashes token ids
into Dynamo's own block hashes, so a block counts when its BlockStored
carried its tokens.
"""

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import zmq

import real_engines
from kvsidecar_harness import free_port_range, wait_until

pytest.importorskip("dynamo.llm", reason="ai-dynamo-runtime is not installed "
                    "(tests/integration/requirements.txt)")

BS = 16
MODEL = "m"


class DynamoIndexer:
    def __init__(self, logdir):
        self.port = free_port_range(1)
        self.log = open(logdir / f"dynamo-indexer-{self.port}.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "dynamo.indexer", "--port",
                                      str(self.port), "--threads", "1"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(self._healthy, 30, "dynamo indexer /health")

    def _call(self, path, body=None):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def _healthy(self):
        assert self.proc.poll() is None, "dynamo indexer exited"
        try:
            return self._call("/health")[0] == 200
        except OSError:
            return False

    def register(self, pub_port, replay_port):
        code, body = self._call("/register", {
            "instance_id": 1, "endpoint": f"tcp://127.0.0.1:{pub_port}",
            "replay_endpoint": f"tcp://127.0.0.1:{replay_port}", "model_name": MODEL,
            "block_size": BS, "dp_rank": 0})
        assert code == 201, body

    def matched(self, tokens) -> int:
        """Tokens of `tokens` worker 1 / rank 0 holds as a prefix."""
        code, body = self._call("/query", {"token_ids": tokens, "model_name": MODEL})
        assert code == 200, body
        return body["scores"].get("1", {}).get("0", 0)

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


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
