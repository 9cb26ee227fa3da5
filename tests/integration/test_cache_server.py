"""kvsidecar as the LMCache 0.5.6 multi-process cache server, driven over
real sockets by a client that speaks LMCache's wire (lmcache_client.py) and
by the SGLang seed connector's request sequences (shared/seeds/002_*.txt),
with engine KV pools in host shared memory (gpu.backend = "host").

What is checked: reply bytes and frame shapes for every op; the bytes that
land in the engine's pages after store -> lookup -> retrieve, page for page,
for SGLang MHA and vLLM flash-attn layouts; read locks taken and given back
(the store's stats line) after every scenario; failure answers and the log
lines that explain them; events the cache publishes; isolation between
clients; heartbeat reaping; a thousand concurrent sessions.

Run: KVSIDECAR_BIN=<build>/kvsidecar python3 -m pytest -q tests/integration/test_cache_server.py
"""

from __future__ import annotations

import signal
import threading
import time

import msgspec
import pytest
import zmq

pytest.register_assert_rewrite("conftest_cache", "lmcache_client")

import vllm_structs as vs
from conftest_cache import CHUNK, changed_pages, pages_equal, snapshot_pages, tokens
from lmcache_client import (EVENT_HANDLE, OP_IDS, MPClient, SeedFlow, Sent, cache_key, encode_op,
                            encode_uid, pool_wrappers)

pytest_plugins = ["conftest_cache"]  # the cache_server and kv_pools fixtures

MODEL = "test-org/test-model"
PAGE = 16
PAGES_PER_CHUNK = CHUNK // PAGE
enc = msgspec.msgpack.encode

# Store results as msgspec encodes (bytes, bool): the host backend has no event.
STORE_OK = b"\x92\xc4\x00\xc3"
STORE_FAILED = b"\x92\xc4\x00\xc2"
# Slowest acceptable round trip for "answered at once / never blocked"
# (the waits that could block are 30-60 s long).
MAX_ROUND_TRIP = 1.5


def hexs(b: bytes) -> str:
    return b.hex()


def register(c: MPClient, pools, instance: int, layout: str = "sglang", world_size: int = 1,
             wrapper: str = "host_shm", model: str = MODEL):
    hints = {"tokens_per_block": pools.block_size} if layout == "sglang" else pools.layout_hints()
    r = c.reply(c.submit("register_kv_cache", instance, pool_wrappers(pools, wrapper), model,
                         world_size, layout, hints, []))
    assert r.body is None and len(r.frames) == 2, r.frames
    return r


def store(c: MPClient, instance: int, toks: list[int], rid: str, blocks: list[int],
          worker: int = 0, world_size: int = 1, start: int = 0, end: int | None = None,
          model: str = MODEL) -> bytes:
    end = len(toks) // CHUNK * CHUNK if end is None else end
    r = c.reply(c.submit("store", cache_key(model, world_size, worker, toks, start, end, rid),
                         instance, [blocks], EVENT_HANDLE))
    return r.body


def lookup_wait(c: MPClient, toks: list[int], rid: str, world_size: int = 1,
                model: str = MODEL) -> int:
    end = len(toks) // CHUNK * CHUNK
    ack = c.reply(c.submit("lookup", cache_key(model, world_size, None, toks, 0, end, rid),
                           world_size))
    assert ack.body is None and len(ack.frames) == 2
    return c.wait_prefetch_status(rid, 5.0)


def committed(srv, n: int) -> None:
    """STORE answers once the copy has started; the chunks become visible
    when it has completed (as in LMCache, whose finish_write runs as a stream
    callback). Waits until the store has committed n chunks in all."""
    srv.wait_stats(lambda s: s["stored"] >= n, what=f"stored>={n}")


def blocks(first: int, n_chunks: int) -> list[int]:
    return list(range(first, first + n_chunks * PAGES_PER_CHUNK))


# --- protocol, byte for byte ---------------------------------------------------------------


def test_get_chunk_size_golden_frames(cache_server):
    srv = cache_server()
    d = srv.ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(srv.endpoint)
    try:
        d.send_multipart([b"\x00", b"\x15"])  # uid 0, op 21
        assert d.poll(5000)
        assert d.recv_multipart() == [b"\x00", b"\x15", b"\xcd\x01\x00"]
        # By name: the str op frame is echoed as sent.
        d.send_multipart([b"\x01", b"\xaeget_chunk_size"])
        assert d.poll(5000)
        assert d.recv_multipart() == [b"\x01", b"\xaeget_chunk_size", b"\xcd\x01\x00"]
        # A uid past fixint (msgspec writes cc/cd/ce...) is echoed byte for byte.
        d.send_multipart([b"\xcd\x12\x34", b"\x18"])
        assert d.poll(5000)
        assert d.recv_multipart() == [b"\xcd\x12\x34", b"\x18", b"\xa2OK"]
    finally:
        d.close(linger=0)


def test_the_cache_server_runs_on_one_scheduler_thread_two_with_an_l2(cache_server, tmp_path):
    # sidecar.worker_threads = 0 (auto): the scheduled actors hand each
    # request on to each other on one thread (the copies run on the transfer
    # actor's own); with an L2 tier the store copies its fetches into L1 on
    # a scheduler thread, and a second one keeps the other sessions going.
    sc = cache_server().sidecar
    sc.wait_log(r"starting: events \w+, cache on, .* 1 worker thread\(s\)")
    assert sc.scheduler_threads() == 1
    assert sc.thread_names().count("engine_bridge") == 1, sc.thread_names()
    l2 = cache_server(overrides={"l2.disk.enabled": True,
                                 "l2.disk.path": str(tmp_path / "l2")}).sidecar
    l2.wait_log(r"starting: events \w+, cache on, .* 2 worker thread\(s\)")
    assert l2.scheduler_threads() == 2


def test_client_frames_are_lmcache_frames():
    """What MPClient sends, checked against hand-assembled msgspec bytes
    (the same rules test_cache_lmcache_client.py checks against LMCache)."""
    c = MPClient.__new__(MPClient)
    key = cache_key("m", 1, None, [1, 2], 0, 2, "r")
    assert c.frames_for("get_chunk_size", (), 0) == [b"\x00", b"\x15"]
    assert c.frames_for("noop", (), 300, by_name=True) == [b"\xcd\x01\x2c", b"\xa4noop"]
    assert c.frames_for("lookup", (key, 1), 5) == [
        b"\x05", b"\x08",
        b"\x8a\xaamodel_name\xa1m\xaaworld_size\x01\xa9worker_id\xc0\xa9token_ids\x92\x01\x02"
        b"\xa5start\x00\xa3end\x02\xaarequest_id\xa1r\xaacache_salt\xa0\xafrequest_configs\xc0"
        b"\xaenum_kv_readers\x00",
        b"\x01"]
    # int/bool arguments are coerced as mq.py does; a float timeout stays a float.
    assert c.frames_for("clear", (0,), 1)[2:] == [b"\xc2"]
    assert c.frames_for("wait_prefetch_status", ("r", 2.5), 1)[2:] == [b"\xa1r", enc(2.5)]
    assert c.frames_for("ping", (None,), 1)[2:] == [b"\xc0"]
    assert encode_op("prepare_store") == b"\x10"  # 16 in LMCache's legacy table
    assert encode_op("subscribe_kv_events") == b"\xb3subscribe_kv_events"  # by name


