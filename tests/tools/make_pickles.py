#!/usr/bin/env python3
"""Generate the pickle fixtures for lmcache_wire/pickle_reader (no torch needed).

LMCache clients before 0.5.6 send each KV-cache wrapper as msgpack ext 1
holding ``pickle.dumps(wrapper)``. This script rebuilds those pickles with
stand-in classes whose module and qualified name match the real ones exactly,
so Python's pickler emits the same opcodes and globals it emits for the real
objects:

* the wrapper classes (``CudaIPCWrapper``, ``RawCudaIPCWrapper``,
  ``VmmCudaIPCWrapper``, ``CpuShmTensorWrapper``) at their LMCache module
  paths, as plain classes whose instances pickle by ``__dict__`` (NEWOBJ +
  BUILD), attributes assigned in the real ``__init__`` order;
* torch dtypes, which pickle as the global ``torch.<name>`` because
  ``torch.dtype.__reduce__`` returns the name string;
* ``torch.Size``, a tuple subclass reducing to ``(torch.Size, (tuple,))``.

It writes ``tests/fixtures/pickles/*.bin`` and ``manifest.txt``: one line per
fixture, ``<file> ok <field>=<value>...`` with every tensor_desc field the
reader must produce (bytes as hex, lists comma-separated, ``-`` for empty), or
``<file> error=<kind> detail~=<substring>`` for malformed input.

Usage: python3 tests/tools/make_pickles.py [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import types

# --------------------------------------------------------------------------
# Stand-ins
# --------------------------------------------------------------------------

DTYPE_SIZES = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
    "int32": 4,
    "int64": 8,
}


def _module(name: str) -> types.ModuleType:
    """The module ``name``, created (with its parent packages) if missing:
    the pickler imports the module of every global it writes."""
    mod = sys.modules.get(name)
    if mod is None:
        parent, _, leaf = name.rpartition(".")
        mod = types.ModuleType(name)
        sys.modules[name] = mod
        if parent:
            setattr(_module(parent), leaf, mod)
    return mod


def install_torch_stub() -> types.ModuleType:
    """A ``torch`` module with just dtypes and Size, pickling like the real ones."""
    torch = _module("torch")
    if getattr(torch, "_kvs_stub", False):
        return torch

    class dtype:  # noqa: N801 - mirrors torch.dtype
        def __init__(self, name: str, itemsize: int) -> None:
            self.name = name
            self.itemsize = itemsize

        def __repr__(self) -> str:
            return "torch." + self.name

        __str__ = __repr__

        def __reduce__(self):  # torch/csrc/Dtype.cpp THPDtype_reduce
            return self.name

    dtype.__module__ = "torch"

    class Size(tuple):
        def __reduce__(self):  # torch/csrc/Size.cpp THPSize_reduce
            return (Size, (tuple(self),))

    Size.__module__ = "torch"
    Size.__qualname__ = "Size"
    torch.dtype = dtype
    torch.Size = Size
    torch.Tensor = object
    for name, size in DTYPE_SIZES.items():
        setattr(torch, name, dtype(name, size))
    torch._kvs_stub = True
    return torch


def stand_in_class(module: str, name: str) -> type:
    """A plain class registered as ``module.name`` so pickle finds it there."""
    mod = _module(module)
    if isinstance(getattr(mod, name, None), type):
        return getattr(mod, name)
    cls = type(name, (), {})
    cls.__module__ = module
    cls.__qualname__ = name
    setattr(mod, name, cls)
    return cls


def make_obj(cls: type, attrs: dict) -> object:
    obj = cls.__new__(cls)
    obj.__dict__.update(attrs)  # insertion order = the real __init__'s order
    return obj


# --------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------

UUID = "GPU-8f6e3c2a-1b2c-4d5e-8f90-0123456789ab"
HANDLE64 = bytes((i * 37 + 200) % 256 for i in range(64))  # has bytes >= 0x80
EVENT64 = bytes((i * 11 + 3) % 256 for i in range(64))
REFCOUNT = b"/torch_4242_1234567890_17"

P_CUDA = "lmcache.v1.platform.cuda.ipc_wrapper"  # 0.4.x (the SGLang seed's era)
P_CUSTOM = "lmcache.v1.multiprocess.custom_types"  # <= 0.3.x
P_CPU = "lmcache.v1.platform.cpu.shm"


def contiguous(shape):
    stride, acc = [], 1
    for d in reversed(shape):
        stride.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(stride))


def cuda_wrapper(module, dtype, shape, *, handle_prefix=b"\x02c", storage_offset=0,
                 storage_size=None, offset_bytes=4194304, event=EVENT64, sync=True,
                 device=1, as_size=False, stride=None):
    torch = install_torch_stub()
    cls = stand_in_class(module, "CudaIPCWrapper")
    item = DTYPE_SIZES[dtype]
    stride = stride or contiguous(shape)
    span = item * (storage_offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride)))
    size = storage_size if storage_size is not None else span
    mem = handle_prefix + HANDLE64
    handle = (device, mem, size, offset_bytes, REFCOUNT, 3, event, sync)
    obj = make_obj(cls, {
        "handle": handle,
        "dtype": getattr(torch, dtype),
        "shape": torch.Size(shape) if as_size else tuple(shape),
        "stride": tuple(stride),
        "storage_offset": storage_offset,
        "device_uuid": UUID,
    })
    expect = {
        "kind": "cuda_ipc", "device_index": device, "device_uuid": UUID,
        "ipc_mem_handle": HANDLE64.hex(), "storage_size_bytes": size,
        "storage_offset_bytes": offset_bytes,
        "ipc_event_handle": event.hex() if event else "-",
        "event_sync_required": int(sync), "shm_name": "-", "shm_offset_bytes": 0,
        "dtype": dtype, "element_size": item, "shape": shape, "stride": stride,
        "storage_offset": storage_offset,
    }
    return obj, expect


def raw_wrapper(module, dtype, shape, *, legacy=False, storage_offset=0):
    torch = install_torch_stub()
    cls = stand_in_class(module, "RawCudaIPCWrapper")
    item = DTYPE_SIZES[dtype]
    stride = contiguous(shape)
    nbytes = item * (storage_offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride)))
    if legacy:  # custom_types.RawCudaIPCWrapper (<= 0.3.x): no _alloc_offset
        attrs = {"_ipc_handle_reserved": HANDLE64, "_nbytes": nbytes, "handle": None,
                 "dtype": getattr(torch, dtype), "shape": tuple(shape), "stride": stride,
                 "storage_offset": storage_offset, "device_uuid": UUID}
        alloc_offset = 0
    else:
        alloc_offset = 1024
        attrs = {"_ipc_handle_reserved": HANDLE64, "_alloc_offset": alloc_offset,
                 "_nbytes": nbytes, "handle": None, "dtype": getattr(torch, dtype),
                 "shape": tuple(shape), "stride": stride, "storage_offset": storage_offset,
                 "_opens": 0, "device_uuid": UUID}
    expect = {
        "kind": "cuda_ipc", "device_index": -1, "device_uuid": UUID,
        "ipc_mem_handle": HANDLE64.hex(), "storage_size_bytes": nbytes,
        "storage_offset_bytes": alloc_offset, "ipc_event_handle": "-",
        "event_sync_required": 0, "shm_name": "-", "shm_offset_bytes": 0,
        "dtype": dtype, "element_size": item, "shape": shape, "stride": stride,
        "storage_offset": storage_offset,
    }
    return make_obj(cls, attrs), expect


def cpu_shm_wrapper(dtype, shape, *, storage_offset=0, name="/lmcache_kv_4242_0"):
    torch = install_torch_stub()
    cls = stand_in_class(P_CPU, "CpuShmTensorWrapper")
    item = DTYPE_SIZES[dtype]
    stride = contiguous(shape)
    nbytes = item * (storage_offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride)))
    attrs = {"shm_name": name, "nbytes": nbytes, "handle": None,
             "dtype": getattr(torch, dtype), "shape": tuple(shape), "stride": stride,
             "storage_offset": storage_offset, "device_uuid": "cpu"}
    expect = {
        "kind": "host_shm", "device_index": -1, "device_uuid": "cpu", "ipc_mem_handle": "-",
        "storage_size_bytes": nbytes, "storage_offset_bytes": 0, "ipc_event_handle": "-",
        "event_sync_required": 0, "shm_name": name, "shm_offset_bytes": 0, "dtype": dtype,
        "element_size": item, "shape": shape, "stride": stride,
        "storage_offset": storage_offset,
    }
    return make_obj(cls, attrs), expect


def fmt(v) -> str:
    if isinstance(v, (tuple, list)):
        return ",".join(str(x) for x in v) if v else "-"
    return str(v) if v != "" else "-"


def valid_fixtures():
    """(file, pickle bytes, expected fields)."""
    out = []
    vllm_layer = [2, 1000, 16, 8, 128]  # flash-attn [2, blocks, block_size, heads, head_dim]
    for proto in (2, 3, 4, 5):
        obj, exp = cuda_wrapper(P_CUDA, "float16", vllm_layer)
        out.append((f"cuda_f16_p{proto}.bin", pickle.dumps(obj, protocol=proto), exp))
        obj, exp = raw_wrapper(P_CUDA, "bfloat16", [4096, 16, 1, 576])
        out.append((f"raw_bf16_p{proto}.bin", pickle.dumps(obj, protocol=proto), exp))
        obj, exp = cpu_shm_wrapper("float32", [64, 16, 8, 64], storage_offset=0)
        out.append((f"cpu_shm_f32_p{proto}.bin", pickle.dumps(obj, protocol=proto), exp))
    # torch.Size shape, storage above 4 GiB (LONG1), no event, a storage offset.
    obj, exp = cuda_wrapper(P_CUDA, "bfloat16", [1, 3000000, 1024], as_size=True, storage_offset=64,
                            storage_size=6442450944, offset_bytes=2**33 + 512, event=None, sync=False)
    out.append(("cuda_bf16_size_long_p4.bin", pickle.dumps(obj, protocol=4), exp))
    obj, exp = cuda_wrapper(P_CUDA, "bfloat16", [1, 3000000, 1024], as_size=True, storage_offset=64,
                            storage_size=6442450944, offset_bytes=2**33 + 512, event=None, sync=False)
    out.append(("cuda_bf16_size_long_p2.bin", pickle.dumps(obj, protocol=2), exp))
    # fp8, a non-contiguous (permuted HND-over-NHD) view, protocol 2 bytes via _codecs.
    obj, exp = cuda_wrapper(P_CUDA, "float8_e4m3fn", [2, 500, 16, 8, 128],
                            stride=(8192000, 16384, 128, 2048, 1), storage_offset=0)
    out.append(("cuda_fp8_strided_p2.bin", pickle.dumps(obj, protocol=2), exp))
    # Oldest module path and a bare, pre-versioning 64-byte handle.
    obj, exp = cuda_wrapper(P_CUSTOM, "float16", [2, 10, 16, 4, 64], handle_prefix=b"", device=0)
    out.append(("cuda_custom_types_bare_p4.bin", pickle.dumps(obj, protocol=4), exp))
    # torch 2.13 writes version 3 with the same 'c' payload.
    obj, exp = cuda_wrapper(P_CUDA, "float32", [8, 8], handle_prefix=b"\x03c")
    out.append(("cuda_v3_handle_p5.bin", pickle.dumps(obj, protocol=5), exp))
    obj, exp = raw_wrapper(P_CUSTOM, "float16", [32, 16, 2, 64], legacy=True, storage_offset=128)
    out.append(("raw_custom_types_p3.bin", pickle.dumps(obj, protocol=3), exp))
    return out


def invalid_fixtures():
    """(file, bytes, error kind, detail substring)."""
    torch = install_torch_stub()
    out = []
    vmm_cls = stand_in_class(P_CUDA, "VmmCudaIPCWrapper")
    vmm = make_obj(vmm_cls, {"_export_id": b"\x01" * 16, "_kind": "posix_fd", "_fabric_blob": None,
                             "_fd": None, "_alloc_size": 2097152, "_alloc_offset": 0, "_nbytes": 4096,
                             "handle": b"\x01" * 16, "dtype": torch.float16, "shape": (2048,),
                             "stride": (1,), "storage_offset": 0, "device_uuid": UUID, "_opens": 0})
    out.append(("bad_vmm_p4.bin", pickle.dumps(vmm, protocol=4), "unsupported_wrapper", "VmmCudaIPCWrapper"))
    obj, _ = cuda_wrapper(P_CUDA, "float16", [4, 4], handle_prefix=b"\x02e")
    out.append(("bad_expandable_segment_p4.bin", pickle.dumps(obj, protocol=4), "unsupported_wrapper", "expandable"))
    # A view larger than its storage (LMCache 0.5.6 refuses the same).
    obj, _ = cuda_wrapper(P_CUDA, "float16", [4, 4], storage_size=16)
    out.append(("bad_view_exceeds_storage_p4.bin", pickle.dumps(obj, protocol=4), "bad_wrapper", "exceeds"))
    cls = stand_in_class(P_CUDA, "CudaIPCWrapper")
    nohandle = make_obj(cls, {"dtype": torch.float16, "shape": (1,), "stride": (1,),
                              "storage_offset": 0, "device_uuid": UUID})
    out.append(("bad_missing_handle_p4.bin", pickle.dumps(nohandle, protocol=4), "bad_wrapper", "'handle'"))
    out.append(("bad_not_a_wrapper_p4.bin", pickle.dumps((1, b"x", "y"), protocol=4), "bad_wrapper", "tuple"))
    # os.system("id"): GLOBAL, then REDUCE. Must stop at the GLOBAL.
    out.append(("bad_os_system_p2.bin", b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00idq\x01\x85q\x02Rq\x03.",
                 "pickle_global", "os.system"))
    class Evil:
        def __reduce__(self):
            return (os.system, ("id",))

    out.append(("bad_posix_system_p4.bin", pickle.dumps(Evil(), protocol=4), "pickle_global", "posix.system"))
    # Text-mode INT opcode (protocol 0), and a byte that is no opcode at all.
    out.append(("bad_opcode_int_p4.bin", b"\x80\x04I42\n.", "pickle_opcode", "INT"))
    out.append(("bad_opcode_ff_p4.bin", b"\x80\x04\xff.", "pickle_opcode", "0xff"))
    good = pickle.dumps(cuda_wrapper(P_CUDA, "float16", [2, 8])[0], protocol=4)
    out.append(("bad_truncated_p4.bin", good[: len(good) // 2], "pickle_truncated", ""))
    out.append(("bad_huge_unicode8_p4.bin", b"\x80\x04\x8d" + (2**62).to_bytes(8, "little") + b"abc.",
                "pickle_truncated", "4611686018427387904"))
    out.append(("bad_huge_binbytes_p3.bin", b"\x80\x03B\xff\xff\xff\xffab.", "pickle_truncated", "4294967295"))
    out.append(("bad_deep_nesting_p4.bin", b"\x80\x04" + b"]" * 100 + b"a" * 99 + b".", "pickle_limit", "nesting"))
    out.append(("bad_stack_bomb_p4.bin", b"\x80\x04" + b"N" * 300 + b".", "pickle_limit", "stack"))
    out.append(("bad_memo_slot_p4.bin", b"\x80\x04Nr\xff\xff\xff\xff.", "pickle_limit", "memo slot"))
    out.append(("bad_memo_unset_p4.bin", b"\x80\x04h\x07.", "pickle_malformed", "never set"))
    out.append(("bad_proto1.bin", b"\x80\x01N.", "pickle_malformed", "protocol 1"))
    out.append(("bad_trailing_p4.bin", b"\x80\x04N.junk", "pickle_malformed", "after STOP"))
    return out


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "fixtures", "pickles"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    order = ["kind", "device_index", "device_uuid", "ipc_mem_handle", "storage_size_bytes",
             "storage_offset_bytes", "ipc_event_handle", "event_sync_required", "shm_name",
             "shm_offset_bytes", "dtype", "element_size", "shape", "stride", "storage_offset"]
    lines = ["# generated by tests/tools/make_pickles.py; do not edit"]
    for name, data, exp in valid_fixtures():
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(data)
        lines.append(name + " ok " + " ".join(f"{k}={fmt(exp[k])}" for k in order))
    for name, data, kind, detail in invalid_fixtures():
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(data)
        lines.append(f"{name} error={kind} detail~={detail or '-'}")
    with open(os.path.join(args.out, "manifest.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines) - 1} fixtures to {os.path.normpath(args.out)}")


if __name__ == "__main__":
    main()
