"""A minimal LMCache 0.5.6 multi-process (MP) client, for driving kvsidecar's
cache server from tests without torch, a GPU or LMCache itself.

It puts on the wire exactly what LMCache 0.5.6's own client does
(lmcache/v1/multiprocess/transport/zmq_impl/{mq,wire}.py, checked frame for
frame against the real client in test_cache_lmcache_client.py):

- one DEALER per client; a request is ``uid · op · arg_0 · … · arg_{n-1}``;
- uid: ``msgspec.msgpack.encode(int)`` from a per-client ``itertools.count()``;
- op: the frozen legacy id as a msgpack int (wire.py LEGACY_OPERATION_IDS),
  or the snake_case name as a msgpack str (``by_name=True``, and always for
  ops without a legacy id);
- one frame per argument, ``msgspec.msgpack.encode`` of the value, after
  ``int()``/``bool()`` for arguments the RPC contract declares ``int``/``bool``
  (mq.py msgspec_encode);
- the reply is ``uid · op`` echoed plus one body frame, or no body frame for
  None; replies may come in any order and are matched by uid.

Keys (``IPCCacheServerKey``) are maps keyed by field name in 0.5.6
declaration order; KV-cache wrappers are msgpack ext values: kvsidecar's host
shared-memory extension (ext 0x4b) or LMCache 0.5.6's ``cpu_shm`` descriptor
(ext 1), see docs/lmcache-mp-compat.md.

``SeedFlow`` replays the call sequences of the SGLang connector the project
was specified from (shared/seeds/002_*.txt, ``LMCacheMPConnector``):
lookup_kv, retrieve_kv, store_kv, release_pending, end_session, close.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any, Iterable

import msgspec
import zmq

# wire.py LEGACY_OPERATION_IDS (frozen) for the ops kvsidecar serves.
OP_IDS: dict[str, int] = {
    "register_kv_cache": 1,
    "unregister_kv_cache": 2,
    "store": 6,
    "retrieve": 7,
    "lookup": 8,
    "query_prefetch_status": 9,
    "wait_prefetch_status": 10,
    "query_prefetch_lookup_hits": 11,
    "free_lookup_locks": 12,
    "end_session": 13,
    "register_kv_cache_engine_driven_context": 14,
    "unregister_kv_cache_engine_driven_context": 15,
    "prepare_store": 16,
    "commit_store": 17,
    "prepare_retrieve": 18,
    "commit_retrieve": 19,
    "clear": 20,
    "report_block_allocation": 23,
    "get_chunk_size": 21,
    "ping": 22,
    "noop": 24,
    "get_experimental": 32,
}

# Per op, how each argument is encoded: "int"/"bool" are coerced first (the
# contract declares them so), "kv" is the wrapper list, "any" is plain msgspec.
ARG_KINDS: dict[str, tuple[str, ...]] = {
    "register_kv_cache": ("int", "kv", "any", "int", "any", "any", "any"),
    "unregister_kv_cache": ("int",),
    "store": ("any", "int", "any", "any"),
    "retrieve": ("any", "int", "any", "any", "int"),
    "lookup": ("any", "int"),
    "query_prefetch_status": ("any",),
    "wait_prefetch_status": ("any", "any"),
    "query_prefetch_lookup_hits": ("any",),
    "free_lookup_locks": ("any", "int"),
    "end_session": ("any",),
    "clear": ("bool",),
    "get_chunk_size": (),
    "ping": ("any",),  # int | None: not coerced
    "noop": (),
    "get_experimental": (),
    "register_kv_cache_engine_driven_context": ("any",),
    "unregister_kv_cache_engine_driven_context": ("int",),
    "prepare_store": ("any", "int"),
    "commit_store": ("any", "int", "any"),
    "prepare_retrieve": ("any", "int"),
    "commit_retrieve": ("any", "int"),
}

HOST_SHM_EXT = 0x4B  # kvsidecar's host shared-memory wrapper
LMCACHE_WRAPPER_EXT = 1  # every LMCache DeviceIPCWrapper
EVENT_HANDLE = bytes(64)  # a cudaIpcEventHandle_t's size; the host backend ignores it


def encode_uid(uid: int) -> bytes:
    return msgspec.msgpack.encode(uid)


def encode_op(op: str | int, by_name: bool = False) -> bytes:
    """wire.encode_operation: the legacy id when there is one, else the name."""
    if isinstance(op, int):
        return msgspec.msgpack.encode(op)
    if by_name or op not in OP_IDS:
        return msgspec.msgpack.encode(op)
    return msgspec.msgpack.encode(OP_IDS[op])


def encode_arg(value: Any, kind: str = "any") -> bytes:
    if kind == "int":
        value = int(value)
    elif kind == "bool":
        value = bool(value)
    return msgspec.msgpack.encode(value)


def cache_key(model_name: str, world_size: int, worker_id: int | None,
              token_ids: Iterable[int], start: int, end: int, request_id: str,
              cache_salt: str = "", request_configs: dict | None = None,
              num_kv_readers: int = 0) -> dict:
    """IPCCacheServerKey (0.5.6) as msgspec encodes the dataclass: every field,
    in declaration order."""
    return {
        "model_name": model_name,
        "world_size": world_size,
        "worker_id": worker_id,
        "token_ids": list(token_ids),
        "start": start,
        "end": end,
        "request_id": request_id,
        "cache_salt": cache_salt,
        "request_configs": request_configs,
        "num_kv_readers": num_kv_readers,
    }


def host_shm_wrapper(shm_name: str, dtype: str, shape: list[int], stride: list[int],
                     storage_offset: int = 0, offset: int = 0,
                     nbytes: int | None = None) -> msgspec.msgpack.Ext:
    """kvsidecar's ext 0x4b host shared-memory tensor."""
    m: dict[str, Any] = {"shm_name": shm_name, "offset": offset, "dtype": dtype,
                         "shape": list(shape), "stride": list(stride),
                         "storage_offset": storage_offset}
    if nbytes is not None:
        m["nbytes"] = nbytes
    return msgspec.msgpack.Ext(HOST_SHM_EXT, msgspec.msgpack.encode(m))


