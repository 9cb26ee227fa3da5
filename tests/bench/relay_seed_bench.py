#!/usr/bin/env python3
"""The seed's Python publisher doing the relay's job, for comparison.

tokenspeed's ZmqEventPublisher: the one in tokenspeed 0.1.1's wheel
(tests/tools/engine_wheels.py), or the seed file when KVS_SHARED_DIR names
it (loaded as tests/integration/seed_publisher.py loads it)
publishes KVEventBatch objects of --batch BlockStored events (16-token
blocks, like bench_relay's) as fast as publish() takes them, for --seconds.
A SUB in another process counts what arrives. The seed publishes through a
queue and a thread, so the number that counts is the end-to-end receive
rate: events received / (last receive - first receive), measured in the
subscriber process. publish() calls/s is printed too (the engine-side view).

Same method as bench_relay: warm-up batches (ts < 0) until the subscriber
has seen one (slow joiner), then at most --window batches in flight (sent,
not yet received), so neither the seed's queue nor its PUB's high-water mark
fills and nothing is dropped; drops are reported if any happen anyway.

Prints a human line on stderr and `RESULT mode=seed ...` on stdout.
  python3 tests/bench/relay_seed_bench.py --batch 16 --seconds 1.5 --port 41400
"""

import argparse
import atexit
import multiprocessing as mp
import random
import struct
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))


def subscriber(port: int, batch: int, received, synced, sent, done, out) -> None:
    """Binds a SUB (the seed's PUB connects to it, as to a router), counts
    real batches (ts >= 0), reports (n, first, last, bad) through `out`."""
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.RCVHWM, 0)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.bind(f"tcp://127.0.0.1:{port}")
    out.put(("bound",))
    n = bad = 0
    first = last = 0.0
    checked = False
    idle_deadline = time.monotonic() + 30.0
    unpack_ts = struct.Struct(">d").unpack_from
    while True:
        if done.value and n >= sent.value:
            break
        if not s.poll(100):
            if time.monotonic() > idle_deadline:
                break
            continue
        frames = s.recv_multipart(copy=False)
        if len(frames) != 3 or len(frames[1].bytes) != 8:
            bad += 1
            continue
        buf = frames[2].buffer
        ts = unpack_ts(buf, 2)[0] if len(buf) >= 10 and buf[1] == 0xCB else -1.0
        if ts < 0:
            synced.value = 1
            continue
        last = time.monotonic()
        if n == 0:
            first = last
        if not checked:
            # Once: the payload really holds `batch` events.
            import msgspec

            events = msgspec.msgpack.decode(frames[2].bytes)[1]
            if len(events) != batch:
                bad += 1
            checked = True
        n += 1
        received.value = n
        idle_deadline = last + (2.0 if done.value else 10.0)
    out.put(("result", n, first, last, bad))
    s.close(linger=0)
    ctx.term()


def make_batches(seed, batch: int, count: int = 16):
    """`count` KVEventBatch objects of `batch` BlockStored events each: one
    16-token block per event, chained by parent hash (as bench_relay's)."""
    rng = random.Random(12345)
    out = []
    for _ in range(count):
        parent = rng.getrandbits(64)
        events = []
        for _ in range(batch):
            h = rng.getrandbits(64)
            events.append(seed.BlockStored(block_hashes=[h], parent_block_hash=parent,
                                           token_ids=[rng.randrange(128000) for _ in range(16)],
                                           block_size=16))
            parent = h
        out.append(seed.KVEventBatch(ts=0.0, events=events, attn_dp_rank=0))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--window", type=int, default=0,
                    help="batches in flight at most (default max(64, 65536 / batch))")
    args = ap.parse_args()
    window = args.window or max(64, 65536 // args.batch)

    from seed_publisher import find_seed, find_shared_dir, load_seed

    # The seed file when KVS_SHARED_DIR names it; else the same publisher
    # from tokenspeed's released wheel (tokenspeed/runtime/pd/kv_events.py),
    # which is what the seed was copied from.
    shared = find_shared_dir()
    path = find_seed(shared) if shared else None
    if path is None:
        sys.path.insert(0, str(HERE.parent / "tools"))
        import engine_wheels

        try:
            engine_wheels.load("tokenspeed")
        except Exception as e:  # noqa: BLE001 - any reason means "not available"
            print(f"relay_seed_bench: no seed (KVS_SHARED_DIR) and no tokenspeed wheel: {e}",
                  file=sys.stderr)
            return 2

    # The subscriber starts before the seed module (and its zmq context) exist.
    mpc = mp.get_context("spawn")
    received = mpc.RawValue("Q", 0)
    synced = mpc.RawValue("i", 0)
    sent_v = mpc.RawValue("Q", 0)
    done = mpc.RawValue("i", 0)
    out = mpc.Queue()
    proc = mpc.Process(target=subscriber,
                       args=(args.port, args.batch, received, synced, sent_v, done, out))
    proc.start()
    if out.get(timeout=30)[0] != "bound":
        return 1

    seed = load_seed(path) if path is not None else engine_wheels.load("tokenspeed")
    # Connects (no * in the endpoint): the subscriber bound it.
    pub = seed.ZmqEventPublisher(attn_dp_rank=0, endpoint=f"tcp://127.0.0.1:{args.port}")
    atexit.unregister(pub.shutdown)
    try:
        batches = make_batches(seed, args.batch)
        deadline = time.monotonic() + 20.0
        i = 0
        while not synced.value:
            if time.monotonic() > deadline:
                print("relay_seed_bench: no warm-up batch came through in 20 s", file=sys.stderr)
                return 1
            pub.publish(seed.KVEventBatch(ts=-1.0 - i, events=[], attn_dp_rank=0))
            i += 1
            time.sleep(0.01)

        sent = 0
        nb = len(batches)
        publish = pub.publish
        now = time.monotonic
        t0 = now()
        end = t0 + args.seconds
        while now() < end:
            if sent - received.value >= window:
                time.sleep(0.00002)
                continue
            publish(batches[sent % nb])
            sent += 1
            sent_v.value = sent
        publish_s = now() - t0
        done.value = 1
        res = out.get(timeout=60)
        proc.join(timeout=10)
    finally:
        pub.shutdown()
        if proc.is_alive():
            proc.kill()

    _, n, first, last, bad = res
    secs = last - first
    bps = (n - 1) / secs if n > 1 and secs > 0 else 0.0
    eps = bps * args.batch
    payload_bytes = len(pub._pack.encode(batches[0])) if hasattr(pub, "_pack") else 0
    lost = max(0, sent - n)
    print(f"seed    batch={args.batch:<4d} {eps:10.0f} events/s {bps:9.0f} batches/s  "
          f"publish() {sent / publish_s:9.0f}/s  sent={sent} received={n} lost={lost} "
          f"in {secs:.2f} s", file=sys.stderr)
    print(f"RESULT mode=seed format=tokenspeed batch={args.batch} events_per_s={eps:.0f} "
          f"batches_per_s={bps:.0f} sent={sent} received={n} lost={lost} bad={bad} "
          f"seconds={secs:.3f} payload_bytes={payload_bytes} window={window} "
          f"publish_calls_per_s={sent / publish_s:.0f}", flush=True)
    return 0 if n > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
