"""vllm-router 0.1.17 (PyPI, the vLLM project's Rust load balancer) as the
router, vLLM 0.33's own ZmqEventPublisher as each engine, one kvsidecar per
engine between them (issue 26).

Two workers, A and B: small HTTP stubs that answer /health and
/v1/completions with their own name, so which one served a request is what
the router decided. The router runs `--policy kv_aware` with each worker's
events from its sidecar: `--kv-event-source URL=tcp://<sidecar PUB>` and
`--kv-event-replay-source URL=tcp://<sidecar replay>`. It hashes token ids
itself (block hashes only chain and remove) and credits whole blocks up to
len(prompt) - 1 tokens, so a prompt of 4 blocks + 1 token credits 64 tokens
on a worker that holds its 4 blocks. Its debug log names the decision
(`KV prefix decision … worker=… credited_prefix_tokens=N`) and every
applied seq (`kv_index live|replay sequence advanced source=URL rank=0
seq=N`): the tests wait on those, and on which stub got the request.

Base state of every test: A holds the prompt's 4 blocks, B its first 2, so
A wins (64 vs 32 credited tokens) and B wins once A lost them.
"""

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgspec
import pytest
import zmq

import router_common as rc
from kvsidecar_harness import free_port_range, wait_until

pytest.importorskip("vllm_router", reason="vllm-router is not installed "
                    "(tests/integration/requirements.txt)")

MODEL = "m"
PROMPT = rc.tokens(1000, 4)      # A holds all 4 blocks, B the first 2
OTHER = rc.tokens(5000, 3)       # stored by A later in some tests
_DECISION = re.compile(r'KV prefix decision .*?worker="([^"]+)".*?credited_prefix_tokens=(\d+)')


