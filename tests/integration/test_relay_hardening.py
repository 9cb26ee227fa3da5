"""The event relay against a hostile or flaky engine and stalled clients
(issue 8 items 3, 4, 5, 10; issue 10 items 2, 3): an oversized frame must not
leave the ingest deaf, every socket is bounded and its drops counted, a
forged or restarted engine stream is fenced with AllBlocksCleared instead of
counting 2^64 lost batches, and the engine's earlier batches are fetched
eagerly (at start and after a reconnect), not when it next publishes."""

import os
import socket
import time

import msgspec
import pytest
import zmq

import vllm_structs as vs
from kvsidecar_harness import (FakeEngine, Subscriber, free_port_range, is_fence, parse_stats,
                               read_replay, replay_batches, rss_kib, sanitized, wait_until)
from test_events_relay import big_batch, burst_with_fast_reader, join_stalled_subscriber

U64_MAX = (1 << 64) - 1


def batch_at(ts: float) -> bytes:
    return vs.encoder.encode(vs.KVEventBatch(ts=float(ts), events=[
        vs.BlockStored(block_hashes=[int(ts) + 1], parent_block_hash=None, token_ids=[1, 2],
                       block_size=2, lora_id=None, medium="GPU", lora_name=None)]))


def ts_of(payload: bytes) -> float:
    return msgspec.msgpack.decode(payload)[0]


def rebind_pub(engine: FakeEngine, ctx: zmq.Context, port: int, rank: int = 0) -> None:
    """The engine process restarts: its PUB goes away and a new one binds the
    same port."""
    engine.pubs[rank].close(linger=0)
    s = ctx.socket(zmq.PUB)
    s.setsockopt(zmq.LINGER, 0)

    def bound():
        try:
            s.bind(f"tcp://127.0.0.1:{port}")
            return True
        except zmq.ZMQError:
            return False
    wait_until(bound, 5, "the engine port to be free again")
    engine.pubs[rank] = s


def recv_until(sub: Subscriber, cond, timeout: float = 10.0, what: str = "batches"):
    """Receives on rank 0 until cond(list so far) holds; returns the list."""
    got = []
    deadline = time.monotonic() + timeout
    while not cond(got):
        left = deadline - time.monotonic()
        assert left > 0, f"timed out waiting for {what}; got seqs {[m.seq for m in got][-20:]}"
        m = sub.recv(0, min(left, 0.1))
        if m is not None:
            got.append(m)
    return got


# --- issue 8 item 3: an oversized frame must not deafen the ingest ----------------------


def test_oversized_frame_then_normal_batches_still_arrive(rig):
    """libzmq closes a connection on a frame above ZMQ_MAXMSGSIZE (a protocol
    error) and never re-dials it; the ingest notices through its socket
    monitor and re-dials."""
    r = rig(overrides={"events.ingest_max_message_size": "4KiB"})
    e = r.engine
    e.send(0, batch_at(1))
    assert ts_of(r.sub.recv_n(1)[0].payload) == 1
    e.send_frames(0, [b"", (99).to_bytes(8, "big"), b"\x93" + b"x" * 65536])  # > 4 KiB
    k = 0

    def arrived():
        nonlocal k
        e.send(0, batch_at(1000 + k))
        k += 1
        m = r.sub.recv(0, 0.05)
        return m is not None and ts_of(m.payload) >= 1000
    wait_until(arrived, 15, "a normal batch after the oversized frame")
    s = r.sidecar.wait_stats("ingest", lambda s: s["reconnects"] >= 1)
    assert s["disconnects"] >= 1, s
    assert len(r.sidecar.find(r"engine connection lost at .* re-dialling")) == 1, \
        "the loss is logged once per kind"


# --- issue 8 item 10 / issue 10 item 2: fencing ------------------------------------------


