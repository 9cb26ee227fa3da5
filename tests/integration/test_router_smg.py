"""smg 1.13.0 (the Shepherd Model Gateway, PyPI) as the router, vLLM 0.33's
own ZmqEventPublisher as each engine, one kvsidecar per engine between them
(issue 26).

smg takes KV events only from gRPC workers: it streams SubscribeKvEvents
from each `grpc://` worker, and the worker-side relay (smg-grpc-servicer
0.14.1, `smg_grpc_servicer.kv_relay.relay`, what its vLLM servicer runs)
subscribes to a ZMQ PUB and replay ROUTER: here kvsidecar's, in place of
the engine's. The workers are router_smg_worker.py stubs: the real relay,
a word-level tokenizer (`w<N>` is token N) and a Generate that records
which worker got the request. The gateway runs `--policy cache_aware
--block-size 16`; its Prometheus metrics `smg_kv_index_blocks{worker}`,
`smg_kv_event_gaps_total{outcome}` and `smg_kv_event_resyncs_total{reason}`
are what the tests wait on and check, with which worker served a prompt.

Base state of every test: A holds the prompt's 4 blocks, B its first 2.
"""

import json
import re
import sys
from pathlib import Path

import pytest

import router_common as rc
from kvsidecar_harness import free_port_range, wait_until

pytest.importorskip("smg", reason="smg is not installed (tests/integration/requirements.txt)")
pytest.importorskip("smg_grpc_servicer.kv_relay", reason="smg-grpc-servicer is not installed "
                    "(tests/integration/requirements.txt)")

from router_smg_worker import write_tokenizer  # noqa: E402

WORKER_SCRIPT = Path(__file__).with_name("router_smg_worker.py")
PROMPT = rc.tokens(1000, 4)
OTHER = rc.tokens(5000, 3)


def text(toks: list[int]) -> str:
    return " ".join(f"w{t}" for t in toks)


class Worker:
    def __init__(self, tmp_path: Path, name: str, side: rc.EngineSide, tokenizer: Path,
                 events: str | None = None):
        self.name = name
        self.port = free_port_range(1)
        self.url = f"grpc://127.0.0.1:{self.port}"
        self.record = tmp_path / f"smg-worker-{name}.jsonl"
        self.record.touch()
        self.proc = rc.Proc([sys.executable, str(WORKER_SCRIPT), "--port", str(self.port),
                             "--name", name, "--events", events or side.pub_endpoint,
                             "--replay", side.replay_endpoint, "--record", str(self.record),
                             "--tokenizer", str(tokenizer)],
                            tmp_path / f"smg-worker-{name}.log")
        wait_until(lambda: self._serving(), rc.DEADLINE, f"stub worker {name} serving")

    def _serving(self):
        assert self.proc.alive(), f"stub worker {self.name} exited:\n{self.proc.tail()}"
        return "serving on" in self.proc.text()

    def served(self) -> int:
        return len(self.record.read_text().splitlines())

    def close(self):
        self.proc.close()


class Smg:
    def __init__(self, tmp_path: Path, workers: list[Worker], n: int = 0):
        self.port = free_port_range(1)
        self.metrics_port = free_port_range(1)
        self.workers = workers
        self.proc = rc.Proc(rc.python_module("smg") + [
            "launch", "--host", "127.0.0.1", "--port", str(self.port),
            "--worker-urls", *[w.url for w in workers],
            "--policy", "cache_aware", "--block-size", str(rc.BS),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
            "--shutdown-grace-period-secs", "1", "--log-level", "debug"], tmp_path / f"smg-{n}.log")
        try:
            wait_until(self._ready, rc.DEADLINE * 2, "smg ready with every worker's KV stream",
                       interval=0.2)
        except AssertionError:
            raise AssertionError(f"smg never became ready:\n{self.proc.tail()}") from None

    def metrics(self):
        return rc.scrape(self.metrics_port)

    def _ready(self):
        assert self.proc.alive(), f"smg exited:\n{self.proc.tail()}"
        m = self.metrics()
        return m is not None and all(
            rc.metric(m, "smg_kv_event_subscriptions_total", worker=w.url) >= 1
            for w in self.workers)

    def blocks(self, w: Worker) -> float:
        return rc.metric(self.metrics(), "smg_kv_index_blocks", worker=w.url)

    def count(self, name: str, w: Worker, **labels) -> float:
        return rc.metric(self.metrics(), name, worker=w.url, **labels)

    def route(self, toks: list[int]) -> str:
        """A text completion of the prompt naming `toks`: the worker that served it."""
        before = {w.name: w.served() for w in self.workers}
        code, body = rc.http_json(f"http://127.0.0.1:{self.port}/v1/completions",
                                  json.dumps({"model": "m", "prompt": text(toks),
                                              "max_tokens": 1}).encode())
        assert code == 200, f"smg answered {code}: {body[:300]!r}"
        got = [w for w in self.workers if w.served() > before[w.name]]
        assert len(got) == 1, f"served by {[w.name for w in got]}"
        last = json.loads(got[0].record.read_text().splitlines()[-1])
        assert last["input_ids"] == toks, "the gateway tokenized the prompt differently"
        return got[0].name

    def close(self):
        self.proc.close()


