"""LMCache MP protocol client with no third-party dependencies.

The GPU check runs on a machine that has PyTorch but possibly neither
pyzmq nor msgspec, and no network to install them. So this module carries
  - a msgpack encoder/decoder for the subset the protocol uses, producing
    the same bytes as msgspec (smallest int/str/bin/array/map forms, float64,
    fixext where the length allows);
  - a ZMTP 3.0 DEALER over a plain TCP socket (NULL mechanism), used only
    when pyzmq is not importable;
  - MPClient: frames `uid · op · one msgpack frame per arg`, replies matched by uid
    (LMCache 0.5.6 lmcache/v1/multiprocess/transport/zmq_impl/mq.py).

Self-check (no GPU needed): python3 tests/gpu/mp_wire.py
"""

from __future__ import annotations

import itertools
import socket
import struct
import time

# ----------------------------------------------------------------- msgpack


class Ext:
    """msgpack extension value (code, data)."""

    __slots__ = ("code", "data")

    def __init__(self, code: int, data: bytes):
        self.code = code
        self.data = bytes(data)

    def __eq__(self, other):
        return isinstance(other, Ext) and (self.code, self.data) == (other.code, other.data)

    def __repr__(self):
        return f"Ext({self.code}, {len(self.data)} bytes)"


def packb(obj) -> bytes:
    out = bytearray()
    _pack(obj, out)
    return bytes(out)


def _pack(o, out: bytearray) -> None:
    if o is None:
        out += b"\xc0"
    elif o is True:
        out += b"\xc3"
    elif o is False:
        out += b"\xc2"
    elif isinstance(o, int):
        if 0 <= o <= 0x7F:
            out.append(o)
        elif -32 <= o < 0:
            out += struct.pack(">b", o)
        elif 0 <= o <= 0xFF:
            out += b"\xcc" + struct.pack(">B", o)
        elif 0 <= o <= 0xFFFF:
            out += b"\xcd" + struct.pack(">H", o)
        elif 0 <= o <= 0xFFFFFFFF:
            out += b"\xce" + struct.pack(">I", o)
        elif 0 <= o <= 0xFFFFFFFFFFFFFFFF:
            out += b"\xcf" + struct.pack(">Q", o)
        elif -0x80 <= o:
            out += b"\xd0" + struct.pack(">b", o)
        elif -0x8000 <= o:
            out += b"\xd1" + struct.pack(">h", o)
        elif -0x80000000 <= o:
            out += b"\xd2" + struct.pack(">i", o)
        elif -0x8000000000000000 <= o:
            out += b"\xd3" + struct.pack(">q", o)
        else:
            raise OverflowError(o)
    elif isinstance(o, float):
        out += b"\xcb" + struct.pack(">d", o)
    elif isinstance(o, str):
        b = o.encode()
        n = len(b)
        if n <= 31:
            out.append(0xA0 | n)
        elif n <= 0xFF:
            out += b"\xd9" + struct.pack(">B", n)
        elif n <= 0xFFFF:
            out += b"\xda" + struct.pack(">H", n)
        else:
            out += b"\xdb" + struct.pack(">I", n)
        out += b
    elif isinstance(o, (bytes, bytearray, memoryview)):
        b = bytes(o)
        n = len(b)
        if n <= 0xFF:
            out += b"\xc4" + struct.pack(">B", n)
        elif n <= 0xFFFF:
            out += b"\xc5" + struct.pack(">H", n)
        else:
            out += b"\xc6" + struct.pack(">I", n)
        out += b
    elif isinstance(o, (list, tuple)):
        n = len(o)
        if n <= 15:
            out.append(0x90 | n)
        elif n <= 0xFFFF:
            out += b"\xdc" + struct.pack(">H", n)
        else:
            out += b"\xdd" + struct.pack(">I", n)
        for x in o:
            _pack(x, out)
    elif isinstance(o, dict):
        n = len(o)
        if n <= 15:
            out.append(0x80 | n)
        elif n <= 0xFFFF:
            out += b"\xde" + struct.pack(">H", n)
        else:
            out += b"\xdf" + struct.pack(">I", n)
        for k, v in o.items():
            _pack(k, out)
            _pack(v, out)
    elif isinstance(o, Ext):
        n = len(o.data)
        fix = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
        if n in fix:
            out.append(fix[n])
        elif n <= 0xFF:
            out += b"\xc7" + struct.pack(">B", n)
        elif n <= 0xFFFF:
            out += b"\xc8" + struct.pack(">H", n)
        else:
            out += b"\xc9" + struct.pack(">I", n)
        out += struct.pack(">b", o.code) + o.data
    else:
        raise TypeError(f"cannot msgpack {type(o).__name__}")


