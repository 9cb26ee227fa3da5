"""LMCache's engine-driven transfer mode (ops 14-19) against kvsidecar, over
real sockets, with the staging object mapped as LMCache's
EngineDrivenContextShm maps it (by the name the registration reply gives,
under /dev/shm).

This is what vLLM's CPU build does by default (LMCache's
CpuDeviceSpec.default_mp_transfer_mode is engine_driven): the worker
registers its chunk geometry, asks prepare_store for buffers, gathers its
pages into them, commit_store; for a hit, prepare_retrieve hands out buffers
holding the chunks, the worker scatters them, commit_retrieve.

Checked: reply bytes decode as LMCache's dataclasses; the chunk bytes a
worker wrote come back byte for byte to another request; chunks already
stored get no buffers; a chunk stored in the one-plane format (use_mla
flag: MLA, vLLM CPU's fused K/V) is never handed to a two-plane reader;
another connection cannot use the instance; unregister removes the object;
locks and sessions end at zero; a pickled commit is refused at once. With
cache.engine_driven_transfer = "inline" (LMCache 0.5.7's inline transfer
context) the registration names no pool and the chunks travel in
commit_store's and prepare_retrieve's data, as TensorEnvelopes.
"""

from __future__ import annotations

import mmap
import os
import random
import re

import pytest

pytest.register_assert_rewrite("conftest_cache", "lmcache_client")

from conftest_cache import CHUNK, tokens
from lmcache_client import cache_key

pytest_plugins = ["conftest_cache"]

MODEL = "test-org/engine-driven"
LAYERS, HIDDEN = 2, 64  # a chunk: 2 x 2 x 256 x 64 bf16 = 128 KiB


def payload(instance: int, use_mla: bool = False, **kw) -> dict:
    """RegisterEngineDrivenContextPayload as msgspec encodes the Struct."""
    p = {"instance_id": instance, "model_name": MODEL, "world_size": 1, "block_size": 32,
         "num_layers": LAYERS, "hidden_dim_size": HIDDEN, "dtype_str": "bfloat16",
         "use_mla": use_mla, "num_physical_slots": CHUNK}
    p.update(kw)
    return p


def chunk_bytes(use_mla: bool = False) -> int:
    return (1 if use_mla else 2) * LAYERS * CHUNK * HIDDEN * 2


class Staging:
    """The worker's view of the staging object (EngineDrivenContextShm)."""

    def __init__(self, name: str, size: int):
        path = "/dev/shm/" + name.lstrip("/")
        self.fd = os.open(path, os.O_RDWR)
        self.map = mmap.mmap(self.fd, size)
        st = os.fstat(self.fd)
        self.mode, self.uid, self.size = st.st_mode & 0o777, st.st_uid, st.st_size

    def write(self, slot: dict, data: bytes) -> None:
        assert len(data) == slot["length"]
        self.map[slot["offset"]:slot["offset"] + slot["length"]] = data

    def read(self, slot: dict) -> bytes:
        return bytes(self.map[slot["offset"]:slot["offset"] + slot["length"]])

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


def register(c, instance: int, **kw) -> tuple[dict, Staging]:
    reply = c.call("register_kv_cache_engine_driven_context", payload(instance, **kw))
    assert set(reply) == {"shm_name", "pool_size"}, reply
    return reply, Staging(reply["shm_name"], reply["pool_size"])


def key(toks, start, end, rid, worker=0):
    return cache_key(MODEL, 1, worker, toks, start, end, rid)


