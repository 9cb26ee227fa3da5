"""kvsidecar's HTTP side: /metrics, /healthz, /readyz ([http] in the config).

What is checked: after driving KV events (good batches, a bad payload, a gap)
and cache traffic (register, store, lookup, retrieve through LMCache's wire)
the scraped counters equal what the test sent, and equal the actors' own
stats lines (one source); /readyz is 503 while starting and from SIGTERM on,
200 in between; the probes answer within 50 ms while the relay is flooded;
a port in use fails the start naming http.listen; http.enabled = false
serves nothing.

Run: KVSIDECAR_BIN=<build>/kvsidecar python3 -m pytest -q tests/integration/test_metrics.py
"""

from __future__ import annotations

import datetime
import http.client
import pathlib
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.register_assert_rewrite("conftest_cache", "lmcache_client")

import vllm_structs as vs  # noqa: E402
from conftest_cache import CHUNK, tokens  # noqa: E402
from kvsidecar_harness import free_port_range, wait_until  # noqa: E402
from lmcache_client import SeedFlow  # noqa: E402

pytest_plugins = ["conftest_cache"]  # the cache_server and kv_pools fixtures

MODEL = "test-org/test-model"
PROBE_BUDGET = 0.050  # seconds: the bound for a probe under load


def value(metrics, name, **labels):
    """The sample `name{labels}`, or None when it is not exported."""
    return metrics.get((name, frozenset((k, str(v)) for k, v in labels.items())))


def batch(i: int, n_events: int = 3) -> bytes:
    events = [vs.BlockStored(block_hashes=[i * 100 + k], parent_block_hash=None,
                             token_ids=list(range(16)), block_size=16, lora_id=None,
                             medium="GPU", lora_name=None)
              for k in range(n_events)]
    return vs.encoder.encode(vs.KVEventBatch(ts=float(i), events=events))


def wait_metric(sc, name, want, timeout=5.0, **labels):
    """Scrapes until name{labels} == want (counters only grow: equality, not >=)."""
    last = {}

    def ok():
        last["m"] = sc.metrics()
        return value(last["m"], name, **labels) == want
    try:
        wait_until(ok, timeout, f"{name}{labels} == {want}", interval=0.05)
    except AssertionError:
        raise AssertionError(f"{name}{labels}: {value(last['m'], name, **labels)}, "
                             f"want {want}") from None
    return last["m"]


# --- the relay -------------------------------------------------------------------------


def test_event_counters_match_what_was_sent(rig):
    r = rig()
    sc = r.sidecar
    base = r.base[0]  # warm-up batches published by sync_rank
    events0 = value(wait_metric(sc, "kvsidecar_events_sent_total", base, dp_rank=0),
                    "kvsidecar_events_published_events_total", dp_rank=0)
    n = 40
    for i in range(n):
        r.engine.send(0, batch(i))
    r.engine.send(0, b"\x01not a batch")
    r.engine.send(0, batch(999), live=False)  # a gap of one (no engine replay: lost)
    r.engine.send(0, batch(n))
    got = r.sub.recv_n(n + 1, 0, timeout=10)
    assert len(got) == n + 1
    published = base + n + 1
    m = wait_metric(sc, "kvsidecar_events_sent_total", published, dp_rank=0)
    assert value(m, "kvsidecar_events_published_total", dp_rank=0) == published
    assert value(m, "kvsidecar_events_published_events_total", dp_rank=0) \
        == events0 + 3 * (n + 1)
    assert value(m, "kvsidecar_events_seq", dp_rank=0) == published
    # Seq 0 is the sidecar's own fence (AllBlocksCleared), so the engine sent
    # base - 1 warm-ups, then n + 3 messages; the kept-back one never arrived.
    assert value(m, "kvsidecar_events_received_total", dp_rank=0) == base + n + 1
    assert value(m, "kvsidecar_events_accepted_total", dp_rank=0) == published - 1
    assert value(m, "kvsidecar_events_dropped_total", dp_rank=0, reason="bad_payload") == 1
    assert value(m, "kvsidecar_events_dropped_total", dp_rank=0, reason="queue_full") == 0
    assert value(m, "kvsidecar_events_dropped_total", dp_rank=0, reason="subscriber_hwm") == 0
    assert value(m, "kvsidecar_events_gaps_total", dp_rank=0) == 1
    assert value(m, "kvsidecar_events_lost_total", dp_rank=0) == 1
    assert value(m, "kvsidecar_events_refilled_total", dp_rank=0) == 0
    assert value(m, "kvsidecar_events_engine_restarts_total", dp_rank=0) == 0
    assert value(m, "kvsidecar_events_subscribers", dp_rank=0) == 1
    assert value(m, "kvsidecar_events_replay_kept_batches", dp_rank=0) == published
    assert value(m, "kvsidecar_events_queued", dp_rank=0) == 0
    # A replay request shows up on the replay side.
    kept = r.replay(base)
    assert len(kept) == n + 2  # n + 1 batches and the end marker
    m = wait_metric(sc, "kvsidecar_events_replay_batches_total", n + 1, dp_rank=0)
    assert value(m, "kvsidecar_events_replay_requests_total", dp_rank=0) == 1
    # An engine restart (seq back to 0) is counted.
    r.engine.send(0, batch(7), seq=0)
    wait_metric(sc, "kvsidecar_events_engine_restarts_total", 1, dp_rank=0)
    # One source: the ingest's stats line says the same as /metrics.
    m = sc.metrics()
    s = sc.wait_stats("ingest", lambda s: s["received"] == base + n + 2)
    assert s["received"] == value(m, "kvsidecar_events_received_total", dp_rank=0)
    assert s["bad_payloads"] == value(m, "kvsidecar_events_dropped_total", dp_rank=0,
                                      reason="bad_payload")
    assert s["lost"] == value(m, "kvsidecar_events_lost_total", dp_rank=0)
    assert s["engine_restarts"] == 1