@pytest.mark.parametrize("by_name", [False, True], ids=["op-id", "op-name"])
def test_every_op_answers_as_lmcache(cache_server, kv_pools, by_name):
    srv = cache_server()
    c = srv.client()
    pools = kv_pools("sglang")
    toks = tokens(2)

    def reply(op, *args):
        r = c.reply(c.submit(op, *args, by_name=by_name))
        want_op = enc(op) if by_name else enc(OP_IDS[op])
        assert r.op_frame == want_op
        return r

    def none(op, *args):
        r = reply(op, *args)
        assert len(r.frames) == 2, f"{op}: expected no body frame (None), got {r.frames!r}"

    def body(op, *args):
        r = reply(op, *args)
        assert len(r.frames) == 3, f"{op}: expected a body frame, got {r.frames!r}"
        return r.body

    assert body("get_chunk_size") == b"\xcd\x01\x00"
    assert body("noop") == b"\xa2OK"
    assert body("ping", None) == b"\xc3"
    assert body("ping", 4242) == b"\xc3"
    assert body("get_experimental") == b"\x91\xafkv_event_stream"
    assert body("query_prefetch_status", "nobody") == b"\x00"
    assert body("wait_prefetch_status", "nobody", 1.0) == b"\x00"
    none("query_prefetch_lookup_hits", "nobody")
    none("free_lookup_locks", cache_key(MODEL, 1, None, toks, 0, 512, "nobody"), 1)
    none("end_session", "nobody")
    none("clear", False)
    none("register_kv_cache", 77, pool_wrappers(pools), MODEL, 1, "sglang",
         {"tokens_per_block": PAGE}, [])
    assert body("store", cache_key(MODEL, 1, 0, toks, 0, 512, "r1"), 77, [blocks(0, 2)],
                EVENT_HANDLE) == STORE_OK
    committed(srv, 2)
    none("lookup", cache_key(MODEL, 1, None, toks, 0, 512, "r2"), 1)
    assert body("wait_prefetch_status", "r2", 5.0) == b"\x02"
    assert body("query_prefetch_lookup_hits", "r2") == b"\x02"
    # The first non-None answer consumed the prefetch job.
    assert body("query_prefetch_status", "r2") == b"\x00"
    assert body("retrieve", cache_key(MODEL, 1, 0, toks, 0, 512, "r2"), 77, [blocks(64, 2)],
                EVENT_HANDLE, 0) == STORE_OK
    assert not pages_equal(pools, blocks(64, 2), pools, blocks(0, 2))
    none("end_session", "r2")
    none("end_session", "r1")
    none("unregister_kv_cache", 77)
    none("unregister_kv_cache", 77)  # unknown now: still None, as LMCache answers
    srv.wait_log(r"registry#\d+ unregister_kv_cache of unknown instance 77")
    # Pre-0.5.6 clients send CLEAR without the force argument.
    if not by_name:
        uid = c.next_uid()
        c.send_frames([encode_uid(uid), encode_op("clear")])
        r = c.reply(uid)
        assert r.frames == [encode_uid(uid), b"\x14"]
    srv.wait_idle()


def test_replies_matched_by_uid_when_pipelined(cache_server):
    srv = cache_server()
    c = srv.client()
    ops = [("noop", ()), ("get_chunk_size", ()), ("ping", (None,)), ("end_session", ("x",)),
           ("query_prefetch_status", ("y",)), ("get_experimental", ())]
    want = {"noop": "OK", "get_chunk_size": 256, "ping": True, "end_session": None,
            "query_prefetch_status": 0, "get_experimental": ["kv_event_stream"]}
    sent = [(c.submit(op, *args), op) for _ in range(50) for op, args in ops]
    for uid, op in reversed(sent):
        assert c.result(uid) == want[op], op


# --- the seed connector's flows ----------------------------------------------------------------


@pytest.mark.parametrize("wrapper", ["host_shm", "cpu_shm"])
@pytest.mark.parametrize("layout", ["sglang", "vllm"])
def test_seed_flow_store_then_hit_and_retrieve(cache_server, kv_pools, layout, wrapper):
    srv = cache_server()
    pools = kv_pools(layout)
    flow = SeedFlow(srv.client(), pools, MODEL, instance_id=4001, engine=layout,
                    wrapper_kind=wrapper)
    assert flow.register() is None
    srv.wait_log(r"instance 4001 registered: .*layout "
                 + ("sglang_mha" if layout == "sglang" else "vllm_flash_attn"))
    toks = tokens(4, salt=1) + [5, 6, 7]  # a partial trailing chunk is ignored
    # Request 1 misses, computes, stores, ends.
    assert flow.lookup_kv(toks, "req-1") == 0
    assert flow.store_kv(toks, "req-1", blocks(0, 4)) is True
    flow.end_session("req-1")
    flow.drain()
    srv.wait_stats(lambda s: s["chunks"] == 4 and s["stored"] == 4, what="4 chunks stored")
    # Request 2 hits all four chunks and retrieves them into other pages.
    before = snapshot_pages(pools, [0] + blocks(0, 4))
    assert flow.lookup_kv(toks, "req-2") == 4 * CHUNK
    srv.wait_locks(4)
    assert flow.retrieve_kv("req-2", blocks(80, 4)) == 4 * CHUNK
    assert not pages_equal(pools, blocks(80, 4), pools, blocks(0, 4))
    assert not changed_pages(pools, before), "a retrieve wrote into pages it was not given"
    srv.wait_locks(0)
    flow.end_session("req-2")
    flow.drain()
    srv.wait_idle()
    assert flow.close() is None
    srv.wait_log(r"instance 4001 unregistered")


@pytest.mark.parametrize("layout", ["sglang", "vllm"])
def test_partial_hit(cache_server, kv_pools, layout):
    srv = cache_server()
    pools = kv_pools(layout)
    flow = SeedFlow(srv.client(), pools, MODEL, 4002, engine=layout)
    flow.register()
    toks = tokens(4, salt=2)
    assert flow.store_kv(toks[: 2 * CHUNK], "req-s", blocks(0, 2))
    flow.c.end_session("req-s")
    committed(srv, 2)
    assert flow.lookup_kv(toks, "req-p") == 2 * CHUNK
    srv.wait_locks(2)
    untouched = snapshot_pages(pools, blocks(112, 2))
    assert flow.retrieve_kv("req-p", blocks(80, 2)) == 2 * CHUNK
    assert not pages_equal(pools, blocks(80, 2), pools, blocks(0, 2))
    assert not changed_pages(pools, untouched)
    srv.wait_locks(0)
    flow.end_session("req-p")
    flow.drain()
    srv.wait_idle()


