"""Drives the real kvsidecar binary for the integration tests.

- Sidecar: starts the binary with a config and `--set` overrides, captures
  stderr to a file, waits for `kvsidecar ready`, exposes the log (and the
  stats lines parsed), stops it with a signal and checks the exit status.
- FakeEngine: one ZeroMQ PUB per DP rank (what vLLM/tokenspeed bind), an
  optional ROUTER replay service per rank, seq frames under test control.
- Subscriber / replay(): a router's view of the sidecar.
- sync_rank(): beats the ZeroMQ slow-joiner problem deterministically by
  publishing warm-up batches until the subscriber sees one.

Every wait is a poll on a condition with a deadline (wait_until); nothing
sleeps and hopes.
"""

import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import msgspec
import zmq

import vllm_structs as vs

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_MARK = "kvsidecar ready"
END_SEQ = (-1).to_bytes(8, "big", signed=True)
END_SEQ_U64 = (1 << 64) - 1


def binary_path() -> Path:
    """$KVSIDECAR_BIN, else build/kvsidecar in the repository."""
    env = os.environ.get("KVSIDECAR_BIN")
    if env:
        return Path(env)
    return REPO_ROOT / "build" / "kvsidecar"


def wait_until(cond: Callable[[], Any], timeout: float, what: str = "condition",
               interval: float = 0.005) -> Any:
    """Polls cond() until it returns something truthy (returned), or fails the
    test after `timeout` seconds naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# --- ports -------------------------------------------------------------------

_reserved: set[int] = set()
_reserve_lock = threading.Lock()


def _port_free(port: int) -> bool:
    # No SO_REUSEADDR: a port we can bind this way is free for ZeroMQ (which
    # sets it) too, on every interface.
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("0.0.0.0", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return max(20000, int(f.read().split()[0]))
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_range(count: int) -> int:
    """A base port such that base..base+count-1 are all free (rank r of an
    endpoint uses port + r), and distinct from every range handed out before
    in this process."""
    rnd = random.Random()
    # Below the kernel's ephemeral range: a port in it can be taken by any
    # outgoing connection (this process's clients, the sidecar's own dials)
    # between the check here and the sidecar's bind (seen in CI).
    top = _ephemeral_low()
    with _reserve_lock:
        for _ in range(2000):
            base = rnd.randrange(10000, top - count)
            span = range(base, base + count)
            if any(p in _reserved for p in span):
                continue
            if all(_port_free(p) for p in span):
                _reserved.update(span)
                return base
    raise RuntimeError(f"no {count} consecutive free ports found")


# --- config values --------------------------------------------------------------


def toml_value(v: Any) -> str:
    """A Python value as a TOML literal for --set."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string for the ASCII we use
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML literal for {v!r}")