def test_forged_seq_jump_is_a_new_stream_not_2e64_lost(rig):
    # Every new stream fenced at once (restart_min_interval off): the
    # coalescing of a burst is tested below and in the unit tests.
    r = rig(overrides={"events.buffer_steps": 100, "events.restart_min_interval": "0s"})
    e = r.engine
    e.send(0, batch_at(1))
    e.send(0, batch_at(2), seq=U64_MAX - 2)  # forged: ~1.8e19 "missing" batches
    e.send(0, batch_at(3), seq=U64_MAX - 1)
    got = r.sub.recv_n(4)
    assert ts_of(got[0].payload) == 1
    assert is_fence(got[1].payload), "no AllBlocksCleared before the new stream"
    assert [ts_of(m.payload) for m in got[2:]] == [2, 3]
    assert [m.seq for m in got] == list(range(r.base[0], r.base[0] + 4))
    s = r.sidecar.wait_stats("ingest", lambda s: s["published"] >= r.ingested[0] + 4)
    assert s["lost"] == 0 and s["gaps"] == 0 and s["engine_restarts"] == 1, s
    # A jump within buffer_steps is still an ordinary gap, counted as lost.
    e.send(0, batch_at(4), seq=5)  # went back: a restart again
    e.send(0, batch_at(5), seq=5 + 1 + 50)
    got = r.sub.recv_n(3)
    assert is_fence(got[0].payload) and [ts_of(m.payload) for m in got[1:]] == [4, 5]
    s = r.sidecar.wait_stats("ingest", lambda s: s["lost"] == 50)
    assert s["engine_restarts"] == 2 and s["gaps"] == 1, s


def test_sidecar_start_publishes_the_fence_first_then_an_idle_engines_batches(rig):
    """Seq 0 of a fresh sidecar is AllBlocksCleared; an engine that holds
    earlier batches and publishes nothing more has them relayed at once."""
    r = rig(start=False, engine_replay="vllm5")
    e = r.engine
    for k in range(5):  # before the sidecar: only the engine's buffer has them
        e.send(0, batch_at(900 + k), live=False)
    r.start(sync=False)

    def all_kept():
        kept = replay_batches(r.replay(0), "vllm")
        return kept if len(kept) == 6 else None
    kept = wait_until(all_kept, 10, "the idle engine's batches to be caught up")
    assert [sq for sq, _ in kept] == list(range(6))
    assert is_fence(kept[0][1])
    assert [ts_of(p) for _, p in kept[1:]] == [900, 901, 902, 903, 904]
    s = r.sidecar.wait_stats("ingest", lambda s: s["caught_up"] == 5)
    assert s["received"] == 0, "caught up without the engine publishing again"


def test_engine_restart_new_process_is_fenced_and_caught_up(rig, zctx):
    """The engine process restarts: its connection drops and comes back with a
    new stream (seq from 0). Routers see AllBlocksCleared before any of its
    events; what it published while we were reconnecting comes from its
    replay without waiting for its next batch."""
    r = rig(engine_replay="vllm5")
    e = r.engine
    for k in range(3):
        e.send(0, batch_at(300 + k))
    got = r.sub.recv_n(3)
    assert [ts_of(m.payload) for m in got] == [300, 301, 302]
    with e._lock:
        e.history[0].clear()  # the new process's replay buffer starts empty
    e.next_seq[0] = 0
    rebind_pub(e, zctx, r.ingest_port)
    e.send(0, batch_at(310), live=False)  # published before we reconnected
    e.send(0, batch_at(311), live=False)
    got = recv_until(r.sub, lambda g: len(g) >= 3 and not is_fence(g[-1].payload),
                     what="fence + the new stream")
    assert is_fence(got[0].payload), got[0].payload
    # (A slow machine may split the detection and fence twice: harmless.)
    assert [ts_of(m.payload) for m in got if not is_fence(m.payload)][:2] == [310, 311]
    e.send(0, batch_at(312))
    m = r.sub.recv(0, 5)
    while m is not None and is_fence(m.payload):
        m = r.sub.recv(0, 5)
    assert m is not None and ts_of(m.payload) == 312
    r.sub.assert_silent(0, 0.2)
    s = r.sidecar.wait_stats("ingest", lambda s: s["engine_restarts"] >= 1 and s["reconnects"] >= 1)
    assert s["lost"] == 0, s


# --- issue 8 item 4: bounded sockets, counted drops ----------------------------------------