@pytest.mark.parametrize("layout", ["sglang", "vllm"])
def test_retrieve_skips_prefix_pages(cache_server, kv_pools, layout):
    """offset = one chunk already in the engine's radix tree (its locks freed
    by retrieve's leading FREE_LOOKUP_LOCKS [0, offset)), prefix_pad = three
    pages of the next chunk present too: the skipped pages (placeholder id 0)
    are not written. SGLang sends pages in the skip slot, vLLM tokens."""
    srv = cache_server()
    pools = kv_pools(layout)
    flow = SeedFlow(srv.client(), pools, MODEL, 4003, engine=layout)
    flow.register()
    toks = tokens(4, salt=3)
    assert flow.store_kv(toks, "req-s", blocks(1, 4))  # page 0 is the placeholder
    flow.c.end_session("req-s")
    committed(srv, 4)
    assert flow.lookup_kv(toks, "req-k") == 4 * CHUNK
    srv.wait_locks(4)
    pad = 3 * PAGE
    src = blocks(1, 4)[PAGES_PER_CHUNK + 3:]  # pages of tokens [256 + 48, 1024)
    dst = list(range(100, 100 + len(src)))
    sentinel = snapshot_pages(pools, [0])
    assert flow.retrieve_kv("req-k", dst, offset=CHUNK, prefix_pad=pad) == 3 * CHUNK
    assert not changed_pages(pools, sentinel), "a skipped prefix page was written"
    assert not pages_equal(pools, dst, pools, src)
    srv.wait_locks(0)
    flow.end_session("req-k")
    flow.drain()
    srv.wait_idle()


def test_incremental_and_overlapping_stores(cache_server, kv_pools):
    """Block ids cover the key's [start, end) only; chunks L1 already holds
    are not copied again; the chain of parents crosses stores."""
    srv = cache_server(events=True)
    pools = kv_pools("sglang")
    c = srv.client()
    register(c, pools, 4010)
    toks = tokens(4, salt=20)
    assert store(c, 4010, toks[: 2 * CHUNK], "s1", blocks(0, 2)) == STORE_OK
    first = srv.events(2, kind=vs.BlockStored)
    # The next two chunks only (vLLM stores as it computes): start = 512.
    assert store(c, 4010, toks, "s1", blocks(40, 2), start=2 * CHUNK) == STORE_OK
    second = srv.events(2, kind=vs.BlockStored)
    assert second[0].parent_block_hash == first[1].block_hashes[0]
    assert second[0].token_ids == toks[2 * CHUNK: 3 * CHUNK]
    # All four again from other pages: nothing new is stored or announced.
    assert store(c, 4010, toks, "s1", blocks(80, 4)) == STORE_OK
    srv.wait_stats(lambda s: s["chunks"] == 4 and s["stored"] == 4)
    srv.assert_no_events()
    assert lookup_wait(c, toks, "r") == 4
    assert c.retrieve(cache_key(MODEL, 1, 0, toks, 0, 4 * CHUNK, "r"), 4010,
                      [blocks(96, 4)]) == [b"", True]
    assert not pages_equal(pools, blocks(96, 4), pools, blocks(0, 2) + blocks(40, 2))
    c.end_session("r")
    c.end_session("s1")
    srv.wait_idle()


def test_tp2_scheduler_lookup_hits_only_chunks_every_rank_has(cache_server, kv_pools):
    srv = cache_server()
    p0, p1 = kv_pools("sglang", seed=10), kv_pools("sglang", seed=11)
    w0 = SeedFlow(srv.client(), p0, MODEL, 5000, tp_size=2, rank=0)
    w1 = SeedFlow(srv.client(), p1, MODEL, 5001, tp_size=2, rank=1)
    w0.register()
    w1.register()
    toks = tokens(4, salt=4)
    assert w0.store_kv(toks, "req-s", blocks(0, 4))
    assert w1.store_kv(toks[: 2 * CHUNK], "req-s", blocks(0, 2))
    w0.c.end_session("req-s")
    srv.wait_stats(lambda s: s["chunks"] == 6, what="4 + 2 chunks")
    # The seed runs lookup_kv on every TP worker: each sends a scheduler-style
    # LOOKUP (worker_id nil) for the request, which hits only the chunks both
    # ranks hold; the second replaces the first one's locks.
    assert w0.lookup_kv(toks, "req-t") == 2 * CHUNK
    assert w1.lookup_kv(toks, "req-t") == 2 * CHUNK
    srv.wait_locks(4)  # 2 chunks x 2 ranks, once
    assert w0.retrieve_kv("req-t", blocks(80, 2)) == 2 * CHUNK
    srv.wait_locks(2)  # rank 1's share is still held
    assert w1.retrieve_kv("req-t", blocks(80, 2)) == 2 * CHUNK
    srv.wait_locks(0)
    # Each worker got its own shard.
    assert not pages_equal(p0, blocks(80, 2), p0, blocks(0, 2))
    assert not pages_equal(p1, blocks(80, 2), p1, blocks(0, 2))
    assert p0.page(0, 0, 80) != p1.page(0, 0, 80)
    # A scheduler (another client) sees the same: and a world_size-1 key is
    # another cache identity.
    sched = srv.client()
    assert lookup_wait(sched, toks, "req-u", world_size=2) == 2
    assert lookup_wait(sched, toks, "req-v", world_size=1) == 0
    srv.wait_locks(4)
    # A worker-specific FREE_LOOKUP_LOCKS frees only that rank's share
    # (LMCache 0.5.6 resolves a key with worker_id to that rank's objects).
    assert sched.free_lookup_locks(cache_key(MODEL, 2, 0, toks, 0, 2 * CHUNK, "req-u"), 2) is None
    srv.wait_locks(2)
    assert sched.free_lookup_locks(cache_key(MODEL, 2, 1, toks, 0, 2 * CHUNK, "req-u"), 2) is None
    srv.wait_locks(0)
    for rid in ("req-u", "req-v"):
        sched.end_session(rid)
    w0.end_session("req-t")
    w1.end_session("req-t")
    w0.drain()
    w1.drain()
    srv.wait_idle()


def test_free_lookup_locks_paths(cache_server, kv_pools):
    srv = cache_server()
    pools = kv_pools("sglang")
    flow = SeedFlow(srv.client(), pools, MODEL, 4004)
    flow.register()
    toks = tokens(4, salt=5)
    assert flow.store_kv(toks, "req-s", blocks(0, 4))
    flow.c.end_session("req-s")
    committed(srv, 4)
    # release_pending: the radix tree covers the hit, no RETRIEVE follows.
    assert flow.lookup_kv(toks, "req-a") == 4 * CHUNK
    srv.wait_locks(4)
    flow.release_pending("req-a")
    flow.drain()
    srv.wait_locks(0)
    flow.end_session("req-a")  # locks already released: only END_SESSION goes out
    flow.drain()
    # A key range frees exactly its chunks, on every rank.
    c = flow.c
    assert lookup_wait(c, toks, "req-b") == 4
    srv.wait_locks(4)
    assert c.free_lookup_locks(cache_key(MODEL, 1, None, toks, CHUNK, 3 * CHUNK, "req-b"), 1) is None
    srv.wait_locks(2)
    # Freeing the same range again releases nothing twice.
    assert c.free_lookup_locks(cache_key(MODEL, 1, None, toks, CHUNK, 3 * CHUNK, "req-b"), 1) is None
    srv.wait_locks(2)
    c.end_session("req-b")
    srv.wait_idle()
    # end_session of a request whose locks are still held frees them first.
    assert flow.lookup_kv(toks, "req-c") == 4 * CHUNK
    srv.wait_locks(4)
    flow.end_session("req-c")
    flow.drain()
    srv.wait_idle()