def test_every_family_is_documented_and_process_figures_are_there(rig):
    r = rig()
    status, body = r.sidecar.http_get("/metrics")
    assert status == 200
    helps = [l for l in body.splitlines() if l.startswith("# HELP ")]
    assert helps and not [h for h in helps if h.endswith("(undocumented)")], \
        [h for h in helps if h.endswith("(undocumented)")]
    m = r.sidecar.metrics()
    assert value(m, "kvsidecar_up") == 1
    assert value(m, "kvsidecar_ready") == 1
    assert 0 < value(m, "kvsidecar_uptime_seconds") < 120
    assert value(m, "process_resident_memory_bytes") > 1 << 20
    assert abs(value(m, "process_start_time_seconds") - time.time()) < 120
    assert not [k for k in m if k[0] == "kvsidecar_scrape_timeouts_total"], \
        "an idle actor did not answer a scrape in time"


# --- the cache -------------------------------------------------------------------------


def test_cache_counters_match_the_traffic(cache_server, kv_pools):
    srv = cache_server()
    sc = srv.sidecar
    pools = kv_pools("sglang")
    chunk_bytes = pools.chunk_bytes(CHUNK)
    flow = SeedFlow(srv.client(), pools, MODEL, instance_id=4100, engine="sglang")
    assert flow.register() is None
    toks = tokens(4, salt=11)
    assert flow.lookup_kv(toks, "req-1") == 0  # a miss of 4 chunks
    assert flow.store_kv(toks, "req-1", list(range(0, 64))) is True
    flow.end_session("req-1")
    flow.drain()
    m = wait_metric(sc, "kvsidecar_cache_stored_chunks_total", 4)
    assert flow.lookup_kv(toks, "req-2") == 4 * CHUNK
    assert flow.retrieve_kv("req-2", list(range(80, 144))) == 4 * CHUNK
    flow.end_session("req-2")
    flow.drain()
    m = wait_metric(sc, "kvsidecar_cache_retrieve_bytes_total", 4 * chunk_bytes, backend="host")
    assert value(m, "kvsidecar_cache_store_bytes_total", backend="host") == 4 * chunk_bytes
    assert value(m, "kvsidecar_cache_copies_total", backend="host") == 2
    assert value(m, "kvsidecar_cache_copy_failures_total", backend="host") == 0
    assert value(m, "kvsidecar_cache_copy_throughput_gbps_count", backend="host", op="store") == 1
    assert value(m, "kvsidecar_cache_copy_seconds_total", backend="host", op="retrieve") > 0
    assert value(m, "kvsidecar_cache_lookups_total") == 2
    assert value(m, "kvsidecar_cache_lookup_hit_chunks_total", tier="l1") == 4
    assert value(m, "kvsidecar_cache_lookup_miss_chunks_total") == 4
    assert value(m, "kvsidecar_cache_chunks") == 4
    assert value(m, "kvsidecar_cache_evictions_total", tier="l1") == 0
    assert value(m, "kvsidecar_cache_l1_capacity_bytes") == 64 << 20
    used = value(m, "kvsidecar_cache_l1_used_bytes")
    assert 4 * chunk_bytes <= used < 64 << 20
    assert value(m, "kvsidecar_cache_l1_usage_ratio") == pytest.approx(used / (64 << 20))
    assert value(m, "kvsidecar_cache_instances") == 1
    assert value(m, "kvsidecar_cache_registrations_total") == 1
    # Latency histograms per op: one STORE and one RETRIEVE, two LOOKUPs.
    for op, n in [("store", 1), ("retrieve", 1), ("lookup", 2), ("register_kv_cache", 1)]:
        assert value(m, "kvsidecar_cache_request_duration_seconds_count", op=op) == n, op
        assert value(m, "kvsidecar_cache_request_duration_seconds_bucket", op=op, le="+Inf") == n
    requests = value(m, "kvsidecar_cache_requests_total")
    assert requests >= 6 and value(m, "kvsidecar_cache_replies_total") <= requests
    # Locks end with the sessions; the gauge follows.
    m = wait_metric(sc, "kvsidecar_cache_locks", 0)
    # One source: the store's stats line says the same.
    s = srv.wait_stats(lambda s: s["stored"] == 4 and s["locks"] == 0)
    m = sc.metrics()
    assert s["hits"] == value(m, "kvsidecar_cache_lookup_hit_chunks_total", tier="l1")
    assert s["misses"] == value(m, "kvsidecar_cache_lookup_miss_chunks_total")
    assert s["chunks"] == value(m, "kvsidecar_cache_chunks")
    assert s["used_bytes"] == value(m, "kvsidecar_cache_l1_used_bytes")
    flow.close()