def test_flood_with_stalled_router_keeps_rss_bounded(rig, zctx):
    """Every queue on the relay path is bounded by config (ingest_hwm,
    max_queue_size, buffer_bytes, hwm): a flood while a router stalls costs
    at most about that much memory, and a second flood costs nothing more."""
    r = rig(overrides={"events.hwm": 100, "events.ingest_hwm": 100,
                       "events.max_queue_size": 100, "events.buffer_steps": 1000,
                       "events.buffer_bytes": "16MiB"})
    pid = r.sidecar.proc.pid
    stalled, base = join_stalled_subscriber(r, zctx)
    rss0 = rss_kib(pid)
    payload = big_batch(1)  # ~30 KB: 4000 of them are 120 MB

    def flood(n=4000):
        for _ in range(n):
            r.engine.send(0, payload)

        def marker():
            # Our own subscriber missed batches too (it did not read during
            # the flood): markers until one comes through show the relay is
            # past it.
            r.engine.send(0, batch_at(424242))
            m = r.sub.recv(0, 0.05)
            while m is not None:
                if ts_of(m.payload) == 424242:
                    return True
                m = r.sub.recv(0, 0)
            return False
        wait_until(marker, 30, "the relay to get through the flood")
        return rss_kib(pid)
    rss1 = flood()
    rss2 = flood()
    pub = r.sidecar.wait_stats("pub", lambda s: s["hwm_drops"] >= 1)
    ing = r.sidecar.stats("ingest")
    stalled.close(linger=0)
    print(f"flood: RSS {rss0} -> {rss1} -> {rss2} KiB, pub {pub}, ingest {ing}")
    # ~11 MB decoded+encoded in the queue, 3 MB in the ingest pipe, 16 MiB
    # of replay, 3 MB per subscriber pipe, plus allocator slack.
    if sanitized(pid):
        return
    assert rss1 - rss0 < 100 * 1024, f"RSS grew {rss0} -> {rss1} KiB under a 120 MB flood"
    # Not proportional to what was sent: a second 120 MB costs at most
    # allocator noise (glibc keeps freed memory per thread arena).
    assert rss2 - rss0 < 100 * 1024 and rss2 - rss1 < 40 * 1024, \
        f"a second flood grew RSS again: {rss0} -> {rss1} -> {rss2} KiB"


def flood_from_client_that_never_reads(zctx, endpoint: str, n: int) -> zmq.Socket:
    """Sends `n` get_chunk_size requests from a DEALER that never reads its
    replies and has tiny receive buffers, so replies back up to the
    sidecar's cache.hwm at once. Returns the socket: the caller keeps it
    open until the flood has arrived (closing it, linger 0, drops what is
    still queued)."""
    from lmcache_client import MPClient  # here: test_cache_server registers it for rewriting
    frames = MPClient.frames_for(None, "get_chunk_size", (), 1)
    c = zctx.socket(zmq.DEALER)
    c.setsockopt(zmq.LINGER, 0)
    c.setsockopt(zmq.RCVHWM, 10)
    c.setsockopt(zmq.RCVBUF, 4096)
    c.setsockopt(zmq.SNDHWM, 0)
    c.connect(endpoint)
    for _ in range(n):
        c.send_multipart(frames)
    return c


def answered_while_flooded(zctx, endpoint: str) -> int:
    """A well-behaved client's get_chunk_size, answered within 10 s."""
    from lmcache_client import MPClient
    good = MPClient(endpoint, zctx)
    try:
        return good.get_chunk_size(timeout=10.0)
    finally:
        good.close()


def engine_bridge_stats(sc) -> dict | None:
    for line in reversed(sc.lines()):
        if "engine_bridge#" in line and " stats: " in line:
            return parse_stats(line.split(" stats: ", 1)[1])
    return None


def cache_sidecar(sidecar, endpoint: str):
    sc = sidecar({"events.enabled": False, "cache.l1_size": "64MiB", "gpu.backend": "host",
                  "sidecar.stats_interval": "200ms", "cache.hwm": 100,
                  "cache.endpoint": endpoint})
    sc.start()
    # L1's start-up fault-in (64 MiB) is over before the tests measure RSS:
    # it is L1, not the flood (CI's release run saw +56 MiB when it was not).
    sc.wait_l1_resident()
    return sc