def cpu_shm_descriptor(d: dict) -> dict:
    """A CpuShmIPCData map with its keys in the order msgspec writes them
    (tag, the subclass's own fields, then the kw_only base fields)."""
    return {"type": "cpu_shm", "shm_name": d["shm_name"], "nbytes": d["nbytes"],
            "version": d["version"], "metadata": d["metadata"]}


def pool_wrappers(pools, kind: str = "host_shm") -> list[msgspec.msgpack.Ext]:
    """REGISTER_KV_CACHE's kv_cache list for a tests/tools/shm_pool.py KVPools:
    ext 0x4b ("host_shm") or LMCache 0.5.6's cpu_shm descriptor ("cpu_shm")."""
    if kind == "cpu_shm":
        return [msgspec.msgpack.Ext(LMCACHE_WRAPPER_EXT, msgspec.msgpack.encode(cpu_shm_descriptor(d)))
                for d in pools.descriptors()]
    if kind != "host_shm":
        raise ValueError(f"unknown wrapper kind {kind!r}")
    return [host_shm_wrapper(t.obj.name, pools.dtype, t.shape, t.stride, t.storage_offset,
                             nbytes=t.obj.nbytes) for t in pools.tensors]


# --- the client -------------------------------------------------------------------


class NoReply(AssertionError):
    pass


@dataclass
class Reply:
    uid_frame: bytes
    op_frame: bytes
    body: bytes | None  # None: no body frame (the result is None)
    frames: list[bytes]

    @property
    def uid(self) -> int:
        return msgspec.msgpack.decode(self.uid_frame)

    @property
    def value(self) -> Any:
        return None if self.body is None else msgspec.msgpack.decode(self.body)


@dataclass
class Sent:
    uid: int
    frames: list[bytes]  # as sent (the ROUTER adds the identity)


