"""Chaos on every relay socket (issue 8): random and garbage multipart frames
from a fake engine PUB (into the ingest), from clients of the replay ROUTER,
from subscribers of the PUB (raw subscription frames) and raw TCP bytes on
the bound ports, all at once for ~20 s; then a flood with a stalled router.
Afterwards the process is alive, its RSS is bounded, its fds are back to the
baseline once the clients are gone, and good traffic still flows. Bounded:
about 40 s in all."""

import os
import random
import socket
import threading
import time

import msgspec
import zmq

import vllm_structs as vs
from kvsidecar_harness import is_fence, replay_batches, wait_until
from test_events_relay import big_batch, join_stalled_subscriber
from test_relay_hardening import rss_kib, sanitized

FUZZ_S = 20.0


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def garbage_frames(rnd: random.Random) -> list[bytes]:
    """0..5 frames of random bytes, sometimes shaped like a batch (an 8-byte
    seq, a msgpack-looking payload, a huge or backwards seq)."""
    kind = rnd.random()
    if kind < 0.3:
        seq = rnd.choice([0, 1, rnd.getrandbits(64), (1 << 64) - 1, rnd.randrange(100)])
        head = rnd.choice([b"\x93", b"\x92", b"\x93\xcb", b"\xdc\xff\xff", b"\x91\x90"])
        return [b"", seq.to_bytes(8, "big"), head + rnd.randbytes(rnd.randrange(64))]
    if kind < 0.35:
        return [b"", (7).to_bytes(8, "big"), rnd.randbytes(200_000)]  # above the max size
    return [rnd.randbytes(rnd.randrange(40)) for _ in range(rnd.randrange(1, 6))]


def fuzz_engine(pub: zmq.Socket, stop: threading.Event, counts: dict) -> None:
    rnd = random.Random(1)
    while not stop.is_set():
        pub.send_multipart(garbage_frames(rnd))
        counts["engine"] += 1
        if counts["engine"] % 200 == 0:
            time.sleep(0.01)


def fuzz_replay(ctx: zmq.Context, port: int, stop: threading.Event, counts: dict) -> None:
    rnd = random.Random(2)
    while not stop.is_set():
        d = ctx.socket(zmq.DEALER)  # a new client now and then (churn)
        d.setsockopt(zmq.LINGER, 0)
        d.connect(f"tcp://127.0.0.1:{port}")
        for _ in range(50):
            frames = garbage_frames(rnd)
            if rnd.random() < 0.2:
                frames = [b"", rnd.randrange(1 << 64).to_bytes(8, "big")]  # a valid request
            d.send_multipart(frames, flags=zmq.NOBLOCK) if frames else None
            counts["replay"] += 1
            while d.poll(0):
                d.recv_multipart()
        d.close(linger=0)


def fuzz_subscribers(ctx: zmq.Context, port: int, stop: threading.Event, counts: dict) -> None:
    rnd = random.Random(3)
    while not stop.is_set():
        x = ctx.socket(zmq.XSUB)  # sends raw subscription frames
        x.setsockopt(zmq.LINGER, 0)
        x.setsockopt(zmq.RCVHWM, 100)
        x.connect(f"tcp://127.0.0.1:{port}")
        for _ in range(100):
            x.send(rnd.choice([b"\x01", b"\x00", b"", b"\x02zz", b"\x01" + rnd.randbytes(30)]))
            counts["sub"] += 1
        time.sleep(0.02)
        x.close(linger=0)


def raw_tcp(ports: list[int], stop: threading.Event, counts: dict) -> None:
    rnd = random.Random(4)
    while not stop.is_set():
        s = socket.socket()
        s.settimeout(0.5)
        try:
            s.connect(("127.0.0.1", rnd.choice(ports)))
            s.sendall(rnd.choice([b"\xff" + rnd.randbytes(9) + b"\x7f" + rnd.randbytes(60),
                                  rnd.randbytes(rnd.randrange(1, 300)),
                                  b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f\x03\x00NULL"
                                  + bytes(16) + b"\x00" * 31 + rnd.randbytes(100)]))
            counts["tcp"] += 1
        except OSError:
            pass
        finally:
            s.close()
        time.sleep(0.002)