def test_cache_client_that_never_reads_loses_replies_past_hwm_counted(sidecar, zctx, tmp_path):
    # Over ipc:// so the client's backlog is ZeroMQ's and the socket's, not
    # loopback TCP's: with a 4 KiB SO_RCVBUF a loopback TCP connection can
    # stall on its own (seen in CI and reproduced: the client kept 580 KB
    # unacknowledged and retransmitted with back-off while the sidecar's
    # receive queue was empty), which says nothing about the sidecar. That
    # case is the next test.
    endpoint = f"ipc://{tmp_path}/cache.sock"
    sc = cache_sidecar(sidecar, endpoint)
    pid = sc.proc.pid
    rss0 = rss_kib(pid)
    # Under ASan the sidecar handles ~17,000 requests/s here.
    n = 100_000 if sanitized(pid) else 500_000
    flooder = flood_from_client_that_never_reads(zctx, endpoint, n)
    # Everyone else is still served while the flood is being worked off.
    assert answered_while_flooded(zctx, endpoint) == 256

    # Done when every request is counted (the flood's and the good
    # client's). The deadline is on progress, not on the total: a slow
    # machine may take longer, a stalled sidecar fails after 30 s without any.
    progress = {"requests": -1, "at": time.monotonic()}

    def done():
        s = engine_bridge_stats(sc)
        if s is not None:
            if s["requests"] == n + 1:
                return s
            if s["requests"] != progress["requests"]:
                progress.update(requests=s["requests"], at=time.monotonic())
        assert time.monotonic() - progress["at"] < 30, \
            f"no request handled for 30 s ({progress['requests']} of {n + 1})"
        return None
    s = wait_until(done, 300, "every request to be handled")
    rss1 = rss_kib(pid)
    flooder.close()
    assert s["reply_drops"] > 0, s
    assert s["replies"] + s["reply_drops"] == n + 1, s
    assert sanitized(pid) or rss1 - rss0 < 40 * 1024, f"RSS grew {rss0} -> {rss1} KiB"
    print(f"cache flood: RSS {rss0} -> {rss1} KiB, {s}")


def test_cache_client_that_never_reads_over_tcp_does_not_stall_others(sidecar, zctx):
    # The same client over loopback TCP. Its own connection may stall in the
    # kernel (above), so how many of its requests arrive is not asserted:
    # what must hold is that the sidecar keeps serving a second client,
    # its memory stays bounded, and it stops cleanly (the fixture checks).
    port = free_port_range(1)
    endpoint = f"tcp://127.0.0.1:{port}"
    sc = cache_sidecar(sidecar, endpoint)
    pid = sc.proc.pid
    rss0 = rss_kib(pid)
    n = 50_000 if sanitized(pid) else 200_000
    flooder = flood_from_client_that_never_reads(zctx, endpoint, n)
    assert answered_while_flooded(zctx, endpoint) == 256
    # Once some of the flood has been read (as much as its TCP lets through),
    # a second call is answered too.
    wait_until(lambda: (s := engine_bridge_stats(sc)) is not None and s["requests"] > 2, 10,
               "the flood to be read")
    assert answered_while_flooded(zctx, endpoint) == 256
    s = engine_bridge_stats(sc)
    assert s["replies"] + s["reply_drops"] + s["reply_unroutable"] <= s["requests"] <= n + 2, s
    rss1 = rss_kib(pid)
    flooder.close()
    assert sanitized(pid) or rss1 - rss0 < 40 * 1024, f"RSS grew {rss0} -> {rss1} KiB"


# --- issue 8 item 5: what hwm_drops counts -------------------------------------------------


def test_hwm_drops_bounds_the_gaps_a_stalled_router_sees(rig, zctx):
    """Each hwm_drops is one drop episode: at most one contiguous run of seqs
    the stalled router misses (libzmq then skips its pipe silently until it
    has drained to the low-water mark). One stalled router through a flood:
    it sees at least one gap and no more gaps than hwm_drops (an episode
    whose batch slipped through after all counts none: README, pub[dp=r]),
    and replay returns every batch inside them."""
    r = rig(overrides={"events.hwm": 200})
    stalled, base = join_stalled_subscriber(r, zctx)
    before = r.sidecar.wait_stats("pub", lambda s: s["sent"] >= base)["hwm_drops"]
    storm = 600
    got = burst_with_fast_reader(r, storm, window=50)
    assert got == list(range(base, base + storm))
    r.sidecar.wait_stats("pub", lambda s: s["sent"] >= base + storm, timeout=15)
    # The stalled router wakes up, reads its backlog, then one last batch.
    seen = []
    m = stalled.recv_multipart() if stalled.poll(2000) else None
    while m is not None:
        seen.append(int.from_bytes(m[1], "big"))
        m = stalled.recv_multipart() if stalled.poll(300) else None
    r.engine.send(0, batch_at(777))
    wait_until(lambda: stalled.poll(100), 10, "the stalled router to be written to again")
    seen.append(int.from_bytes(stalled.recv_multipart()[1], "big"))
    stalled.close(linger=0)
    last = base + storm
    assert seen[-1] == last
    missing = sorted(set(range(base, last)) - set(seen))
    runs = sum(1 for i, sq in enumerate(missing) if i == 0 or missing[i - 1] != sq - 1)
    pub = r.sidecar.wait_stats("pub", lambda s: s["sent"] >= last + 1)
    assert missing, "the stalled router missed nothing: the test did not stall it"
    drops = pub["hwm_drops"] - before
    print(f"\nhwm_drops {drops}, gaps the stalled router saw {runs} ({len(missing)} batches)")
    assert 1 <= runs <= drops, (
        f"hwm_drops {drops} but the router saw {runs} gaps ({len(missing)} batches)")
    kept = dict(replay_batches(r.replay(missing[0]), "vllm"))
    assert all(sq in kept for sq in missing), "replay does not cover the missed batches"