# --- probes ----------------------------------------------------------------------------


def probe(port: int, path: str, timeout: float = 1.0) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode().strip()
    finally:
        conn.close()


def test_readyz_503_while_starting_and_from_sigterm_on(sidecar):
    sc = sidecar({"events.enabled": False, "cache.l1_size": "64MiB", "gpu.backend": "host",
                  "cache.endpoint": f"tcp://127.0.0.1:{free_port_range(1)}"})
    seen: list[tuple[float, int, str]] = []  # (wall time the request began, status, body)
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            began = time.time()
            try:
                st, body = probe(sc.http_port, "/readyz", 0.5)
                seen.append((began, st, body))
            except OSError:
                if seen:  # listening before, gone now: the process is exiting
                    return
                time.sleep(0.0005)

    th = threading.Thread(target=poll, daemon=True)
    sc.spawn()
    th.start()
    sc.wait_ready()
    wait_until(lambda: any(s == 200 for _, s, _ in seen), 5, "/readyz 200")
    sc.send_signal(signal.SIGTERM)
    assert sc.wait_exit(5) == 0
    stop.set()
    th.join(5)
    states = [(st, body) for _, st, body in seen]
    # The order is starting* ready+ draining*: never ready again after draining.
    order = {"starting": 0, "ready": 1, "draining": 2}
    ranks = [order[b] for _, b in states]
    assert ranks == sorted(ranks), states
    assert all((st == 200) == (b == "ready") for st, b in states), states
    # /readyz turns 503 before the sidecar logs the signal: a request begun
    # after that line was written is never answered ready.
    m = sc.wait_log(r"^(\S+)Z INFO .* SIGTERM received")
    logged = datetime.datetime.fromisoformat(m.group(1)).replace(
        tzinfo=datetime.timezone.utc).timestamp()
    late = [(t - logged, st) for t, st, _ in seen if t > logged and st == 200]
    assert not late, f"/readyz 200 for requests begun after SIGTERM was logged: {late}"
    # The HTTP server starts before the actors, so the start-up is visible.
    assert states[0] == (503, "starting") or ("starting" not in [b for _, b in states]
                                              and states[0][1] == "ready"), states


def test_readyz_answers_draining_after_sigterm(rig, zctx):
    """While the sidecar drains a flood, /readyz says 503 draining."""
    r = rig(overrides={"events.max_queue_size": 1000000, "sidecar.shutdown_timeout": "5s"})
    sc = r.sidecar
    assert probe(sc.http_port, "/readyz") == (200, "ready")
    big = batch(1, n_events=200)
    answers: list[tuple[int, str]] = []
    done = threading.Event()

    def poll():
        while not done.is_set():
            try:
                answers.append(probe(sc.http_port, "/readyz", 0.5))
            except OSError:
                return

    for i in range(20000):
        r.engine.send(0, big)
    th = threading.Thread(target=poll, daemon=True)
    th.start()
    # The poller must be answered once before the signal: started only just
    # before it, its first probe could come after the sidecar had drained
    # and closed (one CI run saw no answer at all).
    wait_until(lambda: answers, 5, "the /readyz poller's first answer")
    sc.send_signal(signal.SIGTERM)
    assert sc.wait_exit(10) == 0
    done.set()
    th.join(5)
    after = answers[next((i for i, a in enumerate(answers) if a[0] == 503), len(answers)):]
    assert (503, "draining") in answers, f"no 503 draining seen: {answers[:5]}..."
    assert all(a == (503, "draining") for a in after), after


