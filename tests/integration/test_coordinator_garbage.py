"""A fleet coordinator that answers garbage costs kvsidecar's data path
nothing (issue #45): a tiny HTTP server stands where LMCache's coordinator
would, and answers each kind of call (POST /instances, PUT .../heartbeat,
POST /events) in one bad way after another -- bad JSON, a wrong status, an
answer of 64 MiB, an answer slower than the 2 s deadline, bytes that are
not HTTP at all.

What is checked, for each bad answer:
- stores keep succeeding, each well under the call deadline (the calls are
  on the membership and reporter threads; the L2 actor only queues);
- the sidecar's RSS stays bounded while 64 MiB answers are refused (the
  client stops reading at 1 MiB);
- the failure is logged once with the URL and what was wrong, not again
  while the same kind of garbage repeats (three more calls answered);
- it is counted: kvsidecar_coordinator_calls_failed_total{call} for the
  membership calls, kvsidecar_coordinator_event_posts_failed_total and
  _events_lost_total for POST /events.

Needs the blake3 package (the L2 in LMCache's format that event reporting
requires); skips with the reason without it.
"""

from __future__ import annotations

import http.server
import json
import socketserver
import threading
import time

import pytest

pytest.register_assert_rewrite("conftest_cache", "lmcache_client")

from conftest_cache import tokens
from kvsidecar_harness import rss_kib, sanitized, wait_until
from test_cache_l2_lmcache import flow_for, store_prompt
from test_coordinator_events import metric, overrides

pytest_plugins = ["conftest_cache"]

HUGE = 64 << 20


class Bad(http.server.BaseHTTPRequestHandler):
    """Answers by the kind of call: Bad.modes[kind] (register, heartbeat,
    events) picks the garbage; Bad.calls counts the calls of each kind."""

    modes: dict[str, str] = {}
    calls: dict[str, int] = {}
    lock = threading.Lock()

    def _kind(self) -> str:
        if self.path == "/instances":
            return "register"
        if self.path.endswith("/heartbeat"):
            return "heartbeat"
        return "events" if self.path == "/events" else "other"

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _answer(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        kind = self._kind()
        mode = Bad.modes.get(kind, "ok")
        try:
            if mode == "bad_json":
                self._send(200, b"{not json \xff\x00")
            elif mode == "status":
                self._send(503, b"<html>overloaded</html>")
            elif mode == "huge":
                self.send_response(200)
                self.send_header("Content-Length", str(HUGE))
                self.end_headers()
                block = b"x" * (1 << 20)
                for _ in range(HUGE // len(block)):
                    self.wfile.write(block)
            elif mode == "slow":
                time.sleep(3.0)
                self._send(200, b"{}")
            elif mode == "not_http":
                self.wfile.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\nnonsense")
            elif kind == "register":
                self._send(200, json.dumps({"instance_id": "kv-garbage-1"}).encode())
            else:
                self._send(200, b"{}")
        except OSError:
            pass  # the sidecar hung up on the answer: what the test wants
        finally:
            with Bad.lock:  # counted once answered (or given up on)
                Bad.calls[kind] = Bad.calls.get(kind, 0) + 1

    do_POST = do_PUT = do_DELETE = do_GET = _answer

    def log_message(self, *a):
        pass


class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True


# (mode, what the log line says besides the URL)
GARBAGE = [("bad_json", "with no JSON object"), ("status", "HTTP 503 -- <html>overloaded"),
           ("huge", f"answer larger than {1 << 20} bytes"),
           ("slow", "no whole answer within 2000 ms"), ("not_http", "not an HTTP answer")]


def test_a_coordinator_answering_garbage_costs_the_data_path_nothing(cache_server, kv_pools,
                                                                     tmp_path):
    Bad.modes, Bad.calls = {"register": "bad_json"}, {}
    http_srv = Server(("127.0.0.1", 0), Bad)
    threading.Thread(target=http_srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{http_srv.server_address[1]}"
    try:
        srv = cache_server(overrides=overrides(tmp_path, url))
        sc = srv.sidecar
        f = flow_for(srv, kv_pools(seed=12), 1)
        rss0 = rss_kib(sc.proc.pid)
        stored = [0]

        def store_quickly():
            t0 = time.monotonic()
            store_prompt(srv, f, tokens(1, salt=60 + stored[0]), f"r{stored[0]}", stored[0] + 1)
            stored[0] += 1
            took = time.monotonic() - t0
            assert took < 2.0, f"a store took {took:.2f}s beside a garbage coordinator"

        def fails_once(kind: str, mode: str, said: str, where: str, counter) -> None:
            before = counter()
            Bad.modes[kind] = mode
            wait_until(lambda: any(said in ln and where in ln
                                   for ln in sc.log_text().splitlines()),
                       15, f"{kind}/{mode} logged with its URL")
            store_quickly()
            seen = Bad.calls.get(kind, 0)
            wait_until(lambda: Bad.calls.get(kind, 0) >= seen + 3, 20,
                       f"three more {kind} calls answered {mode}")
            lines = [ln for ln in sc.log_text().splitlines() if said in ln and where in ln]
            assert len(lines) == 1, lines
            assert counter() >= before + 3, (kind, mode, before, counter())

        def calls_failed(call: str):
            return lambda: sum(v for (n, labels), v in sc.metrics().items()
                               if n == "kvsidecar_coordinator_calls_failed_total"
                               and ("call", call) in labels)

        # Registration answered garbage: never registered, every kind once.
        for mode, said in GARBAGE:
            fails_once("register", mode, said, f"{url}/instances", calls_failed("register"))
        assert "registered with the coordinator" not in sc.log_text()

        # Registered; then the heartbeats and the event POSTs answer garbage.
        Bad.modes = {"heartbeat": "status", "events": "huge"}
        wait_until(lambda: "registered with the coordinator as kv-garbage-1" in sc.log_text(), 15,
                   "registered once the coordinator answers")
        fails_once("heartbeat", "status", "HTTP 503", f"{url}/instances/kv-garbage-1/heartbeat",
                   calls_failed("heartbeat"))
        for mode, said in [("huge", f"answer larger than {1 << 20} bytes"),
                           ("status", "HTTP 503"), ("not_http", "not an HTTP answer")]:
            store_quickly()  # something to report: a POST per flush with events
            fails_once("events", mode, said, f"{url}/events",
                       lambda: metric(srv, "kvsidecar_coordinator_event_posts_failed_total"))
        assert metric(srv, "kvsidecar_coordinator_events_lost_total") >= 1
        assert sc.http_get("/readyz")[0] == 200
        # Dozens of 64 MiB answers refused: the sidecar read at most 1 MiB of each.
        # (Checked on the release build: ASan's quarantine keeps every freed
        # 1 MiB read buffer resident.)
        grown = rss_kib(sc.proc.pid) - rss0
        assert sanitized(sc.proc.pid) or grown < 24 << 10, \
            f"RSS grew {grown >> 10} MiB beside a garbage coordinator"
    finally:
        http_srv.shutdown()
        http_srv.server_close()