def gateway_setup(rig, tmp_path, join: bool):
    """Two engines behind their sidecars, a stub worker on each and a
    factory of gateways. With `join` the workers' relays subscribe to the
    sidecars' join endpoint (events.join_endpoint) instead of the PUB."""
    tok = write_tokenizer(tmp_path / "tokenizer")
    # A small PUB high-water mark on A's sidecar, so that a stalled relay
    # misses batches (and must replay them) after a short burst.
    ea, eb = rc.EngineSide(rig, {"events.hwm": 20}, join=join), rc.EngineSide(rig, join=join)
    a, b = (Worker(tmp_path, n, e, tok, e.join_endpoint if join else None)
            for n, e in (("A", ea), ("B", eb)))
    made = []

    def gateway():
        g = Smg(tmp_path, [a, b], len(made))
        made.append(g)
        return g

    return gateway, (a, ea), (b, eb), lambda: [x.close() for x in made + [a, b, ea, eb]]


@pytest.fixture
def setup(rig, tmp_path):
    *parts, close = gateway_setup(rig, tmp_path, join=False)
    yield parts
    close()


@pytest.fixture
def join_setup(rig, tmp_path):
    *parts, close = gateway_setup(rig, tmp_path, join=True)
    yield parts
    close()


def wait_blocks(g: Smg, w: Worker, side: rc.EngineSide, n: int, timeout: float = rc.DEADLINE):
    """Publishes empty batches until the gateway's index holds n blocks for w."""
    try:
        side.publish_until(lambda: g.blocks(w) == n, f"smg_kv_index_blocks{{{w.name}}} == {n}",
                           timeout=timeout)
    except AssertionError as e:
        raise AssertionError(f"{e} (it holds {g.blocks(w)})") from None


def joined(g: Smg, *pairs) -> None:
    """Until each worker's relay has forwarded a live batch that smg applied:
    its SUB has joined the sidecar's PUB. The relay is live-only (case e),
    so a batch published before that would be lost for good."""
    for w, side in pairs:
        before = g.count("smg_kv_event_batches_total", w, disposition="applied")
        side.publish_until(
            lambda: g.count("smg_kv_event_batches_total", w, disposition="applied") > before,
            f"smg to apply a live batch of worker {w.name}")


def base_state(g, a, ea, b, eb):
    v = ea.v
    joined(g, (a, ea), (b, eb))
    ea.publish(rc.stored(v, PROMPT, 1))
    eb.publish(rc.stored(v, PROMPT[:2 * rc.BS], 101))
    wait_blocks(g, a, ea, 4)
    wait_blocks(g, b, eb, 2)


def test_smg_routes_to_the_worker_holding_the_blocks(setup):
    gateway, (a, ea), (b, eb) = setup
    g = gateway()
    base_state(g, a, ea, b, eb)
    assert g.route(PROMPT + [7]) == "A"
    assert g.route(PROMPT[:2 * rc.BS] + [7]) in ("A", "B")  # both hold it