def test_repeated_lookup_releases_earlier_locks(cache_server, kv_pools):
    srv = cache_server()
    pools = kv_pools("sglang")
    flow = SeedFlow(srv.client(), pools, MODEL, 4005)
    flow.register()
    toks = tokens(4, salt=6)
    assert flow.store_kv(toks, "req-s", blocks(0, 4))
    c = flow.c
    c.end_session("req-s")
    committed(srv, 4)
    # The server itself releases what an earlier LOOKUP of the request holds.
    assert lookup_wait(c, toks, "req-r") == 4
    srv.wait_locks(4)
    assert lookup_wait(c, toks, "req-r") == 4
    srv.wait_locks(4)
    assert lookup_wait(c, toks[: 2 * CHUNK], "req-r") == 2
    srv.wait_locks(2)
    c.end_session("req-r")
    srv.wait_idle()
    # The seed's rescheduling pass: it frees the stale lookup, then looks up again.
    for _ in range(3):
        assert flow.lookup_kv(toks, "req-q") == 4 * CHUNK
        flow.drain()
        srv.wait_locks(4)
    flow.end_session("req-q")
    flow.drain()
    srv.wait_idle()


def test_killed_client_locks_and_session_expire(cache_server, kv_pools):
    # A lock TTL far beyond the test: only the session TTL can release them.
    srv = cache_server(overrides={"cache.session_ttl": "300ms", "cache.lock_ttl": "60s"})
    pools = kv_pools("sglang")
    flow = SeedFlow(srv.client(), pools, MODEL, 4006)
    flow.register()
    toks = tokens(4, salt=7)
    assert flow.store_kv(toks, "req-s", blocks(0, 4))
    flow.c.end_session("req-s")
    committed(srv, 4)
    doomed = srv.client()
    mark = srv.mark()
    assert lookup_wait(doomed, toks, "req-dead") == 4
    srv.wait_stats(lambda s: s["locks"] == 4, mark=mark)
    doomed.close()  # no RETRIEVE, no END_SESSION: its connection ends
    srv.wait_idle(timeout=3.0)
    srv.wait_log(r"connection \w+ ended: ended the 1 sessions only it used", mark=mark)
    # A client that stays connected but goes silent: session_ttl ends it.
    silent = srv.client()
    mark = srv.mark()
    assert lookup_wait(silent, toks, "req-silent") == 4
    srv.wait_stats(lambda s: s["locks"] == 4, mark=mark)
    srv.wait_idle(timeout=3.0)
    srv.wait_log(r"session req-silent idle past session_ttl", mark=mark)


def test_lock_ttl_expiry_never_steals_a_newer_lock(cache_server, kv_pools):
    """A lookup's locks expire (lock_ttl); another request then locks the
    same chunks. Ending the first request must not release the second's
    locks, and a retrieve after expiry still works while the chunks are there."""
    srv = cache_server(overrides={"cache.lock_ttl": "300ms"})
    pools = kv_pools("sglang")
    c = srv.client()
    register(c, pools, 4007)
    toks = tokens(4, salt=21)
    assert store(c, 4007, toks, "s", blocks(0, 4)) == STORE_OK
    committed(srv, 4)
    mark = srv.mark()
    assert lookup_wait(c, toks, "old") == 4
    srv.wait_locks(4)
    srv.wait_locks(0, timeout=3.0)
    srv.wait_log(r"store#\d+ expired: 4 read locks past lock_ttl", mark)
    assert lookup_wait(c, toks, "new") == 4
    srv.wait_locks(4)
    c.end_session("old")
    srv.wait_stats(lambda s: s["locks"] == 4 and s["sessions"] == 1)
    r = c.retrieve(cache_key(MODEL, 1, 0, toks, 0, 4 * CHUNK, "new"), 4007, [blocks(80, 4)])
    assert r == [b"", True]
    assert not pages_equal(pools, blocks(80, 4), pools, blocks(0, 4))
    srv.wait_locks(0)
    c.end_session("new")
    c.end_session("s")
    srv.wait_idle()


# --- failure paths ----------------------------------------------------------------------------


def test_store_with_too_few_block_ids_commits_nothing(cache_server, kv_pools):
    srv = cache_server()
    pools = kv_pools("sglang")
    c = srv.client()
    register(c, pools, 4100)
    toks = tokens(4, salt=8)
    mark = srv.mark()
    assert store(c, 4100, toks, "req-f", blocks(0, 3)) == STORE_FAILED
    srv.wait_log(r"too few block ids", mark=mark)
    srv.wait_stats(lambda s: s["chunks"] == 0 and s["reserved"] == 0 and s["stored"] == 0)
    assert lookup_wait(c, toks, "req-g") == 0
    assert lookup_wait(c, toks[:CHUNK], "req-h") == 0
    for rid in ("req-f", "req-g", "req-h"):
        c.end_session(rid)
    srv.wait_idle()


def test_retrieve_failures(cache_server, kv_pools):
    srv = cache_server()
    pools = kv_pools("sglang")
    c = srv.client()
    register(c, pools, 4101)
    toks = tokens(4, salt=9)
    untouched = snapshot_pages(pools, blocks(80, 4))
    # Nothing stored, no lookup: refused.
    mark = srv.mark()
    r = c.retrieve(cache_key(MODEL, 1, 0, toks, 0, 4 * CHUNK, "req-a"), 4101, [blocks(80, 4)])
    assert r == [b"", False]
    srv.wait_log(r"retrieve refused: no lookup of this request found chunks to retrieve", mark=mark)
    # Stored, but this request never looked it up: False, as LMCache 0.5.6
    # answers (its read needs the request's own lookup locks); after the
    # lookup the same retrieve succeeds.
    assert store(c, 4101, toks[:CHUNK], "req-s0", blocks(0, 1)) == STORE_OK
    committed(srv, 1)
    mark = srv.mark()
    key1 = cache_key(MODEL, 1, 0, toks[:CHUNK], 0, CHUNK, "req-n")
    assert c.retrieve(key1, 4101, [blocks(80, 1)]) == [b"", False]
    srv.wait_log(r"retrieve refused: no lookup of this request found", mark=mark)
    assert not changed_pages(pools, untouched)
    assert lookup_wait(c, toks[:CHUNK], "req-n") == 1
    assert c.retrieve(key1, 4101, [blocks(80, 1)]) == [b"", True]
    assert not pages_equal(pools, blocks(80, 1), pools, blocks(0, 1))
    c.end_session("req-n")
    untouched = snapshot_pages(pools, blocks(80, 4))
    # Two chunks stored, a retrieve of four fails, and gives back the locks
    # its lookup took.
    assert store(c, 4101, toks[: 2 * CHUNK], "req-s", blocks(0, 2)) == STORE_OK
    committed(srv, 2)
    assert lookup_wait(c, toks, "req-b") == 2
    srv.wait_locks(2)
    r = c.retrieve(cache_key(MODEL, 1, 0, toks, 0, 4 * CHUNK, "req-b"), 4101, [blocks(80, 4)])
    assert r == [b"", False]
    srv.wait_locks(0)
    # Unknown instance: refused, locks given back.
    assert lookup_wait(c, toks, "req-c") == 2
    srv.wait_locks(2)
    mark = srv.mark()
    r = c.retrieve(cache_key(MODEL, 1, 0, toks, 0, 2 * CHUNK, "req-c"), 999, [blocks(80, 2)])
    assert r == [b"", False]
    srv.wait_log(r"instance 999 is not registered", mark=mark)
    srv.wait_locks(0)
    assert store(c, 999, toks, "req-d", blocks(0, 4)) == STORE_FAILED
    srv.wait_stats(lambda s: s["chunks"] == 2 and s["reserved"] == 0)
    # No worker_id, or no full chunk in range: refused.
    r = c.retrieve(cache_key(MODEL, 1, None, toks, 0, 2 * CHUNK, "req-e"), 4101, [blocks(80, 2)])
    assert r == [b"", False]
    r = c.retrieve(cache_key(MODEL, 1, 0, toks, 0, 100, "req-e"), 4101, [blocks(80, 1)])
    assert r == [b"", False]
    assert store(c, 4101, toks, "req-e", blocks(0, 4), worker=None) == STORE_FAILED
    assert not changed_pages(pools, untouched)
    for rid in ("req-a", "req-b", "req-c", "req-d", "req-e", "req-s", "req-s0"):
        c.end_session(rid)
    srv.wait_idle()