class StubWorker:
    """An OpenAI-compatible worker without a model: /health answers 200,
    /v1/completions answers with this worker's name as the text."""

    def __init__(self, name: str):
        self.name = name
        self.requests: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, obj):
                body = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path.startswith("/v1/models"):
                    return self._reply({"object": "list", "data": [
                        {"id": MODEL, "object": "model", "owned_by": "stub"}]})
                self._reply({"status": "ok"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                stub.requests.append(body)
                self._reply({"id": "c", "object": "text_completion", "created": 0,
                             "model": MODEL, "choices": [{"index": 0, "text": stub.name,
                                                          "finish_reason": "stop",
                                                          "logprobs": None}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                       "total_tokens": 2}})

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class VllmRouter:
    def __init__(self, tmp_path, sides: dict[StubWorker, rc.EngineSide], n: int = 0):
        self.port = free_port_range(1)
        self.metrics_port = free_port_range(1)
        self.workers = list(sides)
        argv = rc.python_module("vllm_router.launch_router") + [
            "--host", "127.0.0.1", "--port", str(self.port),
            "--worker-urls", *[w.url for w in self.workers],
            "--policy", "kv_aware",
            "--kv-event-block-size", str(rc.BS), "--kv-event-model", MODEL,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
            "--health-check-interval-secs", "3600", "--log-level", "debug"]
        for w, side in sides.items():
            argv += ["--kv-event-source", f"{w.url}={side.pub_endpoint}",
                     "--kv-event-replay-source", f"{w.url}={side.replay_endpoint}"]
        self.proc = rc.Proc(argv, tmp_path / f"vllm-router-{n}.log")
        try:
            wait_until(self._ready, rc.DEADLINE, "vllm-router ready", interval=0.1)
        except AssertionError:
            raise AssertionError(f"vllm-router never became ready:\n{self.proc.tail()}") from None

    def _ready(self):
        assert self.proc.alive(), f"vllm-router exited:\n{self.proc.tail()}"
        return "Router ready" in self.proc.text() and rc.scrape(self.metrics_port) is not None

    def applied_seq(self, worker: StubWorker) -> int:
        """The last seq the router applied for worker's source (-1: none)."""
        rx = re.compile(r"sequence advanced source=" + re.escape(worker.url) + r" rank=0 seq=(\d+)")
        seqs = [int(m.group(1)) for m in rx.finditer(self.proc.text())]
        return max(seqs, default=-1)

    def replayed(self, worker: StubWorker) -> list[int]:
        rx = re.compile(r"kv_index replay sequence advanced source=" + re.escape(worker.url)
                        + r" rank=0 seq=(\d+)")
        return [int(m.group(1)) for m in rx.finditer(self.proc.text())]

    def route(self, prompt: list[int]) -> tuple[str, int]:
        """Sends a completion request with token-id prompt: (the stub that
        served it, the tokens the router credited to that stub)."""
        before = len(_DECISION.findall(self.proc.text()))
        code, body = rc.http_json(f"http://127.0.0.1:{self.port}/v1/completions",
                                  json.dumps({"model": MODEL, "prompt": prompt,
                                              "max_tokens": 1}).encode())
        assert code == 200, f"vllm-router answered {code}: {body[:300]!r}"
        served = json.loads(body)["choices"][0]["text"]
        decisions = wait_until(lambda: (d := _DECISION.findall(self.proc.text()))[before:] and d,
                               rc.DEADLINE, "the router's decision log line")
        url, credited = decisions[before]
        assert url == next(w.url for w in self.workers if w.name == served), (url, served)
        return served, int(credited)

    def lookups(self, result: str) -> float:
        return rc.metric(rc.scrape(self.metrics_port), "vllm_router_kv_placement_lookups_total",
                         result=result)

    def close(self):
        self.proc.close()


@pytest.fixture
def setup(rig, tmp_path):
    """(router factory, {name: (stub, engine side)}): A and B, each with its
    engine and sidecar; the router is started by the test (late joins)."""
    made, stubs, sides = [], [], []

    def side(overrides=None):
        s = rc.EngineSide(rig, overrides)
        sides.append(s)
        return s

    a, b = StubWorker("A"), StubWorker("B")
    stubs += [a, b]
    # A small PUB high-water mark on A's sidecar, so that a stalled router
    # misses batches (and must replay them) after a short burst.
    env = {"A": (a, side({"events.hwm": 20})), "B": (b, side())}

    def router():
        r = VllmRouter(tmp_path, {a: env["A"][1], b: env["B"][1]}, len(made))
        made.append(r)
        return r

    yield router, env
    for r in made:
        r.close()
    for s in sides:
        s.close()
    for st in stubs:
        st.close()


def sync(router: VllmRouter, stub: StubWorker, side: rc.EngineSide) -> None:
    """Until the router has applied a batch published now on side (and so
    everything before it: a gap makes it replay first)."""
    seq = side.publish()
    side.publish_until(lambda: router.applied_seq(stub) >= seq,
                       f"vllm-router to apply seq {seq} of worker {stub.name}")


def base_state(router, env):
    (a, ea), (b, eb) = env["A"], env["B"]
    v = ea.v
    ea.publish(rc.stored(v, PROMPT, 1))                 # hashes 1..4
    eb.publish(rc.stored(v, PROMPT[:2 * rc.BS], 101))   # hashes 101..102
    sync(router, a, ea)
    sync(router, b, eb)


def test_vllm_router_routes_to_the_worker_holding_the_blocks(setup):
    make, env = setup
    router = make()
    base_state(router, env)
    hits = router.lookups("hit")
    assert router.route(PROMPT + [7]) == ("A", 64)
    # The router's own count of that placement lookup: a hit.
    assert router.lookups("hit") == hits + 1


def test_vllm_router_stops_routing_to_removed_and_cleared_blocks(setup):
    make, env = setup
    router = make()
    (a, ea), _ = env["A"], env["B"]
    v = ea.v
    base_state(router, env)
    assert router.route(PROMPT + [7]) == ("A", 64)
    # BlockRemoved of A's blocks 2..4 (the router removes by block hash).
    ea.publish(rc.removed(v, [2, 3, 4]))
    sync(router, a, ea)
    assert router.route(PROMPT + [7]) == ("B", 32)
    # A stores them again, then AllBlocksCleared.
    ea.publish(rc.stored(v, PROMPT[rc.BS:], 2, parent=1))
    sync(router, a, ea)
    assert router.route(PROMPT + [7]) == ("A", 64)
    ea.publish(rc.cleared(v))
    sync(router, a, ea)
    assert router.route(PROMPT + [7]) == ("B", 32)


def test_vllm_router_drops_a_restarted_engines_blocks(setup):
    make, env = setup
    router = make()
    (a, ea), _ = env["A"], env["B"]
    v = ea.v
    base_state(router, env)
    assert router.route(PROMPT + [7]) == ("A", 64)
    # A's engine dies and restarts: seq from 0, an empty cache, no
    # BlockRemoved for the old blocks. The sidecar fences (AllBlocksCleared)
    # before the new engine's first batch, under its own unbroken seq.
    ea.restart_engine()
    ea.publish(rc.stored(v, OTHER, 201))
    sync(router, a, ea)
    assert router.route(OTHER + [7]) == ("A", 48)
    assert router.route(PROMPT + [7]) == ("B", 32), \
        "vllm-router still routes to the dead engine's blocks"


def test_vllm_router_stalled_repairs_the_gap_from_the_sidecar_replay(setup):
    make, env = setup
    router = make()
    (a, ea), _ = env["A"], env["B"]
    base_state(router, env)
    before = router.applied_seq(a)
    # The router is frozen; the engine goes on: big state-neutral batches
    # until the sidecar's PUB drops for the router, then the changes that
    # matter, dropped too (its pipe is full). The next live batch shows the
    # gap; the router replays it from the sidecar.
    rc.stall_until_gap(
        ea, router.proc, "the stalled vllm-router",
        converged=lambda _k, last: ea.publish_until(
            lambda: router.applied_seq(a) >= last, "vllm-router to catch up after the stall",
            timeout=60),
        gapped=lambda: any(s > before for s in router.replayed(a)))
    # It ends with the engine's state: the removed chains are gone, the new one is there.
    assert router.route(OTHER + [7]) == ("A", 48)
    assert router.route(PROMPT + [7]) == ("B", 32)


def test_vllm_router_started_late_replays_the_engines_state(setup):
    make, env = setup
    (a, ea), (b, eb) = env["A"], env["B"]
    v = ea.v
    # The engines publish before any router runs: stores, a removal, a
    # second chain and its removal. Only the sidecars' replay buffers hold it.
    ea.publish(rc.stored(v, PROMPT, 1))
    ea.publish(rc.stored(v, OTHER, 201))
    ea.publish(rc.removed(v, [201, 202, 203]))
    eb.publish(rc.stored(v, PROMPT[:2 * rc.BS], 101))
    router = make()
    # Its first live batch has seq > 0: it replays from 0 from the sidecar.
    sync(router, a, ea)
    sync(router, b, eb)
    assert router.replayed(a) and min(router.replayed(a)) == 0, \
        "vllm-router did not replay A's history from seq 0"
    assert router.route(PROMPT + [7]) == ("A", 64)
    misses = router.lookups("miss")
    served, credited = router.route(OTHER + [7])
    assert credited == 0, f"{served} was credited {credited} tokens of a removed chain"
    assert router.lookups("miss") == misses + 1


class _RankSide:
    """One DP rank of an engine behind a shared sidecar, as VllmRouter sees
    a worker's event source: that rank's PUB and replay ports (+r)."""

    def __init__(self, rig, rank: int):
        self.rig, self.rank = rig, rank

    @property
    def pub_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.rig.pub_port + self.rank}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.rig.replay_port + self.rank}"


