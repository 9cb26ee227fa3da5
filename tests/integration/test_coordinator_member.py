"""kvsidecar in an LMCache fleet: [coordinator] membership with LMCache
0.5.6's own coordinator process (``lmcache coordinator`` from the engine
venv). kvsidecar registers as LMCache's registrar does, so ``lmcache query
coordinator --api instances`` lists it at its HTTP address; after the
coordinator restarts (forgetting every instance) kvsidecar registers again
on its next heartbeat; at shutdown it deregisters. A coordinator that
answers garbage or is not there is logged with the reason and costs the
sidecar nothing (/readyz stays 200). Cache-event reporting is
test_coordinator_events.py; without an L2 in LMCache's format it is refused
at start with the reason.

Needs the engine venv (build-venv-engine, lmcache 0.5.6); the coordinator
tests skip with the reason without it.
"""

from __future__ import annotations

import http.server
import json
import os
import socketserver
import threading

import pytest

from kvsidecar_harness import Sidecar, free_port_range, wait_until
from lmcache_cli import release_env, run_cli
from lmcache_coordinator import Coordinator


def sidecar(tmp_path, coordinator_url: str, **more) -> Sidecar:
    return Sidecar(tmp_path, {"events.enabled": False, "cache.enabled": False,
                              "coordinator.url": coordinator_url,
                              "coordinator.advertise_address": "127.0.0.1",
                              "coordinator.heartbeat_interval": "200ms", **more})


def test_registers_heartbeats_reregisters_and_leaves(tmp_path):
    env, why = release_env("0.5.6")
    if env is None:
        pytest.skip(why)
    port = free_port_range(1)
    co = Coordinator(tmp_path, port).start()
    sc = None
    try:
        sc = sidecar(tmp_path / "sc", co.url).start()
        me = {"ip": "127.0.0.1", "http_port": sc.http_port}

        def mine():
            got = co.instances() or []
            return [i for i in got if i["ip"] == me["ip"] and i["http_port"] == me["http_port"]]
        wait_until(lambda: len(mine()) == 1, 10, "kvsidecar registered")
        first_id = mine()[0]["instance_id"]
        assert f"registered with the coordinator as {first_id}" in sc.log_text()
        # LMCache's own CLI sees it.
        [q] = run_cli("0.5.6", [["query", "coordinator", "--api", "instances", "--url", co.url]])
        assert q["rc"] == 0, q
        assert f"127.0.0.1:{sc.http_port}" in q["out"] and first_id in q["out"], q["out"]

        # The coordinator restarts and forgets everyone: the next heartbeat's
        # 404 makes kvsidecar register again.
        co.stop()
        wait_until(lambda: "heartbeat failed" in sc.log_text(), 10, "the outage logged")
        assert sc.http_get("/readyz")[0] == 200
        co.start()
        wait_until(lambda: len(mine()) == 1, 15, "kvsidecar registered again")
        assert "registering again" in sc.log_text() or "registered with the coordinator" in \
            sc.log_text().split("heartbeat failed", 1)[1]

        # Shutdown: deregistered.
        sc.stop()
        sc = None
        assert mine() == []
    finally:
        if sc:
            sc.stop()
        co.stop()


class Garbage(http.server.BaseHTTPRequestHandler):
    calls = 0

    def _answer(self):
        Garbage.calls += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        body = b"{not json"
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_PUT = do_DELETE = do_GET = _answer

    def log_message(self, *a):
        pass


def test_a_coordinator_answering_garbage_or_absent_costs_nothing(tmp_path):
    srv = socketserver.TCPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        sc = sidecar(tmp_path / "g", f"http://127.0.0.1:{srv.server_address[1]}").start()
        try:
            wait_until(lambda: "with no JSON object" in sc.log_text(), 10, "the garbage named")
            assert sc.http_get("/readyz")[0] == 200
            # Logged once per kind of failure, not every heartbeat.
            seen = Garbage.calls
            wait_until(lambda: Garbage.calls >= seen + 3, 10, "three more registrations tried")
            assert sc.log_text().count("with no JSON object") == 1
        finally:
            sc.stop()
    finally:
        srv.shutdown()
        srv.server_close()
    nobody = sidecar(tmp_path / "n", f"http://127.0.0.1:{free_port_range(1)}").start()
    try:
        wait_until(lambda: "cannot connect" in nobody.log_text(), 10, "the refusal named")
        assert nobody.http_get("/readyz")[0] == 200
    finally:
        nobody.stop()


def test_event_reporting_without_lmcache_keys_is_refused(tmp_path):
    sc = sidecar(tmp_path, "http://127.0.0.1:9", **{"coordinator.event_reporting": True}).spawn()
    assert sc.proc.wait(timeout=10) != 0
    said = sc.log_text() + sc.out_path.read_text()
    assert "coordinator.event_reporting" in said and 'l2.format = \"lmcache\"' in said, said
