"""Thousands of short-lived hostile peers on every port (issue #35).

Each test runs hostile_peers.py in a process of its own against one port for
a few seconds: a few thousand peers, each sending valid requests and garbage
and leaving without reading (at most `--open` connected at once, more than
the port's connection cap where it has one). Then it asserts:

- RSS grew by less than a bound computed from the settings the test gives
  (not checked under AddressSanitizer, whose quarantine keeps freed memory);
- the port is not deaf: a well-behaved client is served correctly right
  after (a replay: gapless, with its end marker);
- the stats balance (every request is accounted for) and refusals past the
  caps are counted;
- SIGTERM ends the process within sidecar.shutdown_timeout.

Before the fix (issue #35) the replay port alone grew RSS to ~1 GiB, went
deaf to a good client and did not stop on SIGTERM.
"""

from __future__ import annotations

import http.client
import json
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

pytest.register_assert_rewrite("conftest_cache", "lmcache_client")

from conftest_cache import CHUNK, tokens  # noqa: E402
from kvsidecar_harness import Subscriber, replay_batches, wait_until  # noqa: E402
from lmcache_client import MPClient, cache_key  # noqa: E402
from test_relay_hardening import batch_at, rss_kib, sanitized  # noqa: E402

pytest_plugins = ["conftest_cache"]

HOSTILE = Path(__file__).resolve().parent / "hostile_peers.py"
FLOOD_S = 6.0
SHUTDOWN_S = 3.0
MIB = 1024  # KiB
# What the allocator and libzmq keep for themselves after thousands of
# connections came and went (arenas, pipe chunks), beside the bounded state.
SLACK_KIB = 24 * MIB