class MPClient:
    """One DEALER speaking the LMCache MP protocol. Not thread-safe: use one
    client per thread."""

    def __init__(self, endpoint: str, ctx: zmq.Context | None = None,
                 identity: bytes | None = None):
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        if identity is not None:
            self.sock.setsockopt(zmq.IDENTITY, identity)
        self.sock.connect(endpoint)
        self._uids = itertools.count()
        self._replies: dict[int, Reply] = {}
        self.sent: dict[int, Sent] = {}

    # -- raw frames -----------------------------------------------------------------

    def next_uid(self) -> int:
        return next(self._uids)

    def send_frames(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def frames_for(self, op: str | int, args: tuple, uid: int, by_name: bool = False) -> list[bytes]:
        kinds = ARG_KINDS.get(op, ()) if isinstance(op, str) else ()
        out = [encode_uid(uid), encode_op(op, by_name)]
        for i, a in enumerate(args):
            out.append(encode_arg(a, kinds[i] if i < len(kinds) else "any"))
        return out

    def submit(self, op: str | int, *args: Any, by_name: bool = False) -> int:
        """Sends one request; returns its uid (see reply())."""
        uid = self.next_uid()
        frames = self.frames_for(op, args, uid, by_name)
        self.sent[uid] = Sent(uid, frames)
        self.send_frames(frames)
        return uid

    def _recv_one(self, timeout: float) -> Reply | None:
        if not self.sock.poll(max(0, int(timeout * 1000))):
            return None
        frames = self.sock.recv_multipart()
        assert len(frames) in (2, 3), f"reply of {len(frames)} frames: {frames!r}"
        r = Reply(frames[0], frames[1], frames[2] if len(frames) == 3 else None, frames)
        uid = r.uid
        assert uid not in self._replies, f"second reply for uid {uid}"
        self._replies[uid] = r
        return r

    def _await(self, uid: int, timeout: float) -> tuple[Reply, Sent | None]:
        """Receives until the reply to `uid` is in; returns it and what was sent."""
        deadline = time.monotonic() + timeout
        while uid not in self._replies:
            left = deadline - time.monotonic()
            if left <= 0 or self._recv_one(left) is None:
                if uid in self._replies:
                    break
                raise NoReply(f"no reply to uid {uid} within {timeout}s")
        return self._replies.pop(uid), self.sent.pop(uid, None)

    def reply(self, uid: int, timeout: float = 5.0) -> Reply:
        """The reply to request `uid` (others that arrive meanwhile are kept)."""
        r, sent = self._await(uid, timeout)
        if sent is not None:
            # LMCache echoes uid and op frames byte for byte.
            assert r.uid_frame == sent.frames[0], (r.uid_frame, sent.frames[0])
            assert r.op_frame == sent.frames[1], (r.op_frame, sent.frames[1])
        return r

    def failure(self, uid: int, timeout: float = 5.0) -> str:
        """The reason of a failure reply to `uid` (kvsidecar answers a call it
        cannot serve with its uid and an op frame naming another operation,
        which LMCache's client raises as ValueError; see
        lmcache_wire/lmcache_failure.hpp). Fails on any other reply."""
        why, value = self.failure_or_value(uid, timeout)
        assert why is not None, f"uid {uid} was answered {value!r}, not with a failure"
        return why

    def failure_or_value(self, uid: int, timeout: float = 5.0) -> tuple[str | None, Any]:
        """(reason, None) for a failure reply to `uid` (see failure()),
        (None, value) for an ordinary one."""
        r, sent = self._await(uid, timeout)
        if sent is not None:
            assert r.uid_frame == sent.frames[0], (r.uid_frame, sent.frames[0])
            if r.op_frame == sent.frames[1]:
                return None, r.value
        assert r.body is None, r.frames
        why = msgspec.msgpack.decode(r.op_frame)
        assert isinstance(why, str) and why.startswith("kvsidecar: "), r.frames
        return why, None

    def result(self, uid: int, timeout: float = 5.0) -> Any:
        return self.reply(uid, timeout).value

    def call(self, op: str | int, *args: Any, timeout: float = 5.0, by_name: bool = False) -> Any:
        return self.result(self.submit(op, *args, by_name=by_name), timeout)

    def assert_no_reply(self, uid: int, within: float = 0.2) -> None:
        """Fails if a reply to `uid` arrives within `within` seconds."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            self._recv_one(deadline - time.monotonic())
            if uid in self._replies:
                raise AssertionError(f"unexpected reply to uid {uid}: {self._replies[uid].frames!r}")

    def close(self) -> None:
        self.sock.close(linger=0)

    # -- typed calls (RequestClient in transport/base.py) ---------------------------------

    def register_kv_cache(self, instance_id: int, kv_cache: list, model_name: str,
                          world_size: int, engine_type: str, layout_hints: dict,
                          engine_group_infos: list | None = None, **kw) -> Any:
        return self.call("register_kv_cache", instance_id, kv_cache, model_name, world_size,
                         engine_type, layout_hints, engine_group_infos or [], **kw)

    def unregister_kv_cache(self, instance_id: int, **kw) -> Any:
        return self.call("unregister_kv_cache", instance_id, **kw)

    def store(self, key: dict, instance_id: int, block_ids: list[list[int]],
              event_ipc_handle: bytes = EVENT_HANDLE, **kw) -> Any:
        return self.call("store", key, instance_id, block_ids, event_ipc_handle, **kw)

    def retrieve(self, key: dict, instance_id: int, block_ids: list[list[int]],
                 event_ipc_handle: bytes = EVENT_HANDLE, skip: int = 0, **kw) -> Any:
        return self.call("retrieve", key, instance_id, block_ids, event_ipc_handle, skip, **kw)

    def lookup(self, key: dict, tp_size: int, **kw) -> Any:
        return self.call("lookup", key, tp_size, **kw)

    def query_prefetch_status(self, request_id: str, **kw) -> Any:
        return self.call("query_prefetch_status", request_id, **kw)

    def wait_prefetch_status(self, request_id: str, timeout_s: float, **kw) -> Any:
        return self.call("wait_prefetch_status", request_id, float(timeout_s),
                         timeout=kw.pop("timeout", timeout_s + 5.0), **kw)

    def query_prefetch_lookup_hits(self, request_id: str, **kw) -> Any:
        return self.call("query_prefetch_lookup_hits", request_id, **kw)

    def free_lookup_locks(self, key: dict, tp_size: int, **kw) -> Any:
        return self.call("free_lookup_locks", key, tp_size, **kw)

    def end_session(self, request_id: str, **kw) -> Any:
        return self.call("end_session", request_id, **kw)

    def clear(self, force: bool = False, **kw) -> Any:
        return self.call("clear", force, **kw)

    def get_chunk_size(self, **kw) -> int:
        return self.call("get_chunk_size", **kw)

    def ping(self, instance_id: int | None = None, **kw) -> Any:
        return self.call("ping", instance_id, **kw)

    def noop(self, **kw) -> Any:
        return self.call("noop", **kw)

    def get_experimental(self, **kw) -> Any:
        return self.call("get_experimental", **kw)


# --- the SGLang seed connector's flows ---------------------------------------------------


class SeedFlow:
    """The request sequences of the seed's ``LMCacheMPConnector`` (SGLang),
    with host shared-memory pools instead of torch tensors and block ids
    instead of slot mappings.

    Like the seed, FREE_LOOKUP_LOCKS and END_SESSION are sent without
    waiting for their (None) replies; ``drain()`` collects those replies and
    checks each came back with no body.

    ``engine`` "sglang" puts the number of skipped pages in RETRIEVE's fifth
    argument (what the seed sends); "vllm" puts tokens there (LMCache 0.5.6's
    vLLM adapter, ``skip_first_n_tokens``).
    """

    def __init__(self, client: MPClient, pools, model: str, instance_id: int,
                 tp_size: int = 1, rank: int = 0, engine: str = "sglang",
                 wrapper_kind: str = "host_shm", mq_timeout: float = 5.0):
        self.c = client
        self.pools = pools
        self.model = model
        self.instance_id = instance_id
        self.tp_size = tp_size
        self.worker_id = rank
        self.engine = engine
        self.page_size = pools.block_size
        self.wrapper_kind = wrapper_kind
        self.mq_timeout = mq_timeout
        self.pending: dict[str, dict] = {}  # request_id -> {token_ids, matched, locks_held}
        self.unanswered: list[int] = []  # fire-and-forget uids
        self.chunk_size = self.c.get_chunk_size()
        if self.chunk_size % self.page_size:
            raise ValueError("LMCache chunk size must be a multiple of the page size")

    # -- helpers -----------------------------------------------------------------------

    def key(self, token_ids, start: int, end: int, request_id: str,
            no_worker_id: bool = False) -> dict:
        return cache_key(self.model, self.tp_size, None if no_worker_id else self.worker_id,
                         token_ids, start, end, request_id)

    def drain(self, timeout: float = 5.0) -> None:
        """Waits for the replies of fire-and-forget requests (all None)."""
        uids, self.unanswered = self.unanswered, []
        for uid in uids:
            r = self.c.reply(uid, timeout)
            assert r.body is None, f"FREE_LOOKUP_LOCKS/END_SESSION answered {r.value!r}"

    def _free_lookup_locks(self, token_ids, start: int, end: int, request_id: str) -> None:
        if start >= end:
            return
        self.unanswered.append(self.c.submit(
            "free_lookup_locks", self.key(token_ids, start, end, request_id, no_worker_id=True),
            self.tp_size))

    # -- the connector --------------------------------------------------------------------

    def register(self) -> Any:
        hints = ({"tokens_per_block": self.page_size} if self.engine == "sglang"
                 else self.pools.layout_hints())
        return self.c.register_kv_cache(self.instance_id, pool_wrappers(self.pools, self.wrapper_kind),
                                        self.model, self.tp_size, self.engine, hints, [],
                                        timeout=self.mq_timeout)

    def lookup_kv(self, token_ids: list[int], request_id: str) -> int:
        stale = self.pending.pop(request_id, None)
        if stale is not None and stale["locks_held"]:
            self._free_lookup_locks(stale["token_ids"], 0, stale["matched"], request_id)
        aligned_end = len(token_ids) // self.chunk_size * self.chunk_size
        if aligned_end == 0:
            return 0
        ack = self.c.lookup(self.key(token_ids, 0, aligned_end, request_id, no_worker_id=True),
                            self.tp_size, timeout=self.mq_timeout)
        assert ack is None, f"LOOKUP answered {ack!r}"
        matched_chunks = self.c.wait_prefetch_status(request_id, self.mq_timeout)
        if matched_chunks is None:
            raise TimeoutError(f"prefetch of {request_id} timed out")
        matched = matched_chunks * self.chunk_size
        self.pending[request_id] = {"token_ids": list(token_ids), "matched": matched,
                                    "locks_held": matched > 0}
        return matched

    def release_pending(self, request_id: str) -> None:
        p = self.pending.get(request_id)
        if p is None or not p["locks_held"]:
            return
        p["locks_held"] = False
        if p["matched"] > 0:
            self._free_lookup_locks(p["token_ids"], 0, p["matched"], request_id)

    def end_session(self, request_id: str) -> None:
        p = self.pending.pop(request_id, None)
        if p is None:
            return
        if p["locks_held"] and p["matched"] > 0:
            self._free_lookup_locks(p["token_ids"], 0, p["matched"], request_id)
        self.unanswered.append(self.c.submit("end_session", request_id))

    def retrieve_kv(self, request_id: str, fresh_block_ids: list[int], offset: int = 0,
                    prefix_pad: int = 0) -> int:
        """fresh_block_ids: the pages of tokens [offset + prefix_pad, matched)
        (the seed derives them from the slot mapping)."""
        p = self.pending.get(request_id)
        if p is None or not p["locks_held"]:
            raise RuntimeError(f"retrieve_kv called for {request_id} without a pending lookup_kv")
        matched, token_ids = p["matched"], p["token_ids"]
        pad_pages = prefix_pad // self.page_size
        self._free_lookup_locks(token_ids, 0, offset, request_id)
        block_ids = [0] * pad_pages + list(fresh_block_ids)
        skip = pad_pages if self.engine == "sglang" else pad_pages * self.page_size
        ok = False
        try:
            res = self.c.retrieve(self.key(token_ids, offset, matched, request_id),
                                  self.instance_id, [block_ids], EVENT_HANDLE, skip,
                                  timeout=self.mq_timeout)
            handle, ok = res
            assert isinstance(handle, bytes)
            if not ok:
                raise RuntimeError(f"LMCache MP retrieve failed for request_id={request_id}")
        finally:
            if not ok:
                self._free_lookup_locks(token_ids, offset, matched, request_id)
            if request_id in self.pending:
                self.pending[request_id]["locks_held"] = False
        return matched - offset

    def store_kv(self, token_ids: list[int], request_id: str, block_ids: list[int]) -> bool:
        """block_ids: the pages of tokens [0, aligned_end). Returns the ok flag
        (the seed raises on False; tests want to look at it)."""
        aligned_end = len(token_ids) // self.chunk_size * self.chunk_size
        if aligned_end == 0:
            return True
        handle, ok = self.c.store(self.key(token_ids, 0, aligned_end, request_id),
                                  self.instance_id, [list(block_ids)], EVENT_HANDLE,
                                  timeout=self.mq_timeout)
        assert isinstance(handle, bytes)
        return ok

    def close(self) -> Any:
        return self.c.unregister_kv_cache(self.instance_id, timeout=self.mq_timeout)