def set_args(overrides: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for k, v in overrides.items():
        args += ["--set", f"{k}={toml_value(v)}"]
    return args


# --- the binary -------------------------------------------------------------------

_STATS_RE = re.compile(r"\s(\w+)\[dp=(\d+)\]#\d+ stats: (.*)$")


def parse_stats(text: str) -> dict[str, Any]:
    """`a=1 b=x c=3..5` -> {'a': 1, 'b': 'x', 'c': '3..5'}."""
    out: dict[str, Any] = {}
    for part in text.split():
        k, _, v = part.partition("=")
        out[k] = int(v) if v.lstrip("-").isdigit() else v
    return out


_SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> dict[tuple[str, frozenset], float]:
    """Prometheus text format -> {(name, frozenset(labels)): value}."""
    out: dict[tuple[str, frozenset], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        assert m, f"not a Prometheus sample line: {line!r}"
        labels = frozenset(_LABEL_RE.findall(m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


class Sidecar:
    """One kvsidecar process. Use start() / stop(), or as a context manager."""

    def __init__(self, workdir: Path, overrides: dict[str, Any] | None = None,
                 config_text: str | None = None, extra_args: Iterable[str] = (),
                 name: str = "kvsidecar"):
        self.workdir = Path(workdir)
        self.overrides = dict(overrides or {})
        # Every sidecar gets its own HTTP port (the default 9090 would make
        # sidecars started side by side collide), unless the test set one.
        self.http_port: int | None = None
        if ("http.listen" not in self.overrides and "http.enabled" not in self.overrides
                and (config_text is None or "[http]" not in config_text)):
            self.http_port = free_port_range(1)
            self.overrides["http.listen"] = f"127.0.0.1:{self.http_port}"
        elif isinstance(self.overrides.get("http.listen"), str):
            self.http_port = int(self.overrides["http.listen"].rsplit(":", 1)[1])
        # Tests read each actor's latest stats line as its current figures,
        # some as a series (three lines in a row unchanged: stalled): every
        # line is written. The quiet default (an unchanged line only every
        # sidecar.stats_repeat) has a test of its own.
        if "sidecar.stats_repeat" not in self.overrides and \
                (config_text is None or "stats_repeat" not in config_text):
            self.overrides["sidecar.stats_repeat"] = "0s"
        self.config_text = config_text
        self.extra_args = list(extra_args)
        self.log_path = self.workdir / f"{name}.stderr.log"
        self.out_path = self.workdir / f"{name}.stdout.log"
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None
        # Runs the binary through this command (e.g. setpriv); it must exec
        # it, so that proc.pid is the sidecar's.
        self.wrapper: list[str] = []

    # -- process ----------------------------------------------------------------

    def argv(self) -> list[str]:
        args = self.wrapper + [str(binary_path())]
        if self.config_text is not None:
            cfg = self.workdir / f"{self.log_path.stem}.toml"
            cfg.write_text(self.config_text)
            args += ["--config", str(cfg)]
        return args + set_args(self.overrides) + self.extra_args

    def spawn(self) -> "Sidecar":
        """Starts the process without waiting for anything."""
        binary = binary_path()
        if not binary.exists():
            raise AssertionError(f"kvsidecar binary not found at {binary} (set KVSIDECAR_BIN)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as err, open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=err)
        return self

    def start(self, timeout: float = 10.0) -> "Sidecar":
        """Starts the process and waits for the ready line."""
        self.spawn()
        self.wait_ready(timeout)
        return self

    def wait_l1_resident(self, timeout: float = 60.0) -> None:
        """Waits for the start-up L1 fault-in (cache.l1_prefault "background",
        the default, or "ahead") to end, so a test that measures RSS or
        threads sees a settled process. The line in either log format (text:
        `l1_prefault#6 L1 …`; json: `"actor":"l1_prefault#6","msg":"L1 …"`)."""
        self.wait_log(r'l1_prefault#\d+(?: |","msg":")L1 (faulted in|resident ahead of use)',
                      timeout=timeout)

    def wait_ready(self, timeout: float = 10.0) -> None:
        def ready_or_dead():
            if READY_MARK in self.log_text():
                return True
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"kvsidecar exited with {self.proc.returncode} before ready:\n{self.log_text()}")
            return False
        try:
            wait_until(ready_or_dead, timeout, "kvsidecar ready")
        except AssertionError:
            self.kill()
            raise

    def http_get(self, path: str, timeout: float = 2.0) -> tuple[int, str]:
        """GET http://127.0.0.1:<http port><path>: (status, body)."""
        assert self.http_port is not None, "this sidecar has no HTTP port"
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read().decode()
        finally:
            conn.close()

    def metrics(self) -> dict[tuple[str, frozenset], float]:
        """Scrapes /metrics: {(name, frozenset(labels.items())): value}."""
        status, body = self.http_get("/metrics")
        assert status == 200, f"/metrics answered {status}: {body}"
        return parse_metrics(body)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def threads(self) -> list[tuple[str, int]]:
        """Every thread's (name, nice value), from /proc/<pid>/task/*."""
        assert self.proc is not None
        out = []
        for t in Path(f"/proc/{self.proc.pid}/task").iterdir():
            # Fields after the ")" that ends the name: state is field 3, nice 19.
            nice = int((t / "stat").read_text().rsplit(")", 1)[1].split()[16])
            out.append(((t / "comm").read_text().strip(), nice))
        return out

    def thread_names(self) -> list[str]:
        """Every thread's name, sorted."""
        return sorted(name for name, _ in self.threads())

    def scheduler_threads(self) -> int:
        """The CAF scheduler's worker threads (CAF 0.17.6 names them
        caf.multiplexer; the bridges and indexers name their own)."""
        return self.thread_names().count("caf.multiplexer")

    def send_signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # Where each thread waits, before the kill: a shutdown that hangs
            # once in many CI runs is found from this, not re-run until it does.
            where = thread_dump(self.proc.pid)
            self.kill()
            raise AssertionError(f"kvsidecar did not exit within {timeout}s:\n{self.tail()}\n"
                                 f"-- its threads at the timeout --\n{where}")
        return self.returncode

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 5.0,
             expect: int | None = 0) -> int:
        """Signals the process and waits; asserts the exit status (unless
        expect is None)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.send_signal(sig)
        rc = self.wait_exit(timeout)
        if expect is not None:
            assert rc == expect, f"kvsidecar exited with {rc}, expected {expect}:\n{self.tail()}"
        return rc

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "Sidecar":
        return self.start()

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.stop()
        else:
            self.kill()

    # -- log -----------------------------------------------------------------------

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def lines(self) -> list[str]:
        return self.log_text().splitlines()

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.lines()[-n:])

    def find(self, pattern: str) -> list[re.Match]:
        rx = re.compile(pattern)
        return [m for m in (rx.search(l) for l in self.lines()) if m]

    def wait_log(self, pattern: str, timeout: float = 5.0) -> re.Match:
        def found():
            ms = self.find(pattern)
            return ms[-1] if ms else None
        try:
            return wait_until(found, timeout, f"log line /{pattern}/")
        except AssertionError as e:
            raise AssertionError(f"{e}\nlog tail:\n{self.tail()}") from None

    def stats(self, actor: str, rank: int = 0) -> dict[str, Any] | None:
        """The latest stats line of `actor` (ingest, pub, publisher, index, replay,
        replay_bridge) for `rank`, parsed; None before the first one."""
        last = None
        for line in self.lines():
            m = _STATS_RE.search(line)
            if m and m.group(1) == actor and int(m.group(2)) == rank:
                last = m.group(3)
        return parse_stats(last) if last is not None else None

    def wait_stats(self, actor: str, cond: Callable[[dict], bool], rank: int = 0,
                   timeout: float = 5.0, what: str = "") -> dict[str, Any]:
        """Polls until the latest stats line of actor/rank satisfies cond."""
        def ok():
            s = self.stats(actor, rank)
            return s if s is not None and cond(s) else None
        try:
            return wait_until(ok, timeout, f"{actor}[dp={rank}] stats {what}")
        except AssertionError as e:
            raise AssertionError(f"{e}; latest: {self.stats(actor, rank)}") from None


def thread_dump(pid: int) -> str:
    """Each thread of a live process: name, state, kernel wait channel and
    syscall, then (where gdb is installed) every thread's stack."""
    lines = []
    try:
        for t in sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda t: int(t.name)):
            def read(f: str) -> str:
                try:
                    return (t / f).read_text().strip()
                except OSError:
                    return "?"
            state = read("stat").rsplit(")", 1)[-1].split()[:1]
            lines.append(f"{t.name} {read('comm')!r} state={''.join(state)} "
                         f"wchan={read('wchan')} syscall={read('syscall').split(' ')[0]}")
    except OSError as e:
        lines.append(f"/proc/{pid}/task: {e}")
    gdb = shutil.which("gdb")
    if gdb:
        try:
            r = subprocess.run([gdb, "-batch", "-nx", "-p", str(pid), "-ex", "thread apply all bt 16"],
                               capture_output=True, text=True, timeout=60)
            lines.append(r.stdout[-20000:])
        except (subprocess.TimeoutExpired, OSError) as e:
            lines.append(f"gdb: {e}")
    return "\n".join(lines)


# --- the engine side --------------------------------------------------------------


class FakeEngine:
    """One PUB per DP rank bound at tcp://127.0.0.1:base+r, like an engine with
    events.endpoint tcp://*:base. Seq frames count from 0 per rank; a batch
    can be kept back from the live stream (a gap) and still be served by the
    optional replay ROUTER (tcp://127.0.0.1:replay_base+r)."""

    def __init__(self, ctx: zmq.Context, base_port: int, dp_size: int = 1,
                 topic: bytes = b"", replay_base: int | None = None,
                 replay_layout: str = "vllm5"):
        self.ctx = ctx
        self.topic = topic
        self.dp_size = dp_size
        self.pubs: list[zmq.Socket] = []
        for r in range(dp_size):
            s = ctx.socket(zmq.PUB)
            s.setsockopt(zmq.SNDHWM, 0)
            s.setsockopt(zmq.LINGER, 0)
            s.bind(f"tcp://127.0.0.1:{base_port + r}")
            self.pubs.append(s)
        self.next_seq = [0] * dp_size
        self.history: list[dict[int, bytes]] = [{} for _ in range(dp_size)]
        # Replay service behaviour: "vllm5" ([topic, seq, payload] replies),
        # "ts4" ([seq, payload]), "end_only" (just the end marker), "silent".
        self.replay_layout = replay_layout
        self.replay_requests: list[tuple[int, int]] = []  # (rank, start_seq)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        if replay_base is not None:
            routers = []
            for r in range(dp_size):
                s = ctx.socket(zmq.ROUTER)
                s.setsockopt(zmq.LINGER, 0)
                s.bind(f"tcp://127.0.0.1:{replay_base + r}")
                routers.append(s)
            self._thread = threading.Thread(target=self._serve, args=(routers,), daemon=True)
            self._thread.start()

    def send(self, rank: int, payload: bytes, live: bool = True,
             seq: int | None = None) -> int:
        """Publishes payload with the rank's next seq (or `seq`); live=False
        keeps it back from the PUB (the consumer sees a gap) but records it
        for replay. Returns the seq used."""
        if seq is None:
            seq = self.next_seq[rank]
            self.next_seq[rank] += 1
        with self._lock:
            self.history[rank][seq] = payload
        if live:
            self.pubs[rank].send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def send_frames(self, rank: int, frames: list[bytes]) -> None:
        """Raw multipart, for malformed-message tests."""
        self.pubs[rank].send_multipart(frames)

    def _serve(self, routers: list[zmq.Socket]) -> None:
        poller = zmq.Poller()
        for s in routers:
            poller.register(s, zmq.POLLIN)
        while not self._stop.is_set():
            for s, _ in poller.poll(20):
                rank = routers.index(s)
                frames = s.recv_multipart()
                if len(frames) != 3:
                    continue
                ident, _, start = frames
                start_seq = int.from_bytes(start, "big")
                with self._lock:
                    self.replay_requests.append((rank, start_seq))
                    kept = sorted(self.history[rank].items())
                layout = self.replay_layout
                if layout == "silent":
                    continue
                if layout in ("vllm5", "ts4"):
                    for seq, payload in kept:
                        if seq < start_seq:
                            continue
                        head = [ident, b""] + ([self.topic] if layout == "vllm5" else [])
                        s.send_multipart(head + [seq.to_bytes(8, "big"), payload])
                head = [ident, b""] + ([b""] if layout in ("vllm5", "end_only") else [])
                s.send_multipart(head + [END_SEQ, b""])
        for s in routers:
            s.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for s in self.pubs:
            s.close(linger=0)


# --- the router side ---------------------------------------------------------------


@dataclass
class Received:
    topic: bytes
    seq: int
    payload: bytes
    t_recv: float = field(default=0.0)


class Subscriber:
    """One SUB per DP rank, connected to the sidecar's PUB at base+r."""

    def __init__(self, ctx: zmq.Context, base_port: int, dp_size: int = 1,
                 prefix: bytes = b"", host: str = "127.0.0.1"):
        self.socks: list[zmq.Socket] = []
        for r in range(dp_size):
            s = ctx.socket(zmq.SUB)
            s.setsockopt(zmq.RCVHWM, 0)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SUBSCRIBE, prefix)
            s.connect(f"tcp://{host}:{base_port + r}")
            self.socks.append(s)

    def recv(self, rank: int = 0, timeout: float = 0.0) -> Received | None:
        s = self.socks[rank]
        if not s.poll(int(timeout * 1000)):
            return None
        frames = s.recv_multipart()
        t = time.monotonic()
        assert len(frames) == 3, f"expected [topic, seq, payload], got {len(frames)} frames"
        assert len(frames[1]) == 8, f"seq frame of {len(frames[1])} bytes"
        return Received(frames[0], int.from_bytes(frames[1], "big"), frames[2], t)

    def recv_n(self, n: int, rank: int = 0, timeout: float = 10.0) -> list[Received]:
        out: list[Received] = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"dp={rank}: received {len(out)} of {n} batches in {timeout}s")
            m = self.recv(rank, min(left, 0.1))
            if m is not None:
                out.append(m)
        return out

    def assert_silent(self, rank: int = 0, for_s: float = 0.2) -> None:
        m = self.recv(rank, for_s)
        assert m is None, f"unexpected batch seq {m.seq if m else None}"

    def close(self) -> None:
        for s in self.socks:
            s.close(linger=0)