def flood(kind: str, endpoint: str, pid: int, seconds: float = FLOOD_S, open_: int = 20,
          per_peer: int = 100, valid=()) -> tuple[dict, int]:
    """Runs the hostile peers; returns their report and the sidecar's peak RSS (KiB)."""
    proc = subprocess.Popen([sys.executable, str(HOSTILE), kind, endpoint,
                             "--seconds", str(seconds), "--open", str(open_),
                             "--per-peer", str(per_peer), "--valid", json.dumps(list(valid))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = rss_kib(pid)
    deadline = time.monotonic() + seconds + 30
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the hostile peers did not stop"
        peak = max(peak, rss_kib(pid))
        time.sleep(0.05)
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    print(f"{kind} flood on {endpoint}: {report}, peak RSS {peak} KiB")
    return report, peak


def stops_on_sigterm(sc) -> None:
    t0 = time.monotonic()
    sc.send_signal(signal.SIGTERM)
    rc = sc.wait_exit(SHUTDOWN_S + 2)
    took = time.monotonic() - t0
    assert rc == 0, f"exit status {rc}\n{sc.tail()}"
    assert took < SHUTDOWN_S + 1, f"SIGTERM took {took:.1f} s"


def check_rss(pid: int, rss0: int, peak: int, bound_kib: int, what: str) -> None:
    if sanitized(pid):
        return
    assert peak - rss0 < bound_kib, f"{what}: RSS {rss0} -> {peak} KiB, bound {bound_kib} KiB"


# --- the replay ROUTER -------------------------------------------------------------------


def test_replay_port_thousands_of_hostile_peers(rig):
    steps, hwm, streams, waiting, conns = 2000, 100, 16, 256, 64
    r = rig(overrides={"events.buffer_steps": steps, "events.replay_hwm": hwm,
                       "events.replay_max_streams": streams,
                       "events.replay_max_waiting": waiting,
                       "events.max_connections": conns,
                       "sidecar.shutdown_timeout": f"{SHUTDOWN_S}s"})
    pid = r.sidecar.proc.pid
    start = r.base[0]
    for k in range(steps):
        r.engine.send(0, batch_at(float(k)))
    r.sub.recv_n(steps, 0, timeout=30)
    newest = start + steps - 1
    assert len(replay_batches(r.replay(start, timeout=30))) == steps  # warms the allocators
    rss0 = rss_kib(pid)

    endpoint = f"tcp://127.0.0.1:{r.replay_port}"
    valid = [["", struct.pack(">Q", start).hex()], ["", "ff" * 8],
             ["", struct.pack(">Q", newest - 10).hex()], ["", b"snapshot/1".hex()]]
    report, peak = flood("dealer", endpoint, pid, open_=conns + 36, valid=valid)
    assert report["peers"] >= 1000, report

    s = r.sidecar.wait_stats("replay_bridge", lambda s: s["streaming"] == 0 and s["waiting"] == 0,
                             timeout=30, what="every stream and waiting request to end")
    assert s["requests"] > 1000, s
    assert s["requests"] == s["completed"] + s["abandoned"] + s["refused"], s
    assert s["rejected"] > 0 and s["connections_refused"] > 0, s
    # Per stream: its client's pipe (replay_hwm messages, ~350 B beside the
    # payloads shared with the buffer) and up to two parts of 1,024 batches
    # (~150 B each); waiting requests ~300 B; each connection's pipes
    # (request_hwm 16 requests, a few KiB).
    bound = (streams * (hwm * 350 + 2 * 1024 * 150) + waiting * 300 + conns * 8192) // 1024 \
        + SLACK_KIB
    check_rss(pid, rss0, peak, bound, "replay flood")

    # Not deaf: a well-behaved client gets the whole buffer, gapless, and
    # the end marker (read_replay asserts it came).
    got = replay_batches(r.replay(start, timeout=10))
    assert [sq for sq, _ in got] == list(range(start, newest + 1))
    stops_on_sigterm(r.sidecar)


# --- the PUB socket ----------------------------------------------------------------------


def test_pub_port_thousands_of_subscribers_that_never_read(rig, zctx):
    hwm, conns = 1000, 64
    r = rig(overrides={"events.hwm": hwm, "events.max_connections": conns,
                       "sidecar.shutdown_timeout": f"{SHUTDOWN_S}s"})
    pid = r.sidecar.proc.pid
    rss0 = rss_kib(pid)
    import threading
    stop = threading.Event()
    sent = [0]

    def publish():  # the engine keeps publishing while the peers come and go
        while not stop.is_set():
            r.engine.send(0, batch_at(float(sent[0])))
            sent[0] += 1
            time.sleep(0.0005)

    th = threading.Thread(target=publish, daemon=True)
    th.start()
    try:
        report, peak = flood("sub", f"tcp://127.0.0.1:{r.pub_port}", pid, open_=conns + 36)
        report2, peak2 = flood("tcp", f"tcp://127.0.0.1:{r.pub_port}", pid, seconds=3, open_=50)
    finally:
        stop.set()
        th.join()
    assert report["peers"] + report2["peers"] >= 1000, (report, report2)
    s = r.sidecar.wait_stats("pub", lambda s: s["connections"] <= 2, timeout=15,
                             what="the hostile subscribers to be gone")
    assert s["connections_refused"] > 0, s
    # Per subscriber: its pipe (events.hwm batches of 3 frames, ~250 B of
    # message headers beside the shared payload).
    bound = conns * hwm * 250 // 1024 + SLACK_KIB
    check_rss(pid, rss0, max(peak, peak2), bound, "PUB flood")

    # Not deaf: a new subscriber gets the next batches, in order.
    fresh = Subscriber(zctx, r.pub_port)
    try:
        def probe() -> bool:
            r.engine.send(0, batch_at(-1.0))
            return fresh.recv(0, 0.1) is not None
        wait_until(probe, 10, "a new subscriber to receive")
        while fresh.recv(0, 0.2) is not None:
            pass
        for k in range(20):
            r.engine.send(0, batch_at(1e6 + k))
        got = fresh.recv_n(20, 0, timeout=10)
        assert [m.seq for m in got] == list(range(got[0].seq, got[0].seq + 20))
    finally:
        fresh.close()
    stops_on_sigterm(r.sidecar)


# --- the cache's ZeroMQ ROUTER ------------------------------------------------------------


def test_cache_port_thousands_of_hostile_clients(cache_server):
    hwm, conns = 1000, 64
    srv = cache_server(overrides={"cache.hwm": hwm, "cache.max_connections": conns,
                                  "cache.session_ttl": "1s",
                                  "sidecar.shutdown_timeout": f"{SHUTDOWN_S}s"})
    pid = srv.sidecar.proc.pid
    good = srv.client()
    assert good.get_chunk_size(timeout=10) == CHUNK
    rss0 = rss_kib(pid)
    sample = MPClient(srv.endpoint, srv.ctx)
    valid = [[f.hex() for f in sample.frames_for("get_chunk_size", (), 1)],
             [f.hex() for f in sample.frames_for(
                 "lookup", (cache_key("m", 1, None, tokens(2), 0, 2 * CHUNK, "h"), 1), 2)],
             [f.hex() for f in sample.frames_for("end_session", ("h",), 3)]]
    sample.close()
    report, peak = flood("dealer", srv.endpoint, pid, open_=conns + 36, valid=valid)
    assert report["peers"] >= 1000, report
    s = srv.wait_stats(lambda s: s["connections"] <= 2, actor="engine_bridge", timeout=15,
                       what="the hostile clients to be gone")
    assert s["connections_refused"] > 0 and s["rejected"] > 0, s
    srv.wait_stats(lambda s: s["sessions"] == 0, actor="session_router", timeout=15,
                   what="the hostile lookups' sessions to end (cache.session_ttl)")
    # Per client: replies queued up to cache.hwm (~300 B each); sessions of
    # lookups end after cache.session_ttl.
    bound = conns * hwm * 300 // 1024 + SLACK_KIB
    check_rss(pid, rss0, peak, bound, "cache flood")
    assert good.get_chunk_size(timeout=10) == CHUNK  # the connected client is still served
    fresh = srv.client()
    assert fresh.get_chunk_size(timeout=10) == CHUNK  # and a new one
    stops_on_sigterm(srv.sidecar)


# --- the HTTP side -----------------------------------------------------------------------


def test_http_port_thousands_of_hostile_connections(sidecar):
    sc = sidecar({"events.enabled": False, "cache.enabled": False,
                  "sidecar.shutdown_timeout": f"{SHUTDOWN_S}s"}).start()
    pid = sc.proc.pid
    rss0 = rss_kib(pid)
    report, peak = flood("http", f"tcp://127.0.0.1:{sc.http_port}", pid, open_=300)
    assert report["peers"] >= 1000, report
    # 256 connections at most (the oldest closed past it), each a 64 KiB
    # request head at most.
    check_rss(pid, rss0, peak, 256 * 64 + SLACK_KIB, "HTTP flood")
    t0 = time.monotonic()
    status, _ = sc.http_get("/healthz", timeout=2)
    assert status == 200 and time.monotonic() - t0 < 1
    m = sc.metrics()
    closed = sum(v for (name, labels), v in m.items() if name == "kvsidecar_http_closed_total")
    assert closed > 0
    stops_on_sigterm(sc)


# --- the join endpoint --------------------------------------------------------------------


def test_join_port_thousands_of_subscribers_that_come_and_go(rig, zctx):
    """Each first subscriber takes a snapshot of the rank: thousands of them
    coming and going must not pile up snapshots or memory, and a router that
    subscribes afterwards still gets the rank's state, then live."""
    from kvsidecar_harness import free_port_range
    from test_events_snapshot import join_sub, received_state, send, stored
    port, hwm, conns = free_port_range(1), 1000, 64
    r = rig(overrides={"events.join_endpoint": f"tcp://*:{port}", "events.hwm": hwm,
                       "events.max_connections": conns,
                       "sidecar.shutdown_timeout": f"{SHUTDOWN_S}s"})
    pid = r.sidecar.proc.pid
    live: dict = {}
    for b in range(10):  # 1,000 blocks: a snapshot of several batches
        base = 1_000_000 * (b + 1)
        send(r, stored(list(range(base, base + 100)), None, bs=2), ts=float(b))
    last = received_state(r, 10, live)
    rss0 = rss_kib(pid)
    report, peak = flood("sub", f"tcp://127.0.0.1:{port}", pid, open_=conns + 36)
    report2, peak2 = flood("tcp", f"tcp://127.0.0.1:{port}", pid, seconds=3, open_=50)
    assert report["peers"] + report2["peers"] >= 1000, (report, report2)
    s = r.sidecar.wait_stats("join", lambda s: s["subscribers"] == 0 and s["connections"] == 0,
                             timeout=20, what="the hostile subscribers to be gone")
    assert s["connections_refused"] > 0, s
    # Per subscriber: its pipe (events.hwm batches); snapshots one at a time.
    check_rss(pid, rss0, max(peak, peak2), conns * hwm * 250 // 1024 + SLACK_KIB, "join flood")

    # Not deaf: the next router gets the state (every block stored) up to the last seq.
    sub = join_sub(zctx, port)
    try:
        got: dict = {}
        from test_events_snapshot import apply
        seq = -1
        while seq < last:
            assert sub.poll(10_000), f"the join endpoint sent nothing after seq {seq}"
            _, seqb, payload = sub.recv_multipart()
            seq = int.from_bytes(seqb, "big")
            apply(got, payload)
        assert got == live
    finally:
        sub.close(linger=0)
    stops_on_sigterm(r.sidecar)


# --- the cache's gRPC endpoint --------------------------------------------------------------


def test_grpc_port_thousands_of_hostile_clients(cache_server):
    grpc = pytest.importorskip("grpc")
    from kvsidecar_harness import free_port_range
    port = free_port_range(1)
    srv = cache_server(overrides={"cache.grpc_endpoint": f"grpc://127.0.0.1:{port}",
                                  "sidecar.shutdown_timeout": f"{SHUTDOWN_S}s"})
    pid = srv.sidecar.proc.pid
    target = f"127.0.0.1:{port}"
    noop = "/lmcache.mp.DebugService/Noop"

    def call_noop() -> bytes:
        with grpc.insecure_channel(target) as ch:
            return ch.unary_unary(noop, request_serializer=None,
                                  response_deserializer=None)(b"", timeout=10)
    call_noop()
    rss0 = rss_kib(pid)
    valid = [[noop, ""], ["/lmcache.mp.ControllerService/GetChunkSize", ""],
             ["/lmcache.mp.ManagementService/Ping", "0a00"]]
    report, peak = flood("grpc", f"grpc://{target}", pid, open_=50, per_peer=10, valid=valid)
    assert report["peers"] >= 1000, report
    def balanced(s) -> bool:  # every call answered one way or another
        return s["calls"] == (s["replies"] + s["failed"] + s["bad_requests"] + s["unimplemented"]
                              + s["overloaded"] + s["cancelled"])
    s = srv.wait_stats(balanced, actor="grpc_bridge", timeout=20,
                       what="every hostile call to be answered or cancelled")
    assert s["calls"] > 1000, s
    # gRPC's core bounds what it buffers per connection; 50 connections open
    # at a time with 10 small calls each.
    check_rss(pid, rss0, peak, 64 * MIB + SLACK_KIB, "gRPC flood")
    call_noop()  # not deaf
    stops_on_sigterm(srv.sidecar)


# --- a bound ingest (engines connect to the sidecar) ----------------------------------------


def test_bound_ingest_thousands_of_hostile_publishers(rig, zctx):
    """Hostile PUBs connect to a bound ingest and send batches with random
    seqs and garbage: memory stays bounded, fences stay within one per
    connection or per events.restart_min_interval (not one per batch), and
    a real engine connecting afterwards is relayed."""
    from kvsidecar_harness import free_port_range
    port, ingest_hwm, conns = free_port_range(1), 100, 64
    r = rig(engine=False, sync=False,
            overrides={"events.ingest_endpoint": f"tcp://*:{port}", "events.ingest_hwm": ingest_hwm,
                       "events.max_connections": conns,
                       "sidecar.shutdown_timeout": f"{SHUTDOWN_S}s"})
    pid = r.sidecar.proc.pid
    rss0 = rss_kib(pid)
    valid = [batch_at(float(k)).hex() for k in range(5)]
    report, peak = flood("pub", f"tcp://127.0.0.1:{port}", pid, open_=conns + 36, valid=valid)
    assert report["peers"] >= 1000, report
    s = r.sidecar.wait_stats("ingest", lambda s: s["connections"] == 0, timeout=20,
                             what="the hostile publishers to be gone")
    assert s["connections_refused"] > 0 and s["received"] > 0, s
    # One fence per connection at most (the first new stream after each is
    # fenced at once), plus one per second of the flood; never one per batch.
    assert s["engine_restarts"] <= s["reconnects"] + FLOOD_S + 2, s
    assert s["fence_skipped"] <= s["received"], s
    check_rss(pid, rss0, peak, conns * ingest_hwm * 300 // 1024 + SLACK_KIB, "ingest flood")

    # A real engine connects and is relayed, in order.
    pub = zctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(f"tcp://127.0.0.1:{port}")
    try:
        seq = [0]

        def probe() -> bool:
            pub.send_multipart([b"", struct.pack(">Q", seq[0]), batch_at(-1.0)])
            seq[0] += 1
            return r.sub.recv(0, 0.1) is not None
        wait_until(probe, 10, "the engine's batches to be relayed")
        while r.sub.recv(0, 0.3) is not None:
            pass
        for k in range(20):
            pub.send_multipart([b"", struct.pack(">Q", seq[0] + k), batch_at(1e6 + k)])
        got = r.sub.recv_n(20, 0, timeout=10)
        assert [m.seq for m in got] == list(range(got[0].seq, got[0].seq + 20))
    finally:
        pub.close(linger=0)
    stops_on_sigterm(r.sidecar)
