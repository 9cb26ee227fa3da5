"""Chaos on the cache's copy path (issue 8, items 1, 2 and the chaos tests),
with the real binary, host backend, loopback only:

- SIGTERM while STORE copies are in flight: exit 0 within
  sidecar.shutdown_timeout, never a crash (it used to SIGSEGV: L1 was
  unmapped by the store's exit while a copy still wrote into it).
- SIGTERM under a store/lookup/retrieve load of several client processes,
  10 times.
- An engine that shrinks its shared-memory pool after registering: only its
  own requests fail (with a log line naming the object); the process and the
  other clients are unaffected (it used to die of SIGBUS).
- Clients SIGKILLed mid-copy, in rounds: the server keeps serving, and locks,
  sessions, reservations and instances go back to zero once the (short) TTLs
  allow. RSS and open fds before/after are printed (run with -s to see them).

Run: KVSIDECAR_BIN=<build>/kvsidecar python3 -m pytest -q -s tests/integration/test_chaos_cache_copy.py
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.register_assert_rewrite("conftest_cache", "lmcache_client")

import _posixshmem
from conftest_cache import CHUNK, pages_equal, tokens  # first: puts tests/tools on sys.path
import shm_pool
from chaos_cache_client import unlink_objects_of
from kvsidecar_harness import wait_until
from lmcache_client import EVENT_HANDLE, MPClient, cache_key, pool_wrappers
from test_cache_server import lookup_wait

pytest_plugins = ["conftest_cache"]  # the cache_server and kv_pools fixtures

HERE = Path(__file__).resolve().parent
MODEL = "test-org/chaos"
PAGE = 16
PAGES_PER_CHUNK = CHUNK // PAGE
STORE_OK = b"\x92\xc4\x00\xc3"      # (b"", True) as msgspec encodes it
STORE_FAILED = b"\x92\xc4\x00\xc2"  # (b"", False): what LMCache's clients treat as failure
SHUTDOWN_TIMEOUT_S = 5.0


def blocks(first: int, n_chunks: int) -> list[int]:
    return list(range(first, first + n_chunks * PAGES_PER_CHUNK))


def register(c: MPClient, pools, instance: int) -> None:
    r = c.reply(c.submit("register_kv_cache", instance, pool_wrappers(pools), MODEL, 1, "sglang",
                         {"tokens_per_block": pools.block_size}, []))
    assert r.body is None, f"registration of {instance} failed: {r.frames}"


def store_key(toks: list[int], rid: str, worker: int | None = 0) -> dict:
    return cache_key(MODEL, 1, worker, toks, 0, len(toks) // CHUNK * CHUNK, rid)


def sigterm_and_wait(srv) -> float:
    """SIGTERMs the sidecar; asserts exit 0 within shutdown_timeout; returns the seconds taken."""
    sc = srv.sidecar
    t0 = time.monotonic()
    sc.send_signal(signal.SIGTERM)
    rc = sc.wait_exit(SHUTDOWN_TIMEOUT_S + 2.0)
    took = time.monotonic() - t0
    crash = f" (signal {signal.Signals(-rc).name})" if rc < 0 else ""
    assert rc == 0, f"exit status {rc}{crash}\n{sc.tail(25)}"
    assert took < SHUTDOWN_TIMEOUT_S, f"exit took {took:.2f}s > shutdown_timeout"
    assert "exited with status 0" in sc.log_text()
    return took


def usage(pid: int) -> dict[str, int]:
    """RSS (KiB, from /proc/<pid>/status) and open fds of a process."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "Threads"):
                out[key] = int(value.split()[0])
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def under_asan(pid: int) -> bool:
    """True when the process runs with AddressSanitizer (its quarantine keeps
    freed memory, so RSS says nothing about leaks there)."""
    with open(f"/proc/{pid}/maps") as f:
        return "libasan" in f.read()


# --- clients in their own processes -----------------------------------------------------