def warmup_payload(i: int) -> bytes:
    """An empty batch marked by a negative ts: never mistaken for real traffic."""
    return vs.encoder.encode(vs.KVEventBatch(ts=-1.0 - i, events=[]))


def is_warmup(payload: bytes) -> bool:
    return msgspec.msgpack.decode(payload)[0] < 0


def is_fence(payload: bytes) -> bool:
    """A batch holding only AllBlocksCleared: what the sidecar publishes as
    seq 0 of every rank and before a restarted engine's new stream (vllm
    dialect: tagged map; tokenspeed: tagged array)."""
    events = msgspec.msgpack.decode(payload)[1]
    if len(events) != 1:
        return False
    e = events[0]
    return (isinstance(e, dict) and e.get("type") == "AllBlocksCleared") or \
        (isinstance(e, list) and e[:1] == ["AllBlocksCleared"])

def warm_up_publisher(pub, empty, sub, rank=0, timeout=10.0) -> int:
    """Warm-up batches (empty(ts) builds one, pub.publish sends it) until the
    subscriber sees one, then one more that must arrive live (an earlier one
    can come through the sidecar's eager catch-up from the engine's replay
    before the live connection is up); returns the sidecar seq of the next
    batch on this rank. The sidecar's own fences are skipped."""
    deadline = time.monotonic() + timeout
    i = 0
    while True:
        pub.publish(empty(-1.0 - i))
        i += 1
        if sub.socks[rank].poll(20):
            break
        assert time.monotonic() < deadline, f"dp={rank}: nothing came through the publisher"
    pub.publish(empty(-1.0 - i))
    last = -1.0 - i
    i += 1
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"dp={rank}: last warm-up never arrived"
        m = sub.recv(rank, min(left, 0.3))
        if m is None:
            pub.publish(empty(-1.0 - i))
            last = -1.0 - i
            i += 1
            continue
        if not is_fence(m.payload) and msgspec.msgpack.decode(m.payload)[0] == last:
            return m.seq + 1