# --- frame sizes a peer announces ----------------------------------------------------------


def zmtp_peer(port: int, socket_type: bytes) -> "socket.socket":
    """A raw ZMTP 3.0 NULL-mechanism peer that completed the handshake."""
    import socket
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00")
              + b"\x00" + bytes(31))
    body = b"\x05READY" + b"\x0bSocket-Type" + len(socket_type).to_bytes(4, "big") + socket_type
    s.sendall(b"\x04" + bytes([len(body)]) + body)
    return s


def test_a_huge_announced_frame_is_refused_before_it_is_buffered(rig):
    """The PUB and replay sockets take only tiny frames from peers: a frame
    that announces 1 GiB is refused at its header (the connection dropped),
    not buffered as it trickles in."""
    r = rig()
    pid = r.sidecar.proc.pid
    for port, kind in ((r.replay_port, b"DEALER"), (r.pub_port, b"XSUB")):
        rss0 = rss_kib(pid)
        s = zmtp_peer(port, kind)
        s.sendall(b"\x02" + (1 << 30).to_bytes(8, "big"))  # a long frame of 1 GiB

        def dropped():
            try:
                s.sendall(bytes(1 << 20))
                return False
            except OSError:
                return True
        # Without the limit all of it is taken in (and kept) until the frame is whole.
        sent = 0
        while not dropped():
            sent += 1
            assert sent < 64, f"port {port} ({kind}) kept taking a 1 GiB frame"
        s.close()
        assert sanitized(pid) or rss_kib(pid) - rss0 < 16 * 1024
    # Still serving.
    r.engine.send(0, batch_at(5))
    assert ts_of(r.sub.recv_n(1)[0].payload) == 5
    kept = replay_batches(r.replay(r.base[0]), "vllm")
    assert [ts_of(p) for _, p in kept] == [5]


