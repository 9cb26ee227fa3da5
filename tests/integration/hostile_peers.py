"""Thousands of short-lived hostile peers on one port, for a bounded time
(test_hostile_scale.py; issue #35). A separate process, so the test's own
interpreter stays free to sample the sidecar while the flood runs.

Each peer connects, sends its share of messages without ever reading (a
small receive high-water mark, so what the sidecar sends it piles up on the
sidecar's side until the peer leaves), then leaves with linger 0; at most
`--open` are connected at once, a new one replacing the oldest. Kinds:

  dealer   ZeroMQ DEALER: `--valid` requests (each a list of hex frames, one
           chosen at random per message) mixed with random multi-frame
           garbage; the first peer also sends two 64 MiB frames
  sub      ZeroMQ SUB: subscribes to everything and never reads
  pub      ZeroMQ PUB (against a bound ingest SUB): [topic, seq, payload]
           with random seqs, the `--valid` payloads and garbage
  tcp      raw TCP: random bytes, a ZMTP greeting cut short, or nothing
  http     raw TCP: HTTP request heads cut short, garbage, oversized heads
  grpc     a gRPC channel per peer: `--valid` requests as (method, hex body)

Prints one JSON line: {"peers": N, "messages": M}. Stops by itself after
`--seconds`.

Usage: hostile_peers.py KIND ENDPOINT --seconds S [--open N] [--per-peer M]
                        [--valid JSON] [--seed K]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import struct
import time


def hold(open_peers: list, peer, at_most: int) -> None:
    """Keeps `peer` connected; past `at_most` open, the oldest leaves
    (its close drops whatever it had not sent: it never reads)."""
    open_peers.append(peer)
    if len(open_peers) > at_most:
        open_peers.pop(0).close()


def garbage_frames(rng: random.Random) -> list[bytes]:
    return [rng.randbytes(rng.randint(0, 40)) for _ in range(rng.randint(1, 5))]


def zmq_peers(kind: str, endpoint: str, args, rng: random.Random, valid: list) -> tuple[int, int]:
    import zmq
    ctx = zmq.Context()
    stype = {"dealer": zmq.DEALER, "sub": zmq.SUB, "pub": zmq.PUB}[kind]
    open_socks: list = []
    peers = msgs = 0
    deadline = time.monotonic() + args.seconds
    first = True
    while time.monotonic() < deadline:
        s = ctx.socket(stype)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVHWM, 10)
        s.setsockopt(zmq.SNDHWM, 1000)
        if kind == "sub":
            s.setsockopt(zmq.SUBSCRIBE, b"")
        s.connect(endpoint)
        peers += 1
        hold(open_socks, s, args.open)  # linger 0 was set: the close drops its queue
        if kind == "sub":
            time.sleep(args.seconds / 2000)  # subscribers only hold their place
            continue
        if first and kind == "dealer":
            first = False
            blob = b"\0" * ((64 << 20) + 1)  # one byte past every frame limit of ours
            for _ in range(2):
                try:
                    s.send_multipart([b"", blob], flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass
        for _ in range(args.per_peer):
            k = rng.random()
            if kind == "pub":
                seq = struct.pack(">Q", rng.getrandbits(64) if k < 0.5 else rng.randrange(100))
                body = bytes.fromhex(rng.choice(valid)) if valid and k < 0.8 else rng.randbytes(30)
                msg = [b"", seq, body]
            elif valid and k < 0.6:
                msg = [bytes.fromhex(f) for f in rng.choice(valid)]
            else:
                msg = garbage_frames(rng)
            try:
                s.send_multipart(msg, flags=zmq.NOBLOCK)
                msgs += 1
            except zmq.Again:
                break
    for s in open_socks:
        s.close(linger=0)
    ctx.term()
    return peers, msgs


def host_port(endpoint: str) -> tuple[str, int]:
    hp = endpoint.split("://", 1)[-1]
    host, _, port = hp.rpartition(":")
    return host.replace("*", "127.0.0.1") or "127.0.0.1", int(port)


def tcp_peers(kind: str, endpoint: str, args, rng: random.Random) -> tuple[int, int]:
    addr = host_port(endpoint)
    open_socks: list[socket.socket] = []
    peers = msgs = 0
    deadline = time.monotonic() + args.seconds
    greeting = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL" + b"\0" * 16
    heads = [b"GET /metrics HTTP/1.1\r\nHost: x\r\n",  # never finished
             b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n",  # oversized
             b"POST /cache/clear HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n{",
             b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"]  # a TLS hello
    while time.monotonic() < deadline:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.settimeout(1.0)
        try:
            s.connect(addr)
        except OSError:
            s.close()
            continue
        peers += 1
        k = rng.random()
        try:
            if kind == "http":
                s.sendall(rng.choice(heads) if k < 0.8 else rng.randbytes(rng.randint(1, 200)))
            elif k < 0.4:
                s.sendall(rng.randbytes(rng.randint(1, 200)))
            elif k < 0.8:
                s.sendall(greeting[:rng.randint(1, len(greeting))])
            msgs += 1
        except OSError:
            pass
        hold(open_socks, s, args.open)
    for s in open_socks:
        s.close()
    return peers, msgs


def grpc_peers(endpoint: str, args, rng: random.Random, valid: list) -> tuple[int, int]:
    import grpc
    target = endpoint.split("://", 1)[-1]
    peers = msgs = 0
    deadline = time.monotonic() + args.seconds
    open_chans: list = []
    while time.monotonic() < deadline:
        ch = grpc.insecure_channel(target)
        peers += 1
        for _ in range(args.per_peer):
            method, body = rng.choice(valid) if valid and rng.random() < 0.7 else \
                ("/lmcache.v1.LMCacheService/Nope", rng.randbytes(20).hex())
            call = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
            try:
                # Fire and forget: the future is dropped, never read.
                call.future(bytes.fromhex(body), timeout=2.0)
                msgs += 1
            except Exception:  # noqa: BLE001 - a hostile client ignores its errors
                pass
        hold(open_chans, ch, args.open)
    for ch in open_chans:
        ch.close()
    return peers, msgs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["dealer", "sub", "pub", "tcp", "http", "grpc"])
    ap.add_argument("endpoint")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--open", type=int, default=20)
    ap.add_argument("--per-peer", type=int, default=100)
    ap.add_argument("--valid", default="[]")
    ap.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "big"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    valid = json.loads(args.valid)
    if args.kind in ("dealer", "sub", "pub"):
        peers, msgs = zmq_peers(args.kind, args.endpoint, args, rng, valid)
    elif args.kind == "grpc":
        peers, msgs = grpc_peers(args.endpoint, args, rng, valid)
    else:
        peers, msgs = tcp_peers(args.kind, args.endpoint, args, rng)
    print(json.dumps({"peers": peers, "messages": msgs, "seed": args.seed}), flush=True)


if __name__ == "__main__":
    main()