def test_vllm_router_two_workers_from_one_sidecar_with_two_dp_ranks(rig, tmp_path):
    """One engine with two DP ranks behind one sidecar (events.dp_size = 2),
    each rank a worker of vllm-router (--kv-event-source at the rank's port,
    +r). vllm-router reads only rank 0 from a source, so rank 1's batches
    (data_parallel_rank 1) would be dropped without a word; with
    events.published_dp_rank = "zero" every rank's endpoint says 0 (checked
    on the wire) and rank 1's blocks are credited to its worker."""
    v = rc.vllm()
    r = rig(engine=False, start=False, dp_size=2,
            overrides={"events.published_dp_rank": "zero"})
    pubs = []

    def make(rank):
        def bind():
            try:
                # vLLM's publisher offsets the port by its rank itself.
                return v.ZmqEventPublisher(rank, endpoint=f"tcp://*:{r.ingest_port}")
            except zmq.ZMQError as e:
                if e.errno != zmq.EADDRINUSE:
                    raise
                return None
        return wait_until(bind, rc.DEADLINE, f"rank {rank}'s port free", interval=0.05)
    pubs = [make(0), make(1)]
    r.start(sync=False)
    ts = [0.0]

    def publish(rank, *events) -> int:
        """Publishes one batch on `rank`; the seq the sidecar gave it, read
        back on our subscriber (which also checks the dp_rank it carries)."""
        ts[0] += 1
        mine = ts[0]
        deadline = time.monotonic() + rc.DEADLINE
        while True:
            pubs[rank].publish(v.KVEventBatch(ts=mine, events=list(events)))
            got_deadline = time.monotonic() + 0.3
            while time.monotonic() < got_deadline:
                m = r.sub.recv(rank, 0.1)
                if m is None:
                    continue
                body = msgspec.msgpack.decode(m.payload)
                if body[0] == mine:
                    assert body[2] == 0, f"rank {rank} published with data_parallel_rank {body[2]}"
                    return m.seq
            # Not joined yet (slow joiner): send it again, under a new ts.
            assert time.monotonic() < deadline, r.sidecar.tail()
            ts[0] += 1
            mine = ts[0]

    publish(0)
    publish(1)
    a, b = StubWorker("A"), StubWorker("B")
    router = None
    try:
        router = VllmRouter(tmp_path, {a: _RankSide(r, 0), b: _RankSide(r, 1)})

        def sync_rank(stub, rank):
            seq = publish(rank)
            deadline = time.monotonic() + rc.DEADLINE
            while router.applied_seq(stub) < seq:
                assert time.monotonic() < deadline, (
                    f"vllm-router never applied seq {seq} of rank {rank}:\n{router.proc.tail()}")
                seq = max(seq, publish(rank))
        publish(0, rc.stored(v, PROMPT, 1))                # rank 0 (A): all 4 blocks
        publish(1, rc.stored(v, PROMPT[:2 * rc.BS], 101))  # rank 1 (B): the first 2
        sync_rank(a, 0)
        sync_rank(b, 1)
        assert router.route(PROMPT + [7]) == ("A", 64)
        publish(0, rc.removed(v, [1, 2, 3, 4]))
        sync_rank(a, 0)
        # Rank 1's blocks are B's: credited although its batches come from rank 1.
        assert router.route(PROMPT + [7]) == ("B", 32)
    finally:
        if router is not None:
            router.close()
        a.close()
        b.close()
        for p in pubs:
            p.shutdown()