def lookup(c, toks, rid) -> int:
    assert c.call("lookup", cache_key(MODEL, 1, None, toks, 0, len(toks) // CHUNK * CHUNK, rid), 1) is None
    return c.call("wait_prefetch_status", rid, 5.0)


def store(c, st: Staging, instance: int, toks, rid, rng) -> dict[int, bytes]:
    """prepare_store -> write each handed-out slot -> commit_store; returns what was written."""
    n = len(toks) // CHUNK
    prep = c.call("prepare_store", key(toks, 0, n * CHUNK, rid), instance)
    ctx = prep["context"]
    written = {}
    for slot, idx in zip(ctx["slots"], ctx["chunk_indices"]):
        data = rng.randbytes(slot["length"])
        st.write(slot, data)
        written[idx] = data
    if ctx["slots"]:
        assert c.call("commit_store", key(toks, 0, n * CHUNK, rid), instance, b"") is True
    return prep


STAGED = {"cache.engine_driven_in_place": False}  # a staging object and a copy each way


def test_engine_driven_store_then_retrieve_byte_for_byte(cache_server):
    srv = cache_server(overrides=STAGED)
    c = srv.client()
    reg, st = register(c, 4242)
    assert reg["pool_size"] == 16 * chunk_bytes()  # cache.engine_driven_slots chunks
    assert st.size == reg["pool_size"] and st.mode == 0o600 and st.uid == os.geteuid()
    srv.wait_log(r"registry#\d+ instance 4242 registered \(engine-driven\).*KV_2LTD")
    rng = random.Random(1)
    toks = tokens(3) + [7] * 40  # three full chunks and a partial one
    prep = c.call("prepare_store", key(toks, 0, 3 * CHUNK, "w1"), 4242)
    slots, idx = prep["context"]["slots"], prep["context"]["chunk_indices"]
    assert idx == [0, 1, 2]
    for s in slots:
        assert s["length"] == chunk_bytes() and s["shape"] == [2, LAYERS, CHUNK, HIDDEN]
        assert s["dtype"] == "bfloat16" and s["offset"] % chunk_bytes() == 0
    assert len({s["offset"] for s in slots}) == 3
    written = [rng.randbytes(chunk_bytes()) for _ in slots]
    for s, data in zip(slots, written):
        st.write(s, data)
    assert c.call("commit_store", key(toks, 0, 3 * CHUNK, "w1"), 4242, b"") is True
    assert c.call("end_session", "w1") is None

    # The same tokens again: nothing to store, no buffers (the worker skips its commit).
    again = c.call("prepare_store", key(toks, 0, 3 * CHUNK, "w2"), 4242)
    assert again == {"context": {"slots": [], "chunk_indices": []}}

    # A new request finds them, and gets them back byte for byte.
    assert lookup(c, toks, "r1") == 3
    got = c.call("prepare_retrieve", key(toks, CHUNK, 3 * CHUNK, "r1"), 4242)
    assert got["success"] is True and got["data"] == b""
    rslots = got["context"]["slots"]
    assert [st.read(s) for s in rslots] == written[1:]
    assert c.call("commit_retrieve", key(toks, CHUNK, 3 * CHUNK, "r1"), 4242) is True
    assert c.call("free_lookup_locks", cache_key(MODEL, 1, None, toks, 0, 3 * CHUNK, "r1"), 1) is None
    for rid in ("w2", "r1"):
        c.call("end_session", rid)
    srv.wait_idle()
    srv.wait_stats(lambda s: s["staging_free"] == 16, actor="gpu_transfer")
    st.close()


def test_one_plane_chunks_are_never_read_as_two_plane_ones(cache_server):
    """vLLM CPU's fused K/V registers use_mla=True: its chunks are LMCache's
    row-major gather, not KV_2LTD, though they have the same size. A
    two-plane instance with the same model and tokens must miss them, not
    get scrambled KV."""
    srv = cache_server()
    fused, a = srv.client(), srv.client()
    _, st1 = register(fused, 1, use_mla=True, hidden_dim_size=2 * HIDDEN)
    _, st2 = register(a, 2)
    srv.wait_log(r"instance 1 registered \(engine-driven\).*single_plane")
    toks = tokens(1, salt=5)
    prep = store(fused, st1, 1, toks, "f1", random.Random(2))
    assert prep["context"]["slots"][0]["shape"] == [LAYERS, CHUNK, 2 * HIDDEN]
    fused.call("end_session", "f1")
    # Counted by a lookup (it has no instance, as in LMCache) ...
    assert lookup(a, toks, "a1") == 1
    mark = srv.mark()
    # ... but not handed out to the other format.
    got = a.call("prepare_retrieve", key(toks, 0, CHUNK, "a1"), 2)
    assert got == {"success": False, "data": b"", "context": {}}
    srv.wait_log(r"prepare_retrieve refused: chunk 0 of rank 0 was stored in another chunk format", mark)
    # The one-plane reader does get it.
    assert lookup(fused, toks, "f2") == 1
    back = fused.call("prepare_retrieve", key(toks, 0, CHUNK, "f2"), 1)
    assert back["success"] is True
    assert fused.call("commit_retrieve", key(toks, 0, CHUNK, "f2"), 1) is True
    for c, rid in ((a, "a1"), (fused, "f2")):
        c.call("end_session", rid)
    srv.wait_idle()
    st1.close()
    st2.close()


def test_engine_driven_refusals_answer_at_once(cache_server):
    srv = cache_server(overrides=STAGED)
    owner, other = srv.client(), srv.client()
    reg, st = register(owner, 9)
    toks = tokens(1, salt=9)
    # Another connection may not use the instance: LMCache's failure values.
    why = other.failure(other.submit("prepare_store", key(toks, 0, CHUNK, "x"), 9))
    assert "belongs to another connection" in why
    assert other.call("commit_store", key(toks, 0, CHUNK, "x"), 9, b"") is False
    assert other.call("prepare_retrieve", key(toks, 0, CHUNK, "x"), 9)["success"] is False
    # A commit without a prepare, and a pickled commit (LMCache's pickle
    # strategy): not a TensorEnvelope, refused with what is wrong.
    assert owner.call("commit_store", key(toks, 0, CHUNK, "y"), 9, b"") is False
    prep = owner.call("prepare_store", key(toks, 0, CHUNK, "z"), 9)
    assert len(prep["context"]["slots"]) == 1
    mark = srv.mark()
    assert owner.call("commit_store", key(toks, 0, CHUNK, "z"), 9, b"\x80\x04pickle") is False
    srv.wait_log(r"commit_store of instance 9 \(inline data, 8 bytes\) refused: TensorEnvelope: "
                 r"7 bytes after the envelope", mark)
    # Bad registrations are answered with the reason.
    for bad, text in ((payload(10, dtype_str="complex_thing"), "invalid dtype_str"),
                      (payload(10, num_physical_slots=128), "num_physical_slots 128"),
                      (payload(10, num_layers=0), "out of range"),
                      # a chunk of 128 MiB: more than the whole L1 (checked first)
                      (payload(10, hidden_dim_size=65536), "do not fit in the L1 region"),
                      # 16 chunks of 16 MiB: the staging pools are capped by cache.l1_size
                      (payload(10, hidden_dim_size=8192), "more than cache.l1_size")):
        why = owner.failure(owner.submit("register_kv_cache_engine_driven_context", bad))
        assert text in why, why
    no_name = payload(10)
    del no_name["model_name"]
    why = owner.failure(owner.submit("register_kv_cache_engine_driven_context", no_name))
    assert "missing required field 'model_name'" in why
    # Registering again keeps the pool; unregistering removes its object.
    assert owner.call("register_kv_cache_engine_driven_context", payload(9)) == reg
    assert owner.call("unregister_kv_cache_engine_driven_context", 9) is None
    srv.wait_log(r"removed the staging pool of instance 9")
    assert not os.path.exists("/dev/shm/" + reg["shm_name"].lstrip("/"))
    # Its unfinished store was released: nothing reserved or locked remains.
    for rid in ("x", "y", "z"):
        owner.call("end_session", rid)
    srv.wait_idle()
    st.close()


def test_staging_slots_bound_what_one_request_moves(cache_server):
    """cache.engine_driven_slots chunks per instance: a store needing more is
    cut to what is free (the rest is stored by a later request), a retrieve
    needing more misses; the slots come back at commit."""
    srv = cache_server(overrides={**STAGED, "cache.engine_driven_slots": 2})
    c = srv.client()
    reg, st = register(c, 5)
    assert reg["pool_size"] == 2 * chunk_bytes()
    toks = tokens(3, salt=3)
    prep = store(c, st, 5, toks, "s1", random.Random(3))
    assert prep["context"]["chunk_indices"] == [0, 1]
    prep = store(c, st, 5, toks, "s2", random.Random(4))
    assert prep["context"]["chunk_indices"] == [2]
    assert lookup(c, toks, "r") == 3
    got = c.call("prepare_retrieve", key(toks, 0, 3 * CHUNK, "r"), 5)
    assert got["success"] is False
    got = c.call("prepare_retrieve", key(toks, CHUNK, 3 * CHUNK, "r"), 5)
    assert got["success"] is True and len(got["context"]["slots"]) == 2
    c.call("commit_retrieve", key(toks, CHUNK, 3 * CHUNK, "r"), 5)
    for rid in ("s1", "s2", "r"):
        c.call("end_session", rid)
    srv.wait_idle()
    srv.wait_stats(lambda s: s["staging_free"] == 2, actor="gpu_transfer")
    st.close()


# --- cache.engine_driven_transfer = "inline" (LMCache 0.5.7's inline context) ----------------


def envelope(datas: list[bytes], dtype: str = "bfloat16", shape=None) -> bytes:
    """A TensorEnvelope as LMCache 0.5.7's tensor_wire.encode_tensors writes it."""
    import msgspec
    shape = shape or [2, LAYERS, CHUNK, HIDDEN]
    return msgspec.msgpack.encode({"version": 1, "tensors": [
        {"dtype": dtype, "shape": shape, "data": d} for d in datas]})


def test_inline_transfers_store_and_retrieve_byte_for_byte(cache_server):
    """No pool is named, so a 0.5.7 worker picks its inline context: the
    worker sends every chunk of the range in commit_store (the server keeps
    the ones prepare_store reserved) and gets the chunks back in
    prepare_retrieve's data. A tensor that does not match the registration
    fails the store with the reason; a worker of a pool-named instance that
    falls back to inline (it could not map the pool) is served too."""
    import msgspec
    srv = cache_server(overrides={"cache.engine_driven_transfer": "inline"})
    c = srv.client()
    reply = c.call("register_kv_cache_engine_driven_context", payload(51))
    assert reply == {"shm_name": "", "pool_size": 0}
    srv.wait_log(r"instance 51 registered \(engine-driven\).*inline transfers")
    rng = random.Random(5)
    toks = tokens(3, salt=51)
    first = [rng.randbytes(chunk_bytes()) for _ in range(3)]
    # Chunk 0 first; then the whole range: only chunks 1 and 2 are reserved.
    assert c.call("prepare_store", key(toks, 0, CHUNK, "a"), 51)["context"]["chunk_indices"] == [0]
    assert c.call("commit_store", key(toks, 0, CHUNK, "a"), 51, envelope(first[:1])) is True
    prep = c.call("prepare_store", key(toks, 0, 3 * CHUNK, "b"), 51)
    assert prep["context"] == {"slots": [], "chunk_indices": [1, 2]}
    sent = [rng.randbytes(chunk_bytes()) for _ in range(3)]  # chunk 0 is not written again
    assert c.call("commit_store", key(toks, 0, 3 * CHUNK, "b"), 51, envelope(sent)) is True
    assert lookup(c, toks, "r") == 3
    got = c.call("prepare_retrieve", key(toks, 0, 3 * CHUNK, "r"), 51)
    assert got["success"] is True and got["context"] == {}
    env = msgspec.msgpack.decode(got["data"])
    assert env["version"] == 1 and len(env["tensors"]) == 3
    for t in env["tensors"]:
        assert t["dtype"] == "bfloat16" and t["shape"] == [2, LAYERS, CHUNK, HIDDEN]
    assert [t["data"] for t in env["tensors"]] == [first[0], sent[1], sent[2]]
    assert c.call("commit_retrieve", key(toks, 0, 3 * CHUNK, "r"), 51) is True
    assert c.call("free_lookup_locks", cache_key(MODEL, 1, None, toks, 0, 3 * CHUNK, "r"), 1) is None

    # What does not match the registration fails the store, with the reason.
    other = tokens(1, salt=52)
    for bad, text in ((envelope([b"x" * 10]), "10 bytes"),
                      (envelope([rng.randbytes(chunk_bytes())], dtype="float16"), "'float16'"),
                      (envelope([rng.randbytes(chunk_bytes())], shape=[2, LAYERS * CHUNK, HIDDEN]),
                       "3-d"),
                      (envelope([]), "0 tensors"),
                      (msgspec.msgpack.encode({"version": 2, "tensors": []}), "version 2"),
                      (msgspec.msgpack.encode({"version": 1, "tensors": [], "x": 1}),
                       "unknown field 'x'")):
        mark = srv.mark()
        assert c.call("prepare_store", key(other, 0, CHUNK, "c"), 51)["context"]["chunk_indices"] == [0]
        assert c.call("commit_store", key(other, 0, CHUNK, "c"), 51, bad) is False
        srv.wait_log(r"commit_store of instance 51 \(inline data, \d+ bytes\) refused: .*"
                     + re.escape(text), mark)
    assert lookup(c, other, "d") == 0

    # A pool was named, but the worker sends its data inline: stored, the
    # staging slot given back.
    srv2 = cache_server()
    c2 = srv2.client()
    _, st = register(c2, 52)
    data = rng.randbytes(chunk_bytes())
    assert len(c2.call("prepare_store", key(other, 0, CHUNK, "e"), 52)["context"]["slots"]) == 1
    assert c2.call("commit_store", key(other, 0, CHUNK, "e"), 52, envelope([data])) is True
    assert lookup(c2, other, "f") == 1
    rs = c2.call("prepare_retrieve", key(other, 0, CHUNK, "f"), 52)["context"]["slots"]
    assert st.read(rs[0]) == data
    assert c2.call("commit_retrieve", key(other, 0, CHUNK, "f"), 52) is True
    for cc, rids in ((c, ("a", "b", "c", "d", "r")), (c2, ("e", "f"))):
        for rid in rids:
            cc.call("end_session", rid)
    srv.wait_idle()
    srv2.wait_idle()
    srv2.wait_stats(lambda s: s["staging_free"] == 16, actor="gpu_transfer")
    st.close()


# --- cache.engine_driven_in_place (the default): the engine writes and reads L1 in its arena ---

def copies(srv) -> tuple[int, int]:
    """(staging copies, copies) the transfer actor has made so far."""
    s = srv.wait_stats(lambda s: True, actor="gpu_transfer", mark=srv.mark())
    return s["staged_copies"], s["copies"]


def test_in_place_the_engine_writes_and_reads_l1_slots_with_no_copy(cache_server):
    srv = cache_server()
    c = srv.client()
    reg, arena = register(c, 77)
    srv.wait_log(r"instance 77 registered \(engine-driven\).*L1 arena \(written in place\)")
    # The object is the L1 offsets (64 MiB) and 16 staging slots after them.
    l1 = 64 << 20
    assert reg["pool_size"] == l1 + 16 * chunk_bytes()
    assert arena.size == reg["pool_size"] and arena.mode == 0o600 and arena.uid == os.geteuid()
    toks = tokens(3, salt=77)
    rng = random.Random(77)
    prep = c.call("prepare_store", key(toks, 0, 3 * CHUNK, "w"), 77)
    slots = prep["context"]["slots"]
    assert prep["context"]["chunk_indices"] == [0, 1, 2]
    assert all(s["offset"] + s["length"] <= l1 for s in slots)  # L1 slots, not staging
    written = [rng.randbytes(chunk_bytes()) for _ in slots]
    for s, data in zip(slots, written):
        arena.write(s, data)
    assert c.call("commit_store", key(toks, 0, 3 * CHUNK, "w"), 77, b"") is True
    c.call("end_session", "w")
    # Read back in place: the very slots the store wrote, nothing copied.
    assert lookup(c, toks, "r") == 3
    got = c.call("prepare_retrieve", key(toks, 0, 3 * CHUNK, "r"), 77)
    assert got["success"] is True
    assert [s["offset"] for s in got["context"]["slots"]] == [s["offset"] for s in slots]
    assert [arena.read(s) for s in got["context"]["slots"]] == written
    # Pinned while the engine reads: read locks held until commit_retrieve.
    srv.wait_stats(lambda s: s["locked_chunks"] == 3, mark=srv.mark())
    assert c.call("commit_retrieve", key(toks, 0, 3 * CHUNK, "r"), 77) is True
    c.call("end_session", "r")
    srv.wait_idle()
    assert copies(srv) == (0, 0)
    # The chunks are L1's: a copy-driven reader would get these bytes (the
    # L1 stats count them), and unregistering keeps them but removes the name.
    srv.wait_stats(lambda s: s["chunks"] == 3 and s["arenas"] == 1, mark=srv.mark())
    assert c.call("unregister_kv_cache_engine_driven_context", 77) is None
    srv.wait_stats(lambda s: s["chunks"] == 3 and s["arenas"] == 0, mark=srv.mark())
    assert not os.path.exists("/dev/shm/" + reg["shm_name"].lstrip("/"))
    arena.close()


def test_in_place_arenas_never_show_one_instance_another_ones_chunks(cache_server):
    """Two instances (two engines): B's retrieve of A's chunks is copied into
    B's staging slots; B's object holds nothing of A's at A's offsets."""
    srv = cache_server()
    a, b = srv.client(), srv.client()
    _, arena_a = register(a, 1)
    _, arena_b = register(b, 2)
    l1 = 64 << 20
    toks = tokens(2, salt=12)
    rng = random.Random(12)
    prep = a.call("prepare_store", key(toks, 0, 2 * CHUNK, "w"), 1)
    slots = prep["context"]["slots"]
    written = [rng.randbytes(chunk_bytes()) for _ in slots]
    for s, data in zip(slots, written):
        arena_a.write(s, data)
    assert a.call("commit_store", key(toks, 0, 2 * CHUNK, "w"), 1, b"") is True
    a.call("end_session", "w")
    for s in slots:  # B maps its own object: zeros where A's chunks are
        assert arena_b.read(s) == bytes(chunk_bytes())
    assert lookup(b, toks, "r") == 2
    got = b.call("prepare_retrieve", key(toks, 0, 2 * CHUNK, "r"), 2)
    assert got["success"] is True
    rslots = got["context"]["slots"]
    assert all(s["offset"] >= l1 for s in rslots)  # B's staging slots, after the L1 offsets
    assert [arena_b.read(s) for s in rslots] == written
    assert b.call("commit_retrieve", key(toks, 0, 2 * CHUNK, "r"), 2) is True
    b.call("end_session", "r")
    srv.wait_idle()
    assert copies(srv)[0] == 1  # one staging copy, of both chunks
    srv.wait_stats(lambda s: s["staging_free"] == 32, actor="gpu_transfer", mark=srv.mark())
    arena_a.close()
    arena_b.close()


def test_in_place_an_engine_truncating_its_arena_hurts_only_its_own_chunks(cache_server):
    """A hostile engine shrinks its arena object to nothing: the sidecar heals
    the mapping when it next touches those chunks (another instance reading
    them gets zeros), and serves everyone else as before."""
    srv = cache_server()
    a, b = srv.client(), srv.client()
    _, arena_a = register(a, 31)
    _, arena_b = register(b, 32)
    rng = random.Random(31)
    toks_a, toks_b = tokens(1, salt=31), tokens(1, salt=32)
    for c, arena, inst, toks in ((a, arena_a, 31, toks_a), (b, arena_b, 32, toks_b)):
        prep = c.call("prepare_store", key(toks, 0, CHUNK, "w"), inst)
        arena.write(prep["context"]["slots"][0], rng.randbytes(chunk_bytes()))
        assert c.call("commit_store", key(toks, 0, CHUNK, "w"), inst, b"") is True
        c.call("end_session", "w")
    os.ftruncate(arena_a.fd, 0)
    # B reads A's chunk: the copy touches A's vanished pages.
    assert lookup(b, toks_a, "r") == 1
    got = b.call("prepare_retrieve", key(toks_a, 0, CHUNK, "r"), 32)
    assert got["success"] is True
    assert arena_b.read(got["context"]["slots"][0]) == bytes(chunk_bytes())
    assert b.call("commit_retrieve", key(toks_a, 0, CHUNK, "r"), 32) is True
    srv.wait_stats(lambda s: s["arena_heals"] >= 1, mark=srv.mark())
    assert os.fstat(arena_a.fd).st_size == arena_a.size  # grown back
    # B's own chunk is intact and still read in place.
    assert lookup(b, toks_b, "r2") == 1
    got = b.call("prepare_retrieve", key(toks_b, 0, CHUNK, "r2"), 32)
    assert got["success"] is True and got["context"]["slots"][0]["offset"] < (64 << 20)
    assert b.call("commit_retrieve", key(toks_b, 0, CHUNK, "r2"), 32) is True
    for rid in ("r", "r2"):
        b.call("end_session", rid)
    srv.wait_idle()
    arena_a.close()
    arena_b.close()


def test_in_place_arena_ahead_claims_and_faults_in_the_next_extent(cache_server):
    """cache.l1_arena_ahead: the arena's first extent is claimed and faulted
    in when the instance registers, the store lands in it, and the store
    that ate into it has the next one claimed; the bytes go through as
    without the option."""
    srv = cache_server(overrides={"cache.l1_arena_ahead": True, "sidecar.log_level": "debug"})
    c = srv.client()
    srv.wait_log(r"arena_prefault#\d+ started")
    reg, arena = register(c, 78)
    first = srv.wait_log(r"arena_prefault#\d+ extent at (\d+) MiB \((\d+) MiB\) faulted in")
    lo, extent = int(first.group(1)) << 20, int(first.group(2)) << 20
    assert extent == 8 << 20  # l1_size / 8 of the tests' 64 MiB
    toks = tokens(3, salt=78)
    rng = random.Random(78)
    mark = srv.mark()
    prep = c.call("prepare_store", key(toks, 0, 3 * CHUNK, "w"), 78)
    slots = prep["context"]["slots"]
    assert all(lo <= s["offset"] and s["offset"] + s["length"] <= lo + extent for s in slots)
    # The store ate into the extent: the next one is claimed and faulted in.
    second = srv.wait_log(r"arena_prefault#\d+ extent at (\d+) MiB \(8 MiB\) faulted in", mark=mark)
    assert int(second.group(1)) << 20 != lo
    written = [rng.randbytes(chunk_bytes()) for _ in slots]
    for s, data in zip(slots, written):
        arena.write(s, data)
    assert c.call("commit_store", key(toks, 0, 3 * CHUNK, "w"), 78, b"") is True
    c.call("end_session", "w")
    assert lookup(c, toks, "r") == 3
    got = c.call("prepare_retrieve", key(toks, 0, 3 * CHUNK, "r"), 78)
    assert [arena.read(s) for s in got["context"]["slots"]] == written
    assert c.call("commit_retrieve", key(toks, 0, 3 * CHUNK, "r"), 78) is True
    c.call("end_session", "r")
    srv.wait_idle()
    assert copies(srv) == (0, 0)
    assert reg["pool_size"] == arena.size
    arena.close()