def sync_rank(engine: FakeEngine, sub: Subscriber, rank: int = 0,
              timeout: float = 10.0) -> int:
    """Publishes warm-up batches on `rank` until the subscriber receives one
    (both the sidecar's SUB to the engine and ours to the sidecar are then
    connected), then drains them up to the last one sent. Returns the seq the
    sidecar gives the next batch of this rank.

    A warm-up can also arrive through the sidecar's eager catch-up from the
    engine's replay before the engine's PUB has taken the sidecar's
    subscription; so the last one sent must arrive live, else another is
    sent (the sidecar's seq stays gapless either way)."""
    deadline = time.monotonic() + timeout
    i = 0
    while True:
        engine.send(rank, warmup_payload(i))
        i += 1
        if sub.socks[rank].poll(20):
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"dp={rank}: no warm-up batch came through in {timeout}s")
    engine.send(rank, warmup_payload(i))  # sent after one came through
    last_ts = -1.0 - i
    i += 1
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"dp={rank}: last warm-up batch never arrived")
        m = sub.recv(rank, min(left, 0.3))
        if m is None:
            engine.send(rank, warmup_payload(i))
            last_ts = -1.0 - i
            i += 1
            continue
        if is_fence(m.payload):
            continue  # the sidecar's start-up fence (seq 0), if we joined early enough
        ts = msgspec.msgpack.decode(m.payload)[0]
        assert ts < 0, f"dp={rank}: a non-warm-up batch during warm-up (seq {m.seq})"
        if ts == last_ts:
            return m.seq + 1