def unpackb(data: bytes):
    obj, pos = _unpack(memoryview(data), 0)
    if pos != len(data):
        raise ValueError(f"{len(data) - pos} trailing bytes after msgpack value")
    return obj


def _unpack(b: memoryview, p: int):
    t = b[p]
    p += 1
    if t <= 0x7F:
        return t, p
    if t >= 0xE0:
        return t - 0x100, p
    if 0x80 <= t <= 0x8F:
        return _map(b, p, t & 0x0F)
    if 0x90 <= t <= 0x9F:
        return _arr(b, p, t & 0x0F)
    if 0xA0 <= t <= 0xBF:
        n = t & 0x1F
        return bytes(b[p : p + n]).decode(), p + n
    if t == 0xC0:
        return None, p
    if t == 0xC2:
        return False, p
    if t == 0xC3:
        return True, p
    fmt = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q", 0xD0: ">b", 0xD1: ">h", 0xD2: ">i",
           0xD3: ">q", 0xCA: ">f", 0xCB: ">d"}
    if t in fmt:
        size = struct.calcsize(fmt[t])
        return struct.unpack_from(fmt[t], b, p)[0], p + size
    lens = {0xC4: ">B", 0xC5: ">H", 0xC6: ">I", 0xD9: ">B", 0xDA: ">H", 0xDB: ">I",
            0xDC: ">H", 0xDD: ">I", 0xDE: ">H", 0xDF: ">I", 0xC7: ">B", 0xC8: ">H", 0xC9: ">I"}
    if t in lens:
        n = struct.unpack_from(lens[t], b, p)[0]
        p += struct.calcsize(lens[t])
        if t in (0xC4, 0xC5, 0xC6):
            return bytes(b[p : p + n]), p + n
        if t in (0xD9, 0xDA, 0xDB):
            return bytes(b[p : p + n]).decode(), p + n
        if t in (0xDC, 0xDD):
            return _arr(b, p, n)
        if t in (0xDE, 0xDF):
            return _map(b, p, n)
        code = struct.unpack_from(">b", b, p)[0]
        return Ext(code, bytes(b[p + 1 : p + 1 + n])), p + 1 + n
    fixext = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
    if t in fixext:
        n = fixext[t]
        code = struct.unpack_from(">b", b, p)[0]
        return Ext(code, bytes(b[p + 1 : p + 1 + n])), p + 1 + n
    raise ValueError(f"unsupported msgpack type byte 0x{t:02x}")


def _arr(b, p, n):
    items = []
    for _ in range(n):
        x, p = _unpack(b, p)
        items.append(x)
    return items, p


def _map(b, p, n):
    d = {}
    for _ in range(n):
        k, p = _unpack(b, p)
        v, p = _unpack(b, p)
        d[k if not isinstance(k, list) else tuple(k)] = v
    return d, p


# ----------------------------------------------------------------- ZMTP 3.0 DEALER


class _ZmtpDealer:
    """Minimal ZMTP 3.0 DEALER (NULL mechanism) for when pyzmq is absent."""

    def __init__(self, host: str, port: int, timeout: float):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00")
        greeting += b"\x00" + b"\x00" * 31
        self.sock.sendall(greeting)
        peer = self._read(64)
        if peer[0] != 0xFF or peer[9] != 0x7F or peer[10] < 3:
            raise ConnectionError("peer is not a ZMTP 3.x endpoint")
        ready = b"\x05READY" + self._prop(b"Socket-Type", b"DEALER") + self._prop(b"Identity", b"")
        self._send_frame(ready, command=True, more=False)
        self._recv_frame()  # the peer's READY (a command)

    @staticmethod
    def _prop(name: bytes, value: bytes) -> bytes:
        return bytes([len(name)]) + name + struct.pack(">I", len(value)) + value

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("connection closed by the sidecar")
            buf += chunk
        return bytes(buf)

    def _send_frame(self, body: bytes, command: bool, more: bool) -> None:
        flags = (0x04 if command else 0) | (0x01 if more else 0)
        if len(body) <= 255:
            head = bytes([flags, len(body)])
        else:
            head = bytes([flags | 0x02]) + struct.pack(">Q", len(body))
        self.sock.sendall(head + body)

    def _recv_frame(self):
        flags = self._read(1)[0]
        n = struct.unpack(">Q", self._read(8))[0] if flags & 0x02 else self._read(1)[0]
        return flags, self._read(n)

    def send_multipart(self, frames: list[bytes]) -> None:
        for i, f in enumerate(frames):
            self._send_frame(bytes(f), command=False, more=i + 1 < len(frames))

    def recv_multipart(self, timeout: float) -> list[bytes]:
        self.sock.settimeout(timeout)
        frames = []
        while True:
            flags, body = self._recv_frame()
            if flags & 0x04:  # PING or other command: not part of a message
                continue
            frames.append(body)
            if not flags & 0x01:
                return frames

    def close(self) -> None:
        self.sock.close()