def test_failed_registration_fails_the_call_at_once(cache_server, kv_pools):
    """LMCache's server sends nothing for a registration it cannot do (the
    connector fails on its 300 s timeout); kvsidecar fails the call at once
    with the reason, and logs it."""
    srv = cache_server(overrides={"cache.l1_size": "1MiB"})
    pools = kv_pools("sglang")
    c = srv.client()
    mark = srv.mark()
    # SGLang without tokens_per_block: the page size cannot be derived.
    uid = c.submit("register_kv_cache", 4102, pool_wrappers(pools), MODEL, 1, "sglang", {}, [])
    assert "register_kv_cache failed" in c.failure(uid)
    srv.wait_log(r"register_kv_cache of instance 4102 failed: .*tokens_per_block", mark=mark)
    # A shared-memory object that does not exist.
    w = pool_wrappers(pools)
    bad = msgspec.msgpack.decode(w[0].data)
    bad["shm_name"] = "/kvs_ct_does_not_exist"
    w[0] = msgspec.msgpack.Ext(0x4B, enc(bad))
    uid = c.submit("register_kv_cache", 4103, w, MODEL, 1, "sglang", {"tokens_per_block": PAGE}, [])
    assert "kvs_ct_does_not_exist" in c.failure(uid)
    srv.wait_log(r"register_kv_cache of instance 4103 failed: .*kvs_ct_does_not_exist", mark=mark)
    # One chunk larger than the whole L1 (2 MiB > 1 MiB).
    huge = kv_pools("sglang", heads=64, num_blocks=32)
    uid = c.submit("register_kv_cache", 4105, pool_wrappers(huge), MODEL, 1, "sglang",
                   {"tokens_per_block": PAGE}, [])
    why = c.failure(uid)
    assert "chunks of 2097152 bytes per rank do not fit in the L1 region of 1048576 bytes" in why
    srv.wait_log(r"register_kv_cache of instance 4105 failed: chunks of 2097152 bytes", mark=mark)
    # The failed instance's pools were closed; nothing is registered.
    assert c.noop() == "OK"
    srv.wait_stats(lambda s: s["instances"] == 0 and s["failed"] == 3, actor="registry")


def test_two_models_with_different_chunk_sizes_share_l1(cache_server, kv_pools):
    """Two models whose chunks differ in byte size (64 KiB and 128 KiB) are
    served side by side from the one L1: stored, looked up and retrieved
    bit-exact; under pressure the least recently used chunks go, whichever
    model they belong to, and BlockRemoved says which."""
    srv = cache_server(events=True, overrides={"cache.l1_size": "1MiB"})
    small, big = kv_pools("sglang", seed=40), kv_pools("sglang", heads=4, seed=41)
    c = srv.client()
    register(c, small, 4600, model="org/small")
    register(c, big, 4601, model="org/big")
    srv.wait_log(r"chunk slots of 128 KiB: 8 slots in L1 for instance 4601 \(2 instances, "
                 r"2 chunk sizes share L1\)")
    s_toks, b_toks = tokens(4, salt=50), tokens(2, salt=51)
    assert store(c, 4600, s_toks, "ss", blocks(0, 4), model="org/small") == STORE_OK
    assert store(c, 4601, b_toks, "sb", blocks(0, 2), model="org/big") == STORE_OK
    stored = srv.events(6, kind=vs.BlockStored)
    big_hashes = sorted(e.block_hashes[0] for e in stored[4:])
    assert [e.token_ids for e in stored[4:]] == [b_toks[:CHUNK], b_toks[CHUNK:]]
    srv.wait_stats(lambda s: s["chunks"] == 6)
    # Each model finds only its own chunks, and gets its own bytes back.
    assert lookup_wait(c, s_toks, "ls", model="org/small") == 4
    assert lookup_wait(c, b_toks, "lb", model="org/big") == 2
    assert lookup_wait(c, b_toks, "lx", model="org/small") == 0
    r = c.retrieve(cache_key("org/small", 1, 0, s_toks, 0, 4 * CHUNK, "ls"), 4600, [blocks(80, 4)])
    assert r == [b"", True]
    assert not pages_equal(small, blocks(80, 4), small, blocks(0, 4))
    r = c.retrieve(cache_key("org/big", 1, 0, b_toks, 0, 2 * CHUNK, "lb"), 4601, [blocks(80, 2)])
    assert r == [b"", True]
    assert not pages_equal(big, blocks(80, 2), big, blocks(0, 2))
    for rid in ("ls", "lb", "lx"):
        c.end_session(rid)
    srv.wait_locks(0)
    # 4 x 64 KiB + 2 x 128 KiB = 512 KiB of 1 MiB. Make the small model's
    # chunks the most recently used, then store 4 more big chunks: the 4th
    # would fill L1 to 100% (above evict_high, 90%), so the least recently
    # used go until the new chunk fits under evict_low (80%): the 2 old big
    # ones (256 KiB) are enough, the small model's chunks stay.
    assert lookup_wait(c, s_toks, "touch", model="org/small") == 4
    c.end_session("touch")
    srv.wait_locks(0)
    more = tokens(4, salt=52)
    assert store(c, 4601, more, "sm", blocks(0, 4), model="org/big") == STORE_OK
    removed = srv.events(2, kind=vs.BlockRemoved)
    assert sorted(e.block_hashes[0] for e in removed) == big_hashes
    srv.wait_stats(lambda s: s["evicted"] == 2 and s["chunks"] == 8)
    assert lookup_wait(c, b_toks, "l2", model="org/big") == 0
    assert lookup_wait(c, s_toks, "l3", model="org/small") == 4
    assert lookup_wait(c, more, "l4", model="org/big") == 4
    r = c.retrieve(cache_key("org/big", 1, 0, more, 0, 4 * CHUNK, "l4"), 4601, [blocks(80, 4)])
    assert r == [b"", True]
    assert not pages_equal(big, blocks(80, 4), big, blocks(0, 4))
    for rid in ("ss", "sb", "sm", "l2", "l3", "l4"):
        c.end_session(rid)
    srv.wait_idle()