class ClientProcess:
    """chaos_cache_client.py: a store/lookup/retrieve loop until it is killed."""

    def __init__(self, endpoint: str, instance: int):
        self.proc = subprocess.Popen([sys.executable, str(HERE / "chaos_cache_client.py"),
                                      endpoint, str(instance)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def wait_ready(self, timeout: float = 10.0) -> None:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            self.kill()
            raise AssertionError(f"client not ready within {timeout}s: {line!r} "
                                 f"{self.proc.stderr.read().decode(errors='replace')[-2000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        unlink_objects_of(self.proc.pid)
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def clients():
    """Factory: clients(endpoint, instance) -> a started ClientProcess; all are
    SIGKILLed (and their shm objects unlinked) at teardown."""
    made: list[ClientProcess] = []

    def make(endpoint: str, instance: int) -> ClientProcess:
        c = ClientProcess(endpoint, instance)
        made.append(c)
        return c

    yield make
    for c in made:
        c.kill()


# --- item 1: SIGTERM while copies are in flight -------------------------------------------


def test_sigterm_while_store_copies_are_in_flight_exits_0(cache_server):
    """Pools with 2 MiB chunks, eight pipelined STOREs of 12 chunks each, SIGTERM as
    soon as the first is answered: the others' copies are queued or running when
    the store actor is told to exit. Before the fix 10 of 10 runs died of SIGSEGV."""
    # 4 layers x 256 tokens x 1 KiB per token and layer, K and V: 2 MiB per chunk.
    took = []
    with shm_pool.sglang_mha_pools(4, 12 * PAGES_PER_CHUNK, PAGE, 8, 64, prefix="kvs_ct") as pools:
        for run in range(10):
            srv = cache_server(overrides={"cache.l1_size": "256MiB",
                                          "sidecar.shutdown_timeout": f"{SHUTDOWN_TIMEOUT_S:g}s"})
            c = srv.client()
            register(c, pools, 1)
            uids = [c.submit("store", store_key(tokens(12, salt=100 * run + k), f"r{run}-{k}"),
                             1, [blocks(0, 12)], EVENT_HANDLE) for k in range(8)]
            assert c.reply(uids[0]).body == STORE_OK
            took.append(sigterm_and_wait(srv))
            c.close()
    print(f"\nSIGTERM with STORE copies in flight: 10 of 10 runs exited 0, in "
          f"{min(took):.3f}..{max(took):.3f}s")


def test_sigterm_under_store_retrieve_load_exits_0_ten_times(cache_server, clients):
    took = []
    for run in range(10):
        srv = cache_server(overrides={"sidecar.shutdown_timeout": f"{SHUTDOWN_TIMEOUT_S:g}s"})
        load = [clients(srv.endpoint, 10 * run + k) for k in range(2)]
        for c in load:
            c.wait_ready()
        took.append(sigterm_and_wait(srv))
        for c in load:
            c.kill()
    print(f"\nSIGTERM under load: 10 of 10 runs exited 0, in {min(took):.3f}..{max(took):.3f}s")


# --- item 2: a pool shrunk after registration ------------------------------------------------


def shrink(obj: shm_pool.ShmObject, size: int) -> None:
    fd = _posixshmem.shm_open(obj.name, os.O_RDWR, mode=0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def test_pool_shrunk_after_registration_fails_only_its_requests(cache_server, kv_pools):
    srv = cache_server()
    victim, other = kv_pools("sglang", seed=1), kv_pools("sglang", seed=2)
    bad, good = srv.client(), srv.client()
    register(bad, victim, 5001)
    register(good, other, 5002)
    toks = tokens(4, salt=31)
    assert good.reply(good.submit("store", store_key(toks, "g1"), 5002, [blocks(0, 4)],
                                  EVENT_HANDLE)).body == STORE_OK
    srv.wait_stats(lambda s: s["stored"] >= 4, what="stored>=4")

    # The engine cuts its first K pool to one page: touching the rest raises SIGBUS.
    shrink(victim.objects[0], 4096)
    mark = srv.mark()
    r = bad.reply(bad.submit("store", store_key(tokens(4, salt=32), "b1"), 5001, [blocks(0, 4)],
                             EVENT_HANDLE))
    assert r.body == STORE_FAILED
    # A RETRIEVE reads what its request's LOOKUP found (as in LMCache): look
    # up first, so the copy itself is what fails.
    assert lookup_wait(bad, toks, "b2", model=MODEL) == 4
    r = bad.reply(bad.submit("retrieve", store_key(toks, "b2"), 5001, [blocks(80, 4)],
                             EVENT_HANDLE, 0))
    assert r.body == STORE_FAILED
    name = victim.objects[0].name
    for what in ("store", "retrieve"):
        srv.wait_log(rf"WARN .*{what} copy refused: shm_truncated: shared-memory object "
                     rf"'{name}' no longer backs byte \d+ of the \d+ registered", mark)
    assert srv.sidecar.running()

    # Everyone else is served as before, byte for byte.
    assert lookup_wait(good, toks, "g2", model=MODEL) == 4
    r = good.reply(good.submit("retrieve", store_key(toks, "g2"), 5002, [blocks(80, 4)],
                               EVENT_HANDLE, 0))
    assert r.body == STORE_OK
    assert pages_equal(other, blocks(80, 4), other, blocks(0, 4)) == []
    for rid in ("b1", "b2", "g1", "g2"):
        (bad if rid[0] == "b" else good).end_session(rid)
    # The failed requests left no reservation, lock or session behind.
    srv.wait_idle()
    srv.wait_stats(lambda s: s["failed"] >= 2, actor="gpu_transfer", what="failed>=2")

    # Registering the shrunk pool again is refused when it is mapped, naming the sizes.
    mark = srv.mark()
    uid = bad.submit("register_kv_cache", 5003, pool_wrappers(victim), MODEL, 1, "sglang",
                     {"tokens_per_block": PAGE}, [])
    srv.wait_log(rf"register_kv_cache of instance 5003 failed: .*'{name}' has 4096 bytes, but the "
                 r"descriptor declares \d+", mark)
    assert bad.failure(uid).startswith("kvsidecar: register_kv_cache")
    assert good.noop() == "OK"


# --- chaos: clients SIGKILLed mid-copy ------------------------------------------------------


def test_sigkilled_clients_mid_copy_leave_nothing_behind(cache_server, clients, kv_pools):
    # No subscribe_kv_events log: it keeps up to kv_event_log_size records of
    # every stored chunk (~2 KiB each with its tokens), so it grows by design
    # with each store until full and would be counted as growth below (it
    # was 4-5 MiB of this test's ~5 MiB before/after difference).
    srv = cache_server(overrides={"cache.session_ttl": "500ms", "cache.lock_ttl": "500ms",
                                  "cache.heartbeat_timeout": "1s", "cache.l1_size": "16MiB",
                                  "cache.kv_event_log_size": 0})
    pid = srv.sidecar.proc.pid
    # Warm-up: one client until L1 is full and evicting, so that every L1
    # page has been touched (L1 is reserved at start, faulted in on use) and
    # the baseline below holds the steady-state footprint.
    warm = clients(srv.endpoint, 900)
    warm.wait_ready()
    srv.wait_stats(lambda s: s["evicted"] > 0, timeout=20.0, what="evicted>0 (L1 full)")
    warm.kill()
    srv.wait_stats(lambda s: s["instances"] == 0, actor="registry", timeout=5.0,
                   what="instances=0 (warm-up client reaped)")
    srv.wait_idle(timeout=5.0)
    before = usage(pid)

    rounds, per_round = 5, 3
    recovery = []
    for rnd in range(rounds):
        batch = [clients(srv.endpoint, 1000 + rnd * per_round + k) for k in range(per_round)]
        for c in batch:
            c.wait_ready()
        for c in batch:  # mid-loop: requests and copies in flight
            c.kill()
        killed_at = time.monotonic()
        mark = srv.mark()
        srv.wait_stats(lambda s: s["instances"] == 0, actor="registry", mark=mark, timeout=5.0,
                       what="instances=0 (killed clients reaped)")
        srv.wait_idle(timeout=5.0, mark=mark)
        recovery.append(time.monotonic() - killed_at)

    # Still serving, bit-exact.
    pools = kv_pools("sglang", seed=5)
    c = srv.client()
    register(c, pools, 7000)
    toks = tokens(4, salt=77)
    stored = srv.wait_stats(lambda s: True)["stored"]
    assert c.reply(c.submit("store", store_key(toks, "after"), 7000, [blocks(0, 4)],
                            EVENT_HANDLE)).body == STORE_OK
    # Committed, then visible to the lookup that the retrieve reads.
    srv.wait_stats(lambda s: s["stored"] >= stored + 4, what=f"stored>={stored + 4}")
    assert lookup_wait(c, toks, "after", model=MODEL) == 4
    r = c.reply(c.submit("retrieve", store_key(toks, "after"), 7000, [blocks(80, 4)],
                         EVENT_HANDLE, 0))
    assert r.body == STORE_OK
    assert pages_equal(pools, blocks(80, 4), pools, blocks(0, 4)) == []
    c.end_session("after")
    c.close()
    srv.clients.remove(c)

    # No fd leak: sockets of dead peers and shm mappings of reaped instances are gone.
    after = wait_until(lambda: (lambda u: u if u["fds"] <= before["fds"] else None)(usage(pid)),
                       5.0, f"fds back to {before['fds']}")
    mib = lambda kib: f"{kib / 1024:.1f}MiB"  # noqa: E731
    print(f"\nSIGKILLed clients: {rounds * per_round} in {rounds} rounds; locks, sessions, "
          f"reservations and instances back to 0 after {min(recovery):.2f}..{max(recovery):.2f}s "
          f"(session_ttl/lock_ttl 500ms, heartbeat_timeout 1s)")
    print(f"sidecar before: VmRSS {mib(before['VmRSS'])} (anon {mib(before['RssAnon'])}, shmem "
          f"{mib(before['RssShmem'])}) fds {before['fds']} threads {before['Threads']}")
    print(f"sidecar after:  VmRSS {mib(after['VmRSS'])} (anon {mib(after['RssAnon'])}, shmem "
          f"{mib(after['RssShmem'])}) fds {after['fds']} threads {after['Threads']}")
    # Memory: L1 is reused, not grown; reaped pools are unmapped (what is
    # left in RssShmem is the last client's, still registered: 512 KiB).
    assert after["RssShmem"] <= before["RssShmem"] + 1024, (before, after)
    if not under_asan(pid):
        assert after["VmRSS"] <= before["VmRSS"] + 8 * 1024, (before, after)
    assert after["Threads"] == before["Threads"], (before, after)