class _PyzmqDealer:
    def __init__(self, endpoint: str):
        import zmq

        self._zmq = zmq
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def send_multipart(self, frames):
        self.sock.send_multipart(frames)

    def recv_multipart(self, timeout: float):
        if not self.sock.poll(int(timeout * 1000)):
            raise TimeoutError
        return self.sock.recv_multipart()

    def close(self):
        self.sock.close(0)
        self.ctx.term()


# ----------------------------------------------------------------- MP client

OPS = {
    "register_kv_cache": 1, "unregister_kv_cache": 2, "store": 6, "retrieve": 7, "lookup": 8,
    "query_prefetch_status": 9, "wait_prefetch_status": 10, "free_lookup_locks": 12,
    "end_session": 13, "clear": 20, "get_chunk_size": 21, "ping": 22, "noop": 24,
}

NO_BODY = object()  # a response without a body frame (= None in LMCache)


class MPClient:
    def __init__(self, host: str, port: int, transport: str = "auto", timeout: float = 30.0):
        self.timeout = timeout
        self.transport = transport
        if transport in ("auto", "pyzmq"):
            try:
                self.dealer = _PyzmqDealer(f"tcp://{host}:{port}")
                self.transport = "pyzmq"
            except ImportError:
                if transport == "pyzmq":
                    raise
                self.transport = "zmtp"
        if self.transport == "zmtp":
            self.dealer = _ZmtpDealer(host, port, timeout)
        self._uids = itertools.count()
        self._early = {}

    def call(self, op: str, args: list, timeout: float | None = None):
        """Sends one request and waits for its reply; returns the decoded body
        (None for a body-less reply). Raises TimeoutError."""
        uid = next(self._uids)
        frames = [packb(uid), packb(OPS[op])] + [packb(a) for a in args]
        self.dealer.send_multipart(frames)
        return self.wait(uid, op, timeout)

    def wait(self, uid: int, op: str, timeout: float | None = None):
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while uid not in self._early:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no reply to {op} (uid {uid})")
            try:
                msg = self.dealer.recv_multipart(left)
            except (TimeoutError, socket.timeout):
                raise TimeoutError(f"no reply to {op} (uid {uid})") from None
            if len(msg) < 2:
                raise ValueError(f"malformed reply with {len(msg)} frames")
            self._early[unpackb(msg[0])] = msg[2:]
        body = self._early.pop(uid)
        if not body:
            return None
        if len(body) > 1:
            raise ValueError(f"reply to {op} has {len(body)} body frames")
        return unpackb(body[0])

    def close(self):
        self.dealer.close()


# ----------------------------------------------------------------- self-check


def _self_check() -> None:
    samples = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32, 2**63, -1, -32, -33, -200, -40000,
               -(2**31), -(2**40), 1.5, "", "a" * 31, "b" * 32, "c" * 300, b"", b"x" * 300,
               None, True, False, [], [1, [2, 3]], list(range(20)), {"a": 1, "b": [None]},
               {str(i): i for i in range(20)}, Ext(1, b"q"), Ext(1, b"q" * 16), Ext(1, b"q" * 17),
               Ext(1, b"q" * 300), Ext(1, b"q" * 70000)]
    try:
        import msgspec
    except ImportError:
        msgspec = None
    for s in samples:
        enc = packb(s)
        assert unpackb(enc) == s, s
        if msgspec is not None:
            ref = msgspec.msgpack.encode(msgspec.msgpack.Ext(s.code, s.data) if isinstance(s, Ext) else s)
            assert enc == ref, (s, enc[:8], ref[:8])
    print("msgpack: ok" + (" (bytes match msgspec)" if msgspec else ""))

    try:
        import zmq
    except ImportError:
        print("zmtp: skipped (no pyzmq to play the ROUTER)")
        return
    import threading

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    def serve():
        for _ in range(2):
            ident, uid, op, *args = router.recv_multipart()
            body = [packb(["echo", unpackb(op), [unpackb(a) for a in args]])]
            if unpackb(op) == OPS["noop"]:
                body = []  # no body frame = None
            router.send_multipart([ident, uid, op] + body)

    t = threading.Thread(target=serve)
    t.start()
    c = MPClient("127.0.0.1", port, transport="zmtp", timeout=5)
    big = b"z" * 1000  # long frame
    assert c.call("ping", [7, big]) == ["echo", OPS["ping"], [7, big]]
    assert c.call("noop", []) is None
    c.close()
    t.join()
    router.close(0)
    ctx.term()
    print("zmtp DEALER against a pyzmq ROUTER: ok")


if __name__ == "__main__":
    _self_check()