def test_l1_full_of_locked_chunks_refuses_store(cache_server, kv_pools):
    srv = cache_server(overrides={"cache.l1_size": "1MiB", "cache.evict_high": 1.0,
                                  "cache.evict_low": 0.9})
    pools = kv_pools("sglang")
    c = srv.client()
    register(c, pools, 4200)
    slots = srv.slot_count()
    assert slots == 16, f"1 MiB of 64 KiB chunks is 16 slots, the log says {slots}"
    prefixes = [tokens(4, salt=100 + i) for i in range(4)]
    for i, toks in enumerate(prefixes):
        assert store(c, 4200, toks, f"s{i}", blocks(0, 4)) == STORE_OK
    srv.wait_stats(lambda s: s["chunks"] == 16)
    for i, toks in enumerate(prefixes):
        assert lookup_wait(c, toks, f"l{i}") == 4
    srv.wait_locks(16)
    mark = srv.mark()
    extra = tokens(1, salt=200)
    assert store(c, 4200, extra, "x", blocks(0, 1)) == STORE_FAILED
    srv.wait_log(r"store#\d+ store of 1 chunks on rank 0 refused: no space in L1: all_pinned "
                 r"\(no free run of 65536 bytes in L1: 1048576 of 1048576 bytes held by 16 "
                 r"read-locked and 0 reserved chunks", mark)
    srv.wait_log(r"session\[rid=x\].* store of 1 chunks refused: no space in L1: all_pinned", mark)
    srv.wait_stats(lambda s: s["refused"] == 1 and s["chunks"] == 16 and s["reserved"] == 0)
    # Once the readers are gone the same store evicts and succeeds.
    for i in range(4):
        c.end_session(f"l{i}")
    srv.wait_locks(0)
    assert store(c, 4200, extra, "x", blocks(0, 1)) == STORE_OK
    srv.wait_stats(lambda s: s["evicted"] >= 1 and s["stored"] == 17)
    assert lookup_wait(c, extra, "y") == 1
    for rid in ["x", "y"] + [f"s{i}" for i in range(4)]:
        c.end_session(rid)
    srv.wait_idle()


def test_eviction_is_lru_and_published(cache_server, kv_pools):
    """16 slots, evict above 14 down to 12. A, B, C fill 12; a lookup makes
    A most recently used; storing D evicts B0..B2 (the least recently used)
    and publishes BlockRemoved for them. Every stored chunk was announced
    as BlockStored (medium CPU, block_size = chunk, parent = previous chunk)."""
    srv = cache_server(events=True, overrides={"cache.l1_size": "1MiB"})
    pools = kv_pools("sglang")
    c = srv.client()
    register(c, pools, 4300)
    assert srv.slot_count() == 16
    A, B, C, D = (tokens(4, salt=300 + i) for i in range(4))
    hashes: dict[str, list[int]] = {}
    for name, toks in (("A", A), ("B", B), ("C", C)):
        assert store(c, 4300, toks, f"s{name}", blocks(0, 4)) == STORE_OK
        evs = srv.events(4, kind=vs.BlockStored)
        assert len(evs) == 4, evs
        parent = None
        for i, e in enumerate(evs):
            assert len(e.block_hashes) == 1
            assert e.parent_block_hash == parent, f"{name}{i}: parent {e.parent_block_hash} != {parent}"
            assert e.token_ids == toks[i * CHUNK:(i + 1) * CHUNK]
            assert e.block_size == CHUNK and e.medium == "CPU" and e.lora_id is None
            parent = e.block_hashes[0]
        hashes[name] = [e.block_hashes[0] for e in evs]
    assert len({h for hs in hashes.values() for h in hs}) == 12
    assert lookup_wait(c, A, "touch-A") == 4
    c.end_session("touch-A")
    srv.wait_locks(0)
    srv.assert_no_events()
    assert store(c, 4300, D, "sD", blocks(0, 4)) == STORE_OK
    removed = srv.events(3, kind=vs.BlockRemoved)
    assert [e.block_hashes for e in removed] == [[h] for h in hashes["B"][:3]]
    assert all(e.medium == "CPU" for e in removed)
    stored = srv.events(4, kind=vs.BlockStored)
    assert stored[0].parent_block_hash is None and len(stored) == 4
    srv.wait_stats(lambda s: s["evicted"] == 3 and s["chunks"] == 13)
    assert lookup_wait(c, A, "la") == 4
    assert lookup_wait(c, B, "lb") == 0
    assert lookup_wait(c, C, "lc") == 4
    assert lookup_wait(c, D, "ld") == 4
    # CLEAR drops what nobody reads; the chunks locked by the lookups stay.
    c.clear(False)
    cleared = srv.events(1, kind=vs.BlockRemoved)
    assert [e.block_hashes for e in cleared] == [[hashes["B"][3]]]
    for rid in ("la", "lb", "lc", "ld", "sA", "sB", "sC", "sD"):
        c.end_session(rid)
    srv.wait_idle()
    c.clear(True)
    srv.events(12, kind=vs.BlockRemoved)
    srv.wait_stats(lambda s: s["chunks"] == 0)


# --- bad requests, isolation -------------------------------------------------------------------


class Pinger(threading.Thread):
    """Round trips from another client while something else happens; records
    the slowest one."""

    def __init__(self, endpoint: str, ctx: zmq.Context, ops=("ping", "get_chunk_size")):
        super().__init__(daemon=True)
        self.c = MPClient(endpoint, ctx)
        self.ops = ops
        self.stop = threading.Event()
        self.count = 0
        self.worst = 0.0
        self.error: BaseException | None = None

    def run(self):
        try:
            while not self.stop.is_set():
                for op in self.ops:
                    t0 = time.monotonic()
                    v = self.c.call(op, None) if op == "ping" else self.c.call(op)
                    self.worst = max(self.worst, time.monotonic() - t0)
                    assert v in (True, CHUNK), v
                    self.count += 1
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e
        finally:
            self.c.close()

    def finish(self) -> None:
        self.stop.set()
        self.join(10)
        assert not self.is_alive()
        assert self.error is None, repr(self.error)