def replay(ctx: zmq.Context, port: int, start_seq: int, dialect: str = "vllm",
           timeout: float = 10.0, host: str = "127.0.0.1") -> list[list[bytes]]:
    """Asks the sidecar's replay ROUTER for everything from start_seq, as a
    DEALER; returns every reply with the empty delimiter stripped, end marker
    included (last). Checks each reply's frame layout for the dialect."""
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.setsockopt(zmq.RCVHWM, 0)
    d.connect(f"tcp://{host}:{port}")
    try:
        d.send_multipart([b"", start_seq.to_bytes(8, "big")])
        return read_replay(d, dialect, timeout)
    finally:
        d.close(linger=0)


def read_replay(d: zmq.Socket, dialect: str, timeout: float) -> list[list[bytes]]:
    want = 4 if dialect == "vllm" else 3  # with the delimiter
    out: list[list[bytes]] = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not d.poll(int(left * 1000)):
            raise AssertionError(f"replay: no end marker within {timeout}s ({len(out)} replies)")
        frames = d.recv_multipart()
        assert len(frames) == want, f"replay reply of {len(frames)} frames, want {want}: {frames[:3]}"
        assert frames[0] == b"", "replay reply without the empty delimiter"
        out.append(frames[1:])
        if frames[-2] == END_SEQ:
            return out