PROBER = """
import http.client, sys, time
port = int(sys.argv[1])
for _ in range(40):
    for path in ("/healthz", "/readyz"):
        t0 = time.monotonic()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        c.request("GET", path)
        r = c.getresponse()
        r.read()
        c.close()
        assert r.status == 200, (path, r.status)
        print(time.monotonic() - t0)
"""


def test_probes_answer_within_50ms_while_the_relay_is_flooded(rig):
    # The flood leaves thousands of batches queued; a short drain deadline
    # keeps the fixture's stop (5 s) from waiting on them (slow under ASan).
    r = rig(overrides={"events.max_queue_size": 1000000, "sidecar.shutdown_timeout": "2s"})
    sc = r.sidecar
    big = batch(1, n_events=50)
    stop = threading.Event()
    sent = [0]

    def flood():
        while not stop.is_set():
            for _ in range(200):
                r.engine.send(0, big)
            sent[0] += 200

    th = threading.Thread(target=flood, daemon=True)
    th.start()
    try:
        wait_until(lambda: sent[0] >= 2000, 10, "the flood to start")
        # Probed from another process: this one's flooding thread holds the
        # GIL, which would be measured instead of the sidecar.
        out = subprocess.run([sys.executable, "-c", PROBER, str(sc.http_port)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        times = [float(x) for x in out.stdout.split()]
        # A scrape in the flood hears from the flooded ingest bridge itself
        # (within the scrape's 200 ms): it gives its mailbox a turn every 32
        # batches, not only after a whole burst of 1,024.
        during = sc.metrics()
        assert value(during, "kvsidecar_events_received_total", dp_rank=0), \
            {k: v for k, v in during.items() if "scrape" in k[0]}
    finally:
        stop.set()
        th.join(10)
    # The flood was real: every batch of it reaches the sidecar after all.
    wait_until(lambda: (value(sc.metrics(), "kvsidecar_events_received_total", dp_rank=0)
                        or 0) >= sent[0], 30, "the flood to be received")
    times.sort()
    assert times[-1] < PROBE_BUDGET, f"slowest probe {times[-1] * 1e3:.1f} ms, " \
        f"median {times[len(times) // 2] * 1e3:.2f} ms"


def test_healthz_and_unknown_paths(rig):
    sc = rig().sidecar
    assert probe(sc.http_port, "/healthz") == (200, "ok")
    assert probe(sc.http_port, "/nope")[0] == 404
    conn = http.client.HTTPConnection("127.0.0.1", sc.http_port, timeout=2)
    conn.request("POST", "/metrics", body=b"x")
    assert conn.getresponse().status == 405
    conn.close()


def test_http_survives_garbage_huge_uris_and_clients_killed_mid_request(rig):
    """Every request goes through our router (begin_request): random bytes,
    a 100 KB URI and requests whose client resets the connection before
    reading the answer leave the probes answering and no fd behind."""
    sc = rig().sidecar
    port = sc.http_port
    fd_dir = pathlib.Path(f"/proc/{sc.proc.pid}/fd")
    fds0 = len(list(fd_dir.iterdir()))
    rnd = random.Random(9)
    for i in range(300):
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        try:
            if i % 3 == 0:
                s.sendall(bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(1, 2000))))
            elif i % 3 == 1:
                s.sendall(b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n")
            else:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                # Reset (linger 0) instead of reading the answer.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
        except OSError:
            pass  # the server may close first: that is a fine answer too
        finally:
            s.close()
        if i % 50 == 0:
            assert probe(port, "/healthz", 2.0) == (200, "ok")
    assert probe(port, "/readyz", 2.0) == (200, "ready")
    assert probe(port, "/metrics", 5.0)[0] == 200
    wait_until(lambda: len(list(fd_dir.iterdir())) <= fds0, 10, f"the sidecar back at {fds0} fds")


def test_probes_answer_while_hundreds_of_clients_hold_half_a_request(rig):
    """Slowloris against the probe port: 400 clients each send half a request
    head and wait, 100 more send a whole /metrics request and never read the
    answer. /healthz and /readyz keep answering within PROBE_BUDGET-ish
    (every answer under 0.5 s, the probes' own deadline), a scrape still
    works, and every held connection is closed by the server (head timeout,
    or the oldest giving way to newer ones) without the client doing
    anything: the sidecar ends at its fd count."""
    sc = rig().sidecar
    port = sc.http_port
    fd_dir = pathlib.Path(f"/proc/{sc.proc.pid}/fd")
    fds0 = len(list(fd_dir.iterdir()))
    held = []
    try:
        for i in range(500):
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" if i % 5 == 4
                      else b"GET /healthz HTTP/1.1\r\nHost: x")
            held.append(s)
            if i % 100 == 99:
                t0 = time.monotonic()
                assert probe(port, "/healthz", 2.0) == (200, "ok")
                assert probe(port, "/readyz", 2.0) == (200, "ready")
                assert time.monotonic() - t0 < 0.5, f"two probes took {time.monotonic() - t0:.3f} s"
        assert probe(port, "/metrics", 5.0)[0] == 200
        # The server closes them all (5 s head timeout at most, 10 s for an
        # unread answer): each one reads EOF (or a reset) with no help.
        deadline = time.monotonic() + 20
        for i, s in enumerate(held):
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                while s.recv(65536):
                    pass
            except ConnectionResetError:
                pass
            except TimeoutError:
                raise AssertionError(f"held connection {i} of {len(held)} still open after 20 s")
    finally:
        for s in held:
            s.close()
    wait_until(lambda: len(list(fd_dir.iterdir())) <= fds0, 10, f"the sidecar back at {fds0} fds")
    assert probe(port, "/healthz") == (200, "ok")
    # Counted and logged: who was closed, why, from where.
    m = sc.metrics()
    closed = {r: value(m, "kvsidecar_http_closed_total", reason=r)
              for r in ("head_timeout", "evicted", "write_timeout", "bad_request")}
    assert closed["evicted"] >= 500 - 256 and closed["head_timeout"] > 0, closed
    assert closed["bad_request"] == 0, closed
    assert sc.find(r"WARN  http\[127\.0\.0\.1:\d+\]#0 \d+ connection\(s\) closed: no whole request "
                   r"head within 5000 ms; the last from 127\.0\.0\.1:\d+"), sc.tail()
    assert sc.find(r"connection\(s\) closed: the oldest, for a new one past 256 connections")