def test_connections_that_never_handshake_do_not_lock_new_routers_out(rig):
    """Started at a soft open-files limit of 256 (Linux's default is 1024; a
    container runtime often keeps it), the sidecar raises it to the hard
    limit (at most 65536) and says so. Then 600 TCP connections to its replay and PUB ports
    that never speak ZMTP (libzmq keeps each for its 30 s handshake time)
    leave room for a new router: it subscribes and receives the next batch,
    the replay answers it and the probes answer."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"hard open-files limit {hard}: too low to show the flood")
    want = min(hard, 65536) if hard != resource.RLIM_INFINITY else 65536
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    r = rig(start=False)
    r.sidecar.wrapper = ["prlimit", "--nofile=256:"]
    r.start()
    pid = r.sidecar.proc.pid
    limits = open(f"/proc/{pid}/limits").read()
    line = next(l for l in limits.splitlines() if l.startswith("Max open files"))
    assert int(line.split()[3]) == want, line
    assert r.sidecar.find(rf"open files limit raised from 256 to {want}"), r.sidecar.tail()
    held = []
    try:
        for i in range(600):
            port = r.replay_port if i % 2 else r.pub_port
            held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        wait_until(lambda: len(os.listdir(f"/proc/{pid}/fd")) > 600, 10,
                   "the sidecar to accept the 600 connections")
        late = Subscriber(r.ctx, r.pub_port)
        try:
            def joined():
                r.engine.send(0, batch_at(5000))
                return late.recv(0, 0.05) is not None
            wait_until(joined, 10, "a router connecting during the flood to receive a batch")
        finally:
            late.close()
        assert replay_batches(r.replay(0), "vllm"), "the replay answered nothing"
        assert r.sidecar.http_get("/healthz") == (200, "ok\n")
    finally:
        for s in held:
            s.close()


# --- issue 26 item 4: replay clients that never read -------------------------------------


def stalled_replay_client(zctx, port: int, start: int) -> zmq.Socket:
    """A replay client that asks and then reads nothing (its own pipe and
    TCP buffer as small as they go, so the sidecar's side fills)."""
    d = zctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.setsockopt(zmq.RCVHWM, 1)
    d.setsockopt(zmq.RCVBUF, 4096)
    d.connect(f"tcp://127.0.0.1:{port}")
    d.send_multipart([b"", start.to_bytes(8, "big")])
    return d


def test_replay_clients_that_never_read_hold_bounded_memory(rig, zctx):
    """20 replay clients ask for the whole buffer, at different times, and
    never read, while the engine turns the buffer over. Each holds at most
    its pipe (events.replay_hwm messages) and one part of 1,024 batches of
    the buffer (README: "Replay"), so RSS grows by at most that, and returns
    when they leave. A client that reads slower than the buffer turns over
    gets a contiguous replay that ends early (fell_behind), then the end
    marker; a replay asked afterwards returns exactly what the buffer
    holds."""
    steps, hwm, clients = 20_000, 1000, 20
    r = rig(overrides={"events.buffer_steps": steps})  # events.replay_hwm: its default, 1000
    pid = r.sidecar.proc.pid
    start = r.base[0]

    def publish(n: int, at: int) -> None:
        for k in range(at, at + n):
            r.engine.send(0, batch_at(float(k)))
        r.sub.recv_n(n, 0, timeout=30)

    publish(steps, 0)
    assert len(replay_batches(r.replay(start, timeout=30))) == steps  # warms the allocators
    rss0 = rss_kib(pid)
    slow = stalled_replay_client(zctx, r.replay_port, start)
    assert slow.poll(5000)
    stalled, peak = [], rss0
    for i in range(clients):
        stalled.append(stalled_replay_client(zctx, r.replay_port, start + i * 1000))
        publish(1000, steps + i * 1000)  # each asks for another window of the buffer
        peak = max(peak, rss_kib(pid))
    s = r.sidecar.wait_stats("replay_bridge", lambda s: s["requests"] == clients + 2,
                             timeout=10, what="every replay request to arrive")
    peak = max(peak, rss_kib(pid))
    print(f"replay storm: RSS {rss0} -> peak {peak} KiB with {clients} stalled replay clients; {s}")
    # Per client: its pipe (hwm messages of 5 frames, ~350 B each beside the
    # payload they share with the buffer) and up to two parts of 1,024
    # batches (~150 B each with these small payloads); 8 MiB slack. Before
    # replays went part by part (and events.replay_hwm was 10,000), 20 such
    # clients grew RSS by 18-24 MiB here.
    bound = (clients * (hwm * 350 + 2 * 1024 * 150)) // 1024 + 8 * 1024
    assert sanitized(pid) or peak - rss0 < bound, f"RSS grew {rss0} -> {peak} KiB (bound {bound})"

    # The slow client reads on: the buffer has turned over under it.
    got = read_replay(slow, "vllm", 30)
    seqs = [sq for sq, _ in replay_batches(got)]
    assert seqs == list(range(start, start + len(seqs))), "a replay that fell behind has a hole"
    assert len(seqs) < steps, f"the slow replay got {len(seqs)} batches: it never fell behind"
    s = r.sidecar.stats("replay_bridge")
    assert s["fell_behind"] >= 1, s

    for d in stalled + [slow]:
        d.close(linger=0)
    r.sidecar.wait_stats("replay_bridge", lambda s: s["streaming"] == 0, timeout=20,
                         what="the stalled replays to end when their clients left")
    rss2 = rss_kib(pid)
    print(f"replay storm: RSS {rss2} KiB after the clients left")
    assert sanitized(pid) or rss2 - rss0 < 16 * 1024, f"RSS {rss0} -> {peak} -> {rss2} KiB"
    kept = replay_batches(r.replay(0, timeout=30))
    newest = start + steps + clients * 1000 - 1
    assert [sq for sq, _ in kept] == list(range(newest - steps + 1, newest + 1))