def replay_batches(replies: list[list[bytes]], dialect: str = "vllm") -> list[tuple[int, bytes]]:
    """(seq, payload) of each reply before the end marker; asserts the marker."""
    end = replies[-1]
    if dialect == "vllm":
        assert end == [b"", END_SEQ, b""], f"vllm end marker {end}"
    else:
        assert end == [END_SEQ, b""], f"tokenspeed end marker {end}"
    return [(int.from_bytes(r[-2], "big"), r[-1]) for r in replies[:-1]]


# --- a whole relay set-up ---------------------------------------------------------


class EventsRig:
    """FakeEngine -> kvsidecar -> Subscriber on fresh ports, cache off, stats
    every 200 ms. Ranks are synced (warm-up) by start(); `base[r]` is the
    sidecar seq the first real batch of rank r gets, `ingested[r]` the
    ingest's received/published count then (base minus the AllBlocksCleared
    fence the sidecar publishes itself as seq 0)."""

    def __init__(self, ctx: zmq.Context, workdir: Path, fmt: str = "vllm",
                 dp_size: int = 1, replay_on: bool = True, topic: str = "",
                 engine_replay: str | None = None, overrides: dict[str, Any] | None = None,
                 engine: bool = True):
        self.ctx = ctx
        self.fmt = fmt
        self.dp_size = dp_size
        self.topic = topic
        self.ingest_port = free_port_range(dp_size)
        self.pub_port = free_port_range(dp_size)
        self.replay_port = free_port_range(dp_size)
        self.engine_replay_port = free_port_range(dp_size) if engine_replay else None
        o: dict[str, Any] = {
            "cache.enabled": False,
            "sidecar.stats_interval": "200ms",
            "events.format": fmt,
            "events.dp_size": dp_size,
            "events.ingest_endpoint": f"tcp://127.0.0.1:{self.ingest_port}",
            "events.endpoint": f"tcp://*:{self.pub_port}",
            "events.replay_endpoint": f"tcp://*:{self.replay_port}" if replay_on else "",
            "events.topic": topic,
        }
        if engine_replay:
            o["events.ingest_replay_endpoint"] = f"tcp://127.0.0.1:{self.engine_replay_port}"
        o.update(overrides or {})
        self.engine = (FakeEngine(ctx, self.ingest_port, dp_size, topic=b"",
                                  replay_base=self.engine_replay_port,
                                  replay_layout=engine_replay or "vllm5")
                       if engine else None)
        self.sidecar = Sidecar(workdir, o)
        self.sub: Subscriber | None = None
        self.base: list[int] = [0] * dp_size
        self.ingested: list[int] = [0] * dp_size

    def start(self, sync: bool = True) -> "EventsRig":
        self.sidecar.start()
        self.sub = Subscriber(self.ctx, self.pub_port, self.dp_size, prefix=self.topic.encode())
        if sync:
            for r in range(self.dp_size):
                self.base[r] = sync_rank(self.engine, self.sub, r)
                self.ingested[r] = self.base[r] - 1
        return self

    def replay(self, start_seq: int, rank: int = 0, timeout: float = 10.0) -> list[list[bytes]]:
        return replay(self.ctx, self.replay_port + rank, start_seq, self.fmt, timeout)

    def close(self) -> None:
        """Stops the sidecar (SIGTERM, must exit 0 within 5 s) and closes
        the sockets."""
        try:
            if self.sidecar.running():
                self.sidecar.stop()
        finally:
            self.sidecar.kill()
            if self.sub is not None:
                self.sub.close()
            if self.engine is not None:
                self.engine.close()


def rss_kib(pid: int) -> int:
    """The process's resident set (VmRSS), KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def sanitized(pid: int) -> bool:
    """The binary runs under AddressSanitizer (scripts/test.sh runs every
    integration test so): its quarantine and shadow memory make RSS say
    nothing about our own bounds, so RSS limits are not checked then (the
    tests that check them carry the "release" label, tests/CMakeLists.txt)."""
    with open(f"/proc/{pid}/maps") as f:
        return "libasan" in f.read()