def test_bad_requests_logged_failed_at_once_others_served(cache_server):
    """Every request with a uid is answered: one that cannot be decoded gets
    the failure reply (LMCache's own server sends nothing, and its client
    waits 300 s); stream control frames (empty op) and frames without a uid
    stay unanswered."""
    srv = cache_server()
    ident = b"bad-client"
    bad = srv.client(identity=ident)
    pinger = Pinger(srv.endpoint, srv.ctx)
    pinger.start()
    good_key = cache_key(MODEL, 1, None, [1] * CHUNK, 0, CHUNK, "r")
    no_model = dict(good_key)
    del no_model["model_name"]
    cases = [
        # (op frame, argument frames, kind, detail pattern)
        (enc(99), [], "unknown_op", ""),
        (enc("no_such_op"), [], "unknown_op", "no_such_op"),
        (enc("prepare_store"), [], "arity", "prepare_store"),
        (enc(3), [], "unsupported_op", "register_q_cache"),
        (enc(21), [enc(1)], "arity", ""),
        (enc(8), [enc(good_key)], "arity", ""),
        (enc(13), [b"\xc1"], "bad_arg", ""),
        (enc(13), [enc(5)], "bad_arg", ""),
        (enc(8), [enc({**good_key, "token_ids": "abc"}), enc(1)], "bad_arg", "token_ids"),
        (enc(8), [enc(no_model), enc(1)], "bad_arg", "model_name"),
        (enc(8), [enc({**good_key, "token_ids": [-1]}), enc(1)], "bad_arg", "token_ids"),
        (enc(12), [enc([1, 2, 3]), enc(1)], "bad_arg", ""),
    ]
    mark = srv.mark()
    for op_frame, args, kind, detail in cases:
        uid = bad.next_uid()
        bad.send_frames([encode_uid(uid), op_frame] + args)
        bad.sent[uid] = Sent(uid, [encode_uid(uid), op_frame] + args)
        why = bad.failure(uid)
        assert why.startswith(f"kvsidecar: {kind}: "), why
        assert detail in why, why
        pat = (rf"engine_bridge#\d+ bad request from peer {hexs(ident)} uid {hexs(encode_uid(uid))} "
               rf"op {hexs(op_frame)[:32]}: {kind}: .*{detail}")
        srv.wait_log(pat, mark)
    # Not answered: stream control for a stream that does not exist (empty
    # op frame, as LMCache's client sends ack/cancel), and a lone frame.
    bad.send_frames([encode_uid(900), b"", b"ack"])
    bad.send_frames([encode_uid(901)])
    bad.assert_no_reply(900, 0.2)
    bad.assert_no_reply(901, 0.1)
    # The same client is still served, and so was everyone else all along.
    assert bad.noop() == "OK"
    srv.wait_stats(lambda s: s["rejected"] == len(cases) + 2, actor="engine_bridge")
    pinger.finish()
    assert pinger.count >= 20
    # Generous for a loaded CI machine; a blocked bridge would show seconds.
    assert pinger.worst < MAX_ROUND_TRIP, f"a round trip took {pinger.worst:.3f}s"


def test_uid_frame_is_opaque(cache_server):
    """LMCache's server never decodes the uid frame and answers whatever it
    is; so does kvsidecar (it used to drop such requests)."""
    srv = cache_server()
    c = srv.client()
    for uid in (b"\xa1x", b"", b"\x01\x02", b"\xcf" + b"\xff" * 8):
        c.send_frames([uid, enc(24)])
        assert c.sock.poll(5000), f"no reply to uid frame {uid!r}"
        assert c.sock.recv_multipart() == [uid, enc(24), enc("OK")]
    srv.wait_stats(lambda s: s["rejected"] == 0, actor="engine_bridge")


def test_kv_event_log_off_is_not_advertised(cache_server):
    srv = cache_server(overrides={"cache.kv_event_log_size": 0})
    c = srv.client()
    assert c.get_experimental() == []
    # A subscriber anyway gets "enabled: false" once, then the end of the stream.
    uid = c.submit("subscribe_kv_events", 1, MODEL, 0, 8, by_name=True)
    r = c.reply(uid)
    batch = msgspec.msgpack.decode(r.body)
    assert batch == {"enabled": False, "incarnation": batch["incarnation"], "next_cursor": 0,
                     "lost": False, "events": []}
    c.send_frames([encode_uid(uid), b"", b"ack"])
    assert c.sock.poll(5000)
    assert c.sock.recv_multipart() == [encode_uid(uid), enc("subscribe_kv_events")]


def test_wait_prefetch_status_never_blocks_others(cache_server, kv_pools):
    srv = cache_server()
    pools = kv_pools("sglang")
    a = srv.client()
    register(a, pools, 4400)
    toks = tokens(4, salt=10)
    assert store(a, 4400, toks, "s", blocks(0, 4)) == STORE_OK
    committed(srv, 4)
    # No such request: 0 at once, whatever the timeout.
    t0 = time.monotonic()
    assert a.wait_prefetch_status("never-looked-up", 60.0) == 0
    assert time.monotonic() - t0 < MAX_ROUND_TRIP
    # Long waits pipelined behind their lookups, while another client keeps
    # doing round trips through the bridge and the store.
    pinger = Pinger(srv.endpoint, srv.ctx)
    pinger.start()
    pending = []
    for i in range(50):
        rid = f"w{i}"
        a.submit("lookup", cache_key(MODEL, 1, None, toks, 0, 4 * CHUNK, rid), 1)
        pending.append(a.submit("wait_prefetch_status", rid, 30.0))
        pending.append(a.submit("query_prefetch_status", rid))
    t0 = time.monotonic()
    results = [a.result(u, 10.0) for u in pending]
    assert time.monotonic() - t0 < 5.0
    # The wait returns the count; the query after it finds the job still
    # running (None) or already consumed by the wait (0).
    assert results[0::2] == [4] * 50, results
    assert set(results[1::2]) <= {None, 0}, results
    pinger.finish()
    assert pinger.worst < MAX_ROUND_TRIP, f"a round trip took {pinger.worst:.3f}s"
    for i in range(50):
        a.submit("end_session", f"w{i}")
    a.end_session("s")
    srv.wait_idle()


