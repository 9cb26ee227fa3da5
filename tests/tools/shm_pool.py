"""Host shared-memory KV pools for tests of the host transfer backend.

Creates real POSIX shared-memory objects laid out like an engine's paged KV
cache, fills them with deterministic bytes, describes them for
REGISTER_KV_CACHE, and computes the bytes an L1 chunk must hold — so an
integration test can store, retrieve and check bit-exactness without torch
or numpy.

Layouts (see gpu/kv_layout.hpp):
  sglang_mha       2*L tensors [pages*page_size, heads, head_dim]: K layers, then V
  vllm_flash_attn  L tensors [2, blocks, block_size, heads, head_dim]
L1 chunk layout: [2, L, chunk_tokens, heads*head_dim] (LMCache KV_2LTD).

Wire form: LMCache 0.5.6 sends a KV-cache wrapper as msgpack ext type 1
whose payload is a msgspec-encoded tagged struct (lmcache/v1/platform/base/
ipc_wire.py). For host memory that is ``CpuShmIPCData``:
  {"type": "cpu_shm", "version": 1,
   "metadata": {"dtype", "shape", "stride", "storage_offset", "device_uuid": "cpu"},
   "shm_name": "/name", "nbytes": segment bytes}
``descriptors()`` returns those dicts; ``wire_kv_cache()`` wraps them as ext 1.

Usage:
    with sglang_mha_pools(num_layers=4, num_pages=64, page_size=16,
                          heads=2, head_dim=64) as pools:
        pools.fill(seed=1)
        args = [pid, pools.wire_kv_cache(), "model", 1, "sglang",
                {"tokens_per_block": 16, "kv_list_layout": "k_v"}, []]
        ...
        want = pools.expected_chunk(block_ids, chunk_index=0, chunk_tokens=256)
"""

from __future__ import annotations

import hashlib
import mmap
import os
from dataclasses import dataclass, field

import _posixshmem  # CPython's shm_open/shm_unlink (what multiprocessing uses)

DTYPE_SIZES = {"float16": 2, "bfloat16": 2, "float32": 4, "float8_e4m3fn": 1, "uint8": 1}


class ShmObject:
    """One POSIX shared-memory object, created here and unlinked on close."""

    def __init__(self, name: str, nbytes: int):
        if not name.startswith("/"):
            name = "/" + name
        self.name = name
        self.nbytes = nbytes
        fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            os.ftruncate(fd, nbytes)
            self.map = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)

    def close(self) -> None:
        if self.map is not None:
            self.map.close()
            self.map = None
            try:
                _posixshmem.shm_unlink(self.name)
            except FileNotFoundError:
                pass


def _contiguous_strides(shape: list[int]) -> list[int]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return strides


@dataclass
class _Tensor:
    obj: ShmObject
    shape: list[int]
    stride: list[int]
    storage_offset: int = 0  # elements