def test_http_port_in_use_is_status_1_naming_http_listen(sidecar):
    port = free_port_range(1)
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    blocker.bind(("127.0.0.1", port))
    blocker.listen(1)
    try:
        sc = sidecar({"events.enabled": False, "cache.enabled": False,
                      "http.listen": f"127.0.0.1:{port}"}).spawn()
        assert sc.wait_exit(10) == 1, sc.log_text()
        bad = [l for l in sc.lines() if "ERROR" in l and "http.listen" in l and f":{port}" in l]
        assert bad, f"no error line naming http.listen and the port:\n{sc.log_text()}"
        assert "Address already in use" in bad[0], bad[0]
        assert "kvsidecar ready" not in sc.log_text()
    finally:
        blocker.close()


def test_http_disabled_serves_nothing(sidecar):
    port = free_port_range(1)
    sc = sidecar({"events.enabled": False, "cache.enabled": False, "http.enabled": False,
                  "http.listen": f"127.0.0.1:{port}"}).start()
    with pytest.raises(ConnectionRefusedError):
        probe(port, "/healthz")
    assert "serving /metrics" not in sc.log_text()


def test_idle_actors_write_a_stats_line_only_when_a_figure_changed(rig):
    """sidecar.stats_repeat: an unchanged stats line is not written again
    (issue #37: idle sidecars wrote ten all-zero lines every interval); a
    changed figure is written at the next tick."""
    r = rig(overrides={"sidecar.stats_interval": "100ms", "sidecar.stats_repeat": "10m"})
    sc = r.sidecar

    def stats_lines(since: int) -> list[str]:
        return [l for l in sc.lines()[since:] if " stats: " in l]

    def settled() -> bool:  # the start-up figures (fence, warm-up batches) written
        since = len(sc.lines())
        time.sleep(0.5)
        return not stats_lines(since)
    wait_until(settled, 10, "five intervals without a stats line")
    mark = len(sc.lines())
    # Fifteen intervals of nothing: no line at all.
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        time.sleep(0.1)
    assert stats_lines(mark) == [], stats_lines(mark)
    # A batch: the actors it passes write their changed figures.
    r.engine.send(0, batch(7))
    r.sub.recv_n(1, 0, timeout=5)
    wait_until(lambda: any(" ingest[dp=0]#" in l for l in stats_lines(mark)), 2,
               "the ingest's stats line after a batch")
    s = r.sidecar.stats("ingest")
    assert s["received"] >= 1