def test_heartbeat_reaping(cache_server, kv_pools):
    """LMCache 0.5.6's liveness rules with short timeouts: an instance that
    has pinged is reaped when silent for over heartbeat_timeout, one that
    never pinged only after registration_grace; store/retrieve traffic keeps
    an instance alive but does not make it ping-proven."""
    srv = cache_server(overrides={"cache.heartbeat_timeout": "500ms",
                                  "cache.registration_grace": "2s"})
    quiet_pools, live_pools = kv_pools("sglang", seed=20), kv_pools("sglang", seed=21)
    mute_pools = kv_pools("sglang", seed=22)
    c = srv.client()
    register(c, live_pools, 4501)
    toks, other = tokens(4, salt=11), tokens(2, salt=12)
    assert store(c, 4501, toks, "s", blocks(0, 4)) == STORE_OK
    committed(srv, 4)
    mark = srv.mark()
    register(c, quiet_pools, 4500)
    register(c, mute_pools, 4502)  # never pings (some adapters do not)
    mute_registered = time.monotonic()
    # A session that 4500 took part in, holding read locks; its one ping
    # makes it ping-proven.
    assert c.ping(4500) is True
    assert lookup_wait(c, toks, "req-q") == 4
    assert store(c, 4500, other, "req-q", blocks(0, 2)) == STORE_OK
    # Traffic from 4502: alive, but still not ping-proven.
    assert store(c, 4502, tokens(1, salt=15), "req-m", blocks(0, 1)) == STORE_OK
    mute_seen = time.monotonic()
    srv.wait_stats(lambda s: s["locks"] == 4)
    # 4501 pings (as the adapters' heartbeat thread does); 4500 stays silent.
    deadline = time.monotonic() + 5.0
    while not srv.find(r"instance 4500 silent for over 500ms \(heartbeat_timeout\): reaped", mark):
        assert c.ping(4501) is True
        assert time.monotonic() < deadline, srv.tail()
        time.sleep(0.05)
    srv.wait_log(r"instance 4500 reaped: ended its 1 sessions", mark)
    srv.wait_locks(0)
    # 4502, silent as long as 4500 but never pinged, is still registered.
    assert time.monotonic() - mute_seen < 2.0
    assert not srv.find(r"instance 4502 silent", mark)
    # The reaped instance is gone: its store fails.
    m2 = srv.mark()
    assert store(c, 4500, tokens(1, salt=13), "req-z", blocks(0, 1)) == STORE_FAILED
    srv.wait_log(r"instance 4500 is not registered", m2)
    # The grace runs out for 4502; 4501 keeps pinging and survives.
    deadline = time.monotonic() + 6.0
    while not srv.find(r"instance 4502 silent for over 2s \(registration_grace: it never "
                       r"pinged\): reaped", mark):
        assert c.ping(4501) is True
        assert time.monotonic() < deadline, srv.tail()
        time.sleep(0.05)
    assert time.monotonic() - mute_registered > 2.0
    assert not srv.find(r"instance 4501 silent", mark)
    assert store(c, 4501, tokens(1, salt=14), "req-y", blocks(0, 1)) == STORE_OK
    srv.wait_stats(lambda s: s["instances"] == 1 and s["reaped"] == 2, actor="registry")
    for rid in ("s", "req-z", "req-y", "req-m"):
        c.end_session(rid)
    srv.wait_idle()


def test_heartbeat_timeout_zero_never_reaps(cache_server, kv_pools):
    srv = cache_server(overrides={"cache.heartbeat_timeout": "0s",
                                  "cache.registration_grace": "0s"})
    c = srv.client()
    srv.wait_log(r"registry#\d+ started: instances are never reaped")
    register(c, kv_pools("sglang"), 4503)
    assert c.ping(4503) is True
    time.sleep(0.3)  # a reaper armed at 0 s would have reaped it many times over
    srv.wait_stats(lambda s: s["instances"] == 1 and s["reaped"] == 0, actor="registry")


def test_thousand_concurrent_sessions(cache_server, kv_pools):
    srv = cache_server()
    pools = kv_pools("sglang")
    c = srv.client()
    register(c, pools, 4600)
    toks = tokens(4, salt=15)
    assert store(c, 4600, toks, "s", blocks(0, 4)) == STORE_OK
    committed(srv, 4)
    c.end_session("s")
    n = 1000
    t0 = time.monotonic()
    acks = [c.submit("lookup", cache_key(MODEL, 1, None, toks, 0, 4 * CHUNK, f"r{i}"), 1)
            for i in range(n)]
    waits = [c.submit("wait_prefetch_status", f"r{i}", 30.0) for i in range(n)]
    assert all(c.reply(u, 20.0).body is None for u in acks)
    assert [c.result(u, 20.0) for u in waits] == [4] * n
    srv.wait_stats(lambda s: s["sessions"] == n and s["locks"] == 4 * n, timeout=10)
    srv.wait_stats(lambda s: s["sessions"] == n, actor="session_router", timeout=10)
    ends = [c.submit("end_session", f"r{i}") for i in range(n)]
    assert all(c.reply(u, 20.0).body is None for u in ends)
    srv.wait_idle(timeout=10)
    assert time.monotonic() - t0 < 30


# --- shutdown -------------------------------------------------------------------------------------


def test_sigterm_with_open_sessions_exits_promptly(cache_server, kv_pools):
    """A request that stored and never ended its session (the seed sends
    END_SESSION only after a LOOKUP), and one that looked up and then went
    away: SIGTERM must still stop the process within shutdown_timeout."""
    srv = cache_server()
    pools = kv_pools("sglang")
    c = srv.client()
    register(c, pools, 4700)
    toks = tokens(2, salt=16)
    assert store(c, 4700, toks, "stored-only", blocks(0, 2)) == STORE_OK
    committed(srv, 2)
    assert lookup_wait(c, toks, "looked-up") == 2
    srv.wait_stats(lambda s: s["sessions"] == 2, actor="session_router")
    srv.sidecar.send_signal(signal.SIGTERM)
    try:
        rc = srv.sidecar.wait_exit(7.0)
    except AssertionError:
        raise AssertionError("kvsidecar did not exit within 7 s of SIGTERM (shutdown_timeout 5 s) "
                             "with two sessions open:\n" + srv.tail()) from None
    assert rc == 0


def test_l1_is_announced_again_after_an_all_blocks_cleared(cache_server, kv_pools):
    """vLLM's reset_prefix_cache publishes AllBlocksCleared on the rank the
    cache server announces on: a router drops every block of the rank, the
    sidecar's CPU chunks with them, though L1 still serves them. Right after
    it the store announces what L1 holds again (same hashes, parents and
    tokens, oldest first); so it does after the restart fence of an engine
    that restarted."""
    srv = cache_server(events=True)
    pools = kv_pools("sglang")
    c = srv.client()
    register(c, pools, 4400)
    toks = tokens(3, salt=400)
    assert store(c, 4400, toks, "sA", blocks(0, 3)) == STORE_OK
    first = srv.events(3, kind=vs.BlockStored)
    assert [e.medium for e in first] == ["CPU"] * 3
    c.end_session("sA")

    # The engine's own AllBlocksCleared (reset_prefix_cache): the clear, then
    # L1's three chunks again, before anything else.
    srv.engine.send(0, vs.encoder.encode(vs.KVEventBatch(ts=time.time(),
                                                          events=[vs.AllBlocksCleared()])))
    evs = srv.events(4)
    assert isinstance(evs[0], vs.AllBlocksCleared), evs
    assert evs[1:] == first, evs
    srv.wait_stats(lambda s: s.get("reannounced") == 3)
    assert srv.sidecar.find(r"store#\d+ AllBlocksCleared on the events rank: 3 chunks of L1 "
                            r"announced again")

    # The engine restarts (its seq starts over): the sidecar's fence, then
    # the chunks again; the new engine's own batch is relayed as well.
    srv.engine.next_seq[0] = 0
    srv.engine.send(0, vs.encoder.encode(vs.KVEventBatch(ts=time.time(), events=[])))
    evs = srv.events(4)
    assert isinstance(evs[0], vs.AllBlocksCleared), evs
    assert evs[1:] == first, evs
    srv.wait_stats(lambda s: s.get("reannounced") == 6)
    srv.assert_no_events()