def test_chaos_on_every_relay_socket_then_good_traffic(rig, zctx):
    r = rig(overrides={"events.ingest_max_message_size": "64KiB", "events.hwm": 100,
                       "events.ingest_hwm": 100, "events.max_queue_size": 100,
                       "events.buffer_steps": 1000, "events.buffer_bytes": "16MiB",
                       "events.ingest_gap_timeout": "100ms"})
    pid = r.sidecar.proc.pid
    fds0, rss0 = fd_count(pid), rss_kib(pid)
    stop = threading.Event()
    counts = {"engine": 0, "replay": 0, "sub": 0, "tcp": 0}
    threads = [
        threading.Thread(target=fuzz_engine, args=(r.engine.pubs[0], stop, counts)),
        threading.Thread(target=fuzz_replay, args=(zctx, r.replay_port, stop, counts)),
        threading.Thread(target=fuzz_subscribers, args=(zctx, r.pub_port, stop, counts)),
        threading.Thread(target=raw_tcp, args=([r.pub_port, r.replay_port], stop, counts)),
    ]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    peak = rss0
    try:
        while time.monotonic() - t0 < FUZZ_S:
            assert r.sidecar.running(), f"the sidecar died under fuzzing:\n{r.sidecar.tail()}"
            peak = max(peak, rss_kib(pid))
            time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert r.sidecar.running()

    # A flood of valid batches while a router stalls.
    stalled, _ = join_stalled_subscriber(r, zctx)
    payload = big_batch(1)
    for _ in range(3000):
        r.engine.send(0, payload)
    rss_flood = rss_kib(pid)
    stalled.close(linger=0)

    # Good traffic flows again: an engine batch comes through (markers until
    # one does: the flood and its drops are ahead of it), and a replay
    # request for it is answered.
    def marker():
        r.engine.send(0, vs.encoder.encode(vs.KVEventBatch(ts=4242.0, events=[])))
        m = r.sub.recv(0, 0.05)
        while m is not None:
            if not is_fence(m.payload) and msgspec.msgpack.decode(m.payload)[0] == 4242.0:
                return m
            m = r.sub.recv(0, 0)
        return None
    m = wait_until(marker, 30, "a good batch after the chaos")
    kept = replay_batches(r.replay(m.seq), "vllm")
    assert kept and kept[0][0] == m.seq and kept[0][1] == m.payload

    # Clients gone: fds back to the baseline (the router sub and engine stay).
    wait_until(lambda: fd_count(pid) <= fds0 + 2, 15,
               f"fds to return to the baseline {fds0} (now {fd_count(pid)})")
    pub = r.sidecar.wait_stats("pub", lambda s: s["queued"] == 0, timeout=10,
                               what="the PUB to have sent everything queued")
    rss_end = rss_kib(pid)
    ing = r.sidecar.stats("ingest")
    rb = r.sidecar.stats("replay_bridge")
    print(f"chaos: sent {counts}; RSS KiB start {rss0} peak-fuzz {peak} after-flood {rss_flood} "
          f"end {rss_end}; fds start {fds0} end {fd_count(pid)}; ingest {ing}; pub {pub}; "
          f"replay_bridge {rb}")
    assert ing["bad_payloads"] > 0 and ing["disconnects"] > 0, ing
    assert ing["reconnects"] >= ing["disconnects"] - 1, "the ingest stayed deaf"
    assert rb["rejected"] > 0, rb
    assert sanitized(pid) or (peak - rss0 < 150 * 1024 and rss_end - rss0 < 150 * 1024), \
        f"RSS {rss0} -> peak {peak} -> {rss_end} KiB"