def test_smg_stops_routing_to_removed_and_cleared_blocks(setup):
    gateway, (a, ea), (b, eb) = setup
    g = gateway()
    v = ea.v
    base_state(g, a, ea, b, eb)
    assert g.route(PROMPT + [7]) == "A"
    ea.publish(rc.removed(v, [2, 3, 4]))
    wait_blocks(g, a, ea, 1)
    assert g.route(PROMPT + [7]) == "B"
    ea.publish(rc.stored(v, PROMPT[rc.BS:], 2, parent=1))
    wait_blocks(g, a, ea, 4)
    assert g.route(PROMPT + [7]) == "A"
    ea.publish(rc.cleared(v))
    wait_blocks(g, a, ea, 0)
    assert g.route(PROMPT + [7]) == "B"


def test_smg_drops_a_restarted_engines_blocks(setup):
    gateway, (a, ea), (b, eb) = setup
    g = gateway()
    v = ea.v
    base_state(g, a, ea, b, eb)
    assert g.route(PROMPT + [7]) == "A"
    ea.restart_engine()
    ea.publish(rc.stored(v, OTHER, 201))
    # The sidecar's fence cleared A's old blocks; the new engine's 3 remain.
    wait_blocks(g, a, ea, 3)
    assert g.route(OTHER + [7]) == "A"
    assert g.route(PROMPT + [7]) == "B", "smg still routes to the dead engine's blocks"
    # The relay saw one unbroken seq: no resync, no clear-and-resubscribe.
    assert g.count("smg_kv_event_resyncs_total", a) == 0


def test_smg_stalled_relay_repairs_the_gap_from_the_sidecar_replay(setup):
    gateway, (a, ea), (b, eb) = setup
    g = gateway()
    base_state(g, a, ea, b, eb)
    gap = re.compile(r"skipped from \d+ to \d+; replaying")
    rc.stall_until_gap(
        ea, a.proc, "the stalled smg relay",
        converged=lambda k, _last: wait_blocks(g, a, ea, 3 + k, timeout=60),
        gapped=lambda: gap.search(a.proc.text()) is not None)
    # Repaired from the sidecar's replay inside the relay: the gateway saw
    # neither a gap nor a resync (a failed replay would end the stream with
    # DATA_LOSS and the gateway would clear A).
    assert g.count("smg_kv_event_resyncs_total", a) == 0
    assert g.count("smg_kv_event_gaps_total", a) == 0
    assert g.route(OTHER + [7]) == "A"
    assert g.route(PROMPT + [7]) == "B"


def test_smg_started_late_gets_the_engines_state(join_setup):
    """smg-grpc-servicer 0.14.1's relay is live-only: it takes the first
    batch it sees as its cursor and replays only what it misses after it,
    so on the plain PUB a late smg never learns what came before. Its relay
    on the sidecar's join endpoint gets the rank's state first (a snapshot
    numbered up to the seq it is consistent with), then live, and fills the
    gap between them from the replay ROUTER: the late gateway routes on the
    engines' whole state, with no resync."""
    gateway, (a, ea), (b, eb) = join_setup
    v = ea.v
    ea.publish(rc.stored(v, PROMPT, 1))
    eb.publish(rc.stored(v, PROMPT[:2 * rc.BS], 101))
    ea.publish(rc.removed(v, [1 + 3]))  # A's last block goes again: the state, not the history
    g = gateway()
    wait_blocks(g, a, ea, 3)
    wait_blocks(g, b, eb, 2)
    assert g.route(PROMPT + [7]) == "A"
    # Live after the snapshot: what B publishes now arrives too.
    eb.publish(rc.stored(v, OTHER, 301))
    wait_blocks(g, b, eb, 5)
    for w, side in ((a, ea), (b, eb)):
        j = side.rig.sidecar.wait_stats("join", lambda s: s["joins"] >= 1 and s["subscribers"] == 1)
        assert j["snapshot_batches"] >= 1 and j["dropped"] == 0, j
        assert g.count("smg_kv_event_resyncs_total", w) == 0, "the late gateway had to resync"
    assert ea.rig.sidecar.stats("join")["snapshot_blocks"] == 3