@dataclass
class KVPools:
    """A paged KV cache in shared memory; see the module docstring."""

    layout: str
    num_layers: int
    num_blocks: int
    block_size: int
    heads: int
    head_dim: int
    dtype: str
    objects: list[ShmObject] = field(default_factory=list)
    tensors: list[_Tensor] = field(default_factory=list)

    @property
    def elem(self) -> int:
        return DTYPE_SIZES[self.dtype]

    @property
    def token_bytes(self) -> int:
        return self.heads * self.head_dim * self.elem

    @property
    def page_bytes(self) -> int:
        return self.block_size * self.token_bytes

    def chunk_bytes(self, chunk_tokens: int) -> int:
        return 2 * self.num_layers * chunk_tokens * self.token_bytes

    # -- where things are ---------------------------------------------------

    def _page_location(self, kv: int, layer: int, block: int) -> tuple[mmap.mmap, int]:
        if not 0 <= block < self.num_blocks:
            raise IndexError(f"block {block} outside 0..{self.num_blocks - 1}")
        if self.layout == "sglang_mha":
            t = self.tensors[kv * self.num_layers + layer]
            elem_index = t.storage_offset + block * self.block_size * t.stride[0]
        else:  # vllm_flash_attn: [2, NB, BS, NH, HD]
            t = self.tensors[layer]
            elem_index = t.storage_offset + kv * t.stride[0] + block * t.stride[1]
        return t.obj.map, elem_index * self.elem

    def page(self, kv: int, layer: int, block: int) -> bytes:
        m, off = self._page_location(kv, layer, block)
        return bytes(m[off : off + self.page_bytes])

    def set_page(self, kv: int, layer: int, block: int, data: bytes) -> None:
        if len(data) != self.page_bytes:
            raise ValueError(f"page is {self.page_bytes} bytes, got {len(data)}")
        m, off = self._page_location(kv, layer, block)
        m[off : off + self.page_bytes] = data

    def snapshot(self) -> list[bytes]:
        return [bytes(o.map[:]) for o in self.objects]

    # -- contents ------------------------------------------------------------

    def fill(self, seed: int = 0) -> None:
        """Distinct, reproducible bytes in every page (sha256 counter stream)."""
        for kv in range(2):
            for layer in range(self.num_layers):
                for block in range(self.num_blocks):
                    self.set_page(kv, layer, block, _stream((seed, kv, layer, block), self.page_bytes))

    def zero(self) -> None:
        for o in self.objects:
            o.map[:] = bytes(o.nbytes)

    def expected_chunk(self, block_ids: list[int], chunk_index: int, chunk_tokens: int) -> bytes:
        """The L1 chunk [2, L, chunk_tokens, token_bytes] a store of chunk
        `chunk_index` must produce from these pools (block ids of one group)."""
        if chunk_tokens % self.block_size:
            raise ValueError("chunk_tokens must be a multiple of block_size")
        bpc = chunk_tokens // self.block_size
        ids = block_ids[chunk_index * bpc : (chunk_index + 1) * bpc]
        if len(ids) != bpc:
            raise ValueError("too few block ids for this chunk")
        out = bytearray()
        for kv in range(2):
            for layer in range(self.num_layers):
                for b in ids:
                    out += self.page(kv, layer, b)
        return bytes(out)

    # -- registration --------------------------------------------------------

    def descriptors(self) -> list[dict]:
        """CpuShmIPCData dicts (LMCache 0.5.6), one per registered tensor."""
        return [
            {
                "type": "cpu_shm",
                "version": 1,
                "metadata": {
                    "dtype": self.dtype,
                    "shape": list(t.shape),
                    "stride": list(t.stride),
                    "storage_offset": t.storage_offset,
                    "device_uuid": "cpu",
                },
                "shm_name": t.obj.name,
                "nbytes": t.obj.nbytes,
            }
            for t in self.tensors
        ]

    def wire_kv_cache(self) -> list:
        """The kv_cache argument of REGISTER_KV_CACHE: msgpack ext 1 per tensor."""
        import msgspec

        return [msgspec.msgpack.Ext(1, msgspec.msgpack.encode(d)) for d in self.descriptors()]

    def layout_hints(self) -> dict:
        if self.layout == "sglang_mha":
            return {"tokens_per_block": self.block_size, "kv_list_layout": "k_v"}
        return {"kv_layout": "NHD"}

    def close(self) -> None:
        for o in self.objects:
            o.close()
        self.objects.clear()

    def __enter__(self) -> "KVPools":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _stream(key: tuple, n: int) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(repr((key, counter)).encode()).digest()
        counter += 1
    return bytes(out[:n])


_counter = 0


def _name(prefix: str) -> str:
    global _counter
    _counter += 1
    return f"/{prefix}_{os.getpid()}_{_counter}"


def sglang_mha_pools(num_layers: int, num_pages: int, page_size: int, heads: int, head_dim: int,
                     dtype: str = "bfloat16", prefix: str = "kvs_pool") -> KVPools:
    """SGLang MHA: one shm object per K pool and per V pool (2*L tensors)."""
    p = KVPools("sglang_mha", num_layers, num_pages, page_size, heads, head_dim, dtype)
    shape = [num_pages * page_size, heads, head_dim]
    nbytes = shape[0] * heads * head_dim * p.elem
    try:
        for _ in range(2 * num_layers):
            o = ShmObject(_name(prefix), nbytes)
            p.objects.append(o)
            p.tensors.append(_Tensor(o, shape, _contiguous_strides(shape)))
    except BaseException:
        p.close()
        raise
    return p


def vllm_flash_attn_pools(num_layers: int, num_blocks: int, block_size: int, heads: int,
                          head_dim: int, dtype: str = "bfloat16",
                          prefix: str = "kvs_pool") -> KVPools:
    """vLLM flash-attn: all layers are views of one shm object, like vLLM's
    single KV allocation (exercises storage offsets)."""
    p = KVPools("vllm_flash_attn", num_layers, num_blocks, block_size, heads, head_dim, dtype)
    shape = [2, num_blocks, block_size, heads, head_dim]
    layer_elems = 2 * num_blocks * block_size * heads * head_dim
    try:
        o = ShmObject(_name(prefix), num_layers * layer_elems * p.elem)
        p.objects.append(o)
        for layer in range(num_layers):
            p.tensors.append(_Tensor(o, shape, _contiguous_strides(shape), layer * layer_elems))
    except BaseException:
        p.close()
        raise
    return p


if __name__ == "__main__":  # self-check: python3 tests/tools/shm_pool.py
    with sglang_mha_pools(2, 8, 4, 2, 8) as a, vllm_flash_attn_pools(2, 8, 4, 2, 8) as b:
        for pools in (a, b):
            pools.fill(seed=7)
            want = pools.expected_chunk([3, 1, 4, 5], chunk_index=1, chunk_tokens=8)
            assert len(want) == pools.chunk_bytes(8)
            assert want[: pools.page_bytes] == pools.page(0, 0, 4)
            assert want[-pools.page_bytes :] == pools.page(1, 1, 5)
            assert os.path.exists("/dev/shm" + pools.objects[0].name)
            assert pools.descriptors()[0]["type"] == "cpu_shm"
        assert b.page(1, 1, 0) != b.page(0, 1, 0)
    assert not os.path.exists("/dev/shm" + a.objects[0].name) if a.objects else True
    print("shm_pool self-check ok")
