#!/usr/bin/env python3
"""GPU check of kvsidecar's CUDA transfer backend, speaking as an engine.

Needs: an NVIDIA GPU, PyTorch with CUDA, a kvsidecar binary. No network.
pyzmq/msgspec are used when present, otherwise tests/gpu/mp_wire.py's
pure-Python msgpack and ZMTP carry the protocol.

What it does (everything an LMCache 0.5.6 engine adapter does on the wire):
  1. starts the sidecar with gpu.backend=cuda on a free local port;
  2. probes which KV-cache wrapper encoding the sidecar decodes: LMCache
     0.5.6's msgpack descriptor (ext 1 = msgspec-encoded CudaIPCData, see
     lmcache/v1/platform/base/ipc_wire.py) first, then the legacy pickled
     CudaIPCWrapper (ext 1 = pickle) the protocol notes describe;
  3. correctness, bit-exact, for SGLang MHA (page 16 and page 1) and vLLM
     flash-attn: register -> store (ordered after a real interprocess
     torch.cuda.Event recorded behind a GPU sleep + refill, so a copy that
     does not wait reads stale data) -> lookup -> retrieve into other pages
     -> compare, and check no other page changed; then a retrieve with
     skip_prefix (placeholders must stay untouched);
  4. bandwidth for a Llama-8B-shaped cache (32 layers, 8 kv heads, head_dim
     128, bf16, vLLM 16-token blocks, 256-token chunks) against torch's
     pinned-host<->device copy_ (cudaMemcpy) of the same bytes;
  5. prints one summary table; writes gpu_check.json and sidecar.log to
     --out (default $OUT or ./gpu_check_out).
Exit status: 0 all checks passed, 1 a check failed, 2 setup failed,
124 the deadline (default 420 s) hit.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_wire import Ext, MPClient, packb  # noqa: E402

try:
    import torch
except ImportError:  # pragma: no cover - only on a machine without torch
    print("drive_cuda: PyTorch is not installed; this check needs torch with CUDA", file=sys.stderr)
    sys.exit(2)

WRAPPER_MODULE_056 = "lmcache.v1.platform.devices.cuda.ipc_wrapper"

# ----------------------------------------------------------------- results

RESULTS: list[dict] = []


def record(name: str, ok: bool, detail: str = "") -> bool:
    RESULTS.append({"check": name, "ok": bool(ok), "detail": detail})
    print(f"[{'PASS' if ok else 'FAIL'}] {name}{': ' + detail if detail else ''}", flush=True)
    return ok


class SetupError(Exception):
    pass


class DeadlineReached(BaseException):
    """Raised by SIGALRM; a BaseException so no `except Exception` swallows it."""


# ----------------------------------------------------------------- sidecar


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sidecar:
    def __init__(self, binary: str, port: int, out_dir: str):
        self.log_path = os.path.join(out_dir, "sidecar.log")
        cmd = [binary, "--set", "gpu.backend=cuda",
               "--set", f"cache.endpoint=tcp://127.0.0.1:{port}",
               "--set", "events.enabled=false"]
        cmd += shlex.split(os.environ.get("KVSIDECAR_EXTRA_ARGS", ""))
        self.cmd = cmd
        self.log = open(self.log_path, "w")
        print("starting: " + " ".join(shlex.quote(c) for c in cmd), flush=True)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def connect(sidecar: Sidecar, port: int, transport: str, timeout_s: float = 30.0) -> MPClient:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if not sidecar.alive():
            raise SetupError(f"sidecar exited with {sidecar.proc.returncode}:\n{sidecar.tail()}")
        try:
            c = MPClient("127.0.0.1", port, transport=transport, timeout=30)
            try:
                answer = c.call("noop", [], timeout=1.0)
                record("noop answers 'OK'", answer == "OK", f"got {answer!r}")
                return c
            except TimeoutError:
                last = "no answer to noop"
            c.close()
        except OSError as e:  # the ZMTP fallback cannot connect before bind
            last = str(e)
        time.sleep(0.3)
    raise SetupError(f"sidecar not answering on port {port}: {last}\n{sidecar.tail()}")


# ----------------------------------------------------------------- wrappers

_UUIDS: dict[int, str] = {}


def device_uuid(index: int) -> str:
    if index not in _UUIDS:
        props = torch.cuda.get_device_properties(index)
        if not hasattr(props, "uuid"):
            raise SetupError("this torch has no device_properties.uuid (needs torch >= 2.1)")
        _UUIDS[index] = str(props.uuid)
    return _UUIDS[index]


def share(t: "torch.Tensor") -> dict:
    """What LMCache 0.5.6's CudaIPCWrapper.__init__ records (tensors here are contiguous,
    so attempt_permute_to_contiguous_view is the identity)."""
    handle = t.untyped_storage()._share_cuda_()
    return {
        "handle": tuple(handle),
        "dtype": t.dtype,
        "shape": tuple(int(s) for s in t.shape),
        "stride": tuple(int(s) for s in t.stride()),
        "storage_offset": int(t.storage_offset()),
        "device_uuid": device_uuid(t.device.index),
    }


def _plain(v):
    if isinstance(v, bool) or v is None or isinstance(v, (bytes, str)):
        return v
    if isinstance(v, int):
        return int(v)
    return v


def wire_msgpack(w: dict) -> Ext:
    """ext 1 holding msgspec.msgpack.encode(CudaIPCData(...)) — field order as msgspec emits it."""
    desc = {
        "type": "cuda",
        "handle": [_plain(x) for x in w["handle"]],
        "version": 1,
        "metadata": {
            "dtype": str(w["dtype"]).replace("torch.", ""),
            "shape": list(w["shape"]),
            "stride": list(w["stride"]),
            "storage_offset": w["storage_offset"],
            "device_uuid": w["device_uuid"],
        },
    }
    return Ext(1, packb(desc))


def _wrapper_class(module_path: str):
    """A class pickle will name `<module_path>.CudaIPCWrapper`, as LMCache's did."""
    parts = module_path.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        mod = sys.modules.get(name)
        if mod is None:
            mod = types.ModuleType(name)
            sys.modules[name] = mod
        if i > 1:
            setattr(sys.modules[".".join(parts[: i - 1])], parts[i - 1], mod)
    mod = sys.modules[module_path]
    cls = getattr(mod, "CudaIPCWrapper", None)
    if cls is None:
        cls = type("CudaIPCWrapper", (object,), {"__module__": module_path,
                                                  "__qualname__": "CudaIPCWrapper"})
        mod.CudaIPCWrapper = cls
    return cls


def wire_pickle(w: dict, module_path: str, protocol: int) -> Ext:
    cls = _wrapper_class(module_path)
    obj = cls.__new__(cls)
    obj.__dict__.update(w)  # handle, dtype (pickled as global torch.<name>), shape, stride, ...
    return Ext(1, pickle.dumps(obj, protocol=protocol))


class Encoding:
    def __init__(self, kind: str, module: str = WRAPPER_MODULE_056, protocol: int = 4):
        self.kind, self.module, self.protocol = kind, module, protocol

    def __call__(self, tensors) -> list:
        ws = [share(t) for t in tensors]
        if self.kind == "msgpack":
            return [wire_msgpack(w) for w in ws]
        return [wire_pickle(w, self.module, self.protocol) for w in ws]

    def __str__(self):
        if self.kind == "msgpack":
            return "msgpack CudaIPCData (LMCache 0.5.6)"
        return f"pickle {self.module}.CudaIPCWrapper (protocol {self.protocol})"


# ----------------------------------------------------------------- engine side


def engine_event() -> "torch.cuda.Event":
    ev = torch.cuda.Event(interprocess=True)
    ev.record(torch.cuda.current_stream())
    return ev


def wait_server_event(handle, device: int) -> None:
    if not handle:
        torch.cuda.synchronize()
        return
    if not isinstance(handle, (bytes, bytearray)) or len(handle) != 64:
        raise AssertionError(f"server event handle is {type(handle).__name__} of "
                             f"{len(handle) if hasattr(handle, '__len__') else '?'} bytes, not 64")
    torch.cuda.Event.from_ipc_handle(torch.device("cuda", device), bytes(handle)).synchronize()


def cuda_generator(device: int, seed: int) -> "torch.Generator":
    return torch.Generator(device=f"cuda:{device}").manual_seed(seed)


def gpu_delay() -> None:
    """Queue ~50 ms of GPU time on the engine stream: a server that does not
    wait on the engine's event copies before the writes that follow it."""
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(100_000_000)


def key(model: str, tokens: list[int], start: int, end: int, rid: str, worker_id):
    # IPCCacheServerKey (a dataclass: a msgpack map by field name, definition order).
    return {"model_name": model, "world_size": 1, "worker_id": worker_id,
            "token_ids": tokens, "start": start, "end": end, "request_id": rid,
            "cache_salt": "", "request_configs": None, "num_kv_readers": 1}


class EnginePools:
    """KV pools in one of the two layouts, with per-page int16 views for bit-exact checks."""

    def __init__(self, layout: str, layers: int, pages: int, page: int, heads: int, head_dim: int,
                 device: int, dtype=torch.bfloat16):
        self.layout, self.layers, self.pages, self.page = layout, layers, pages, page
        self.heads, self.head_dim, self.dtype = heads, head_dim, dtype
        dev = torch.device("cuda", device)
        if layout == "sglang":
            # Separate allocations per layer (the caching allocator may still
            # put several in one cudaMalloc segment: shared IPC handles).
            self.k = [torch.empty(pages * page, heads, head_dim, dtype=dtype, device=dev)
                      for _ in range(layers)]
            self.v = [torch.empty(pages * page, heads, head_dim, dtype=dtype, device=dev)
                      for _ in range(layers)]
            self.registered = self.k + self.v
            self.bases = self.registered
            self.views = [[t.view(pages, -1).view(torch.int16) for t in plane]
                          for plane in (self.k, self.v)]
        else:
            # vLLM: every layer a view into one allocation (nonzero storage offsets).
            big = torch.empty(layers, 2, pages, page, heads, head_dim, dtype=dtype, device=dev)
            self.registered = [big[i] for i in range(layers)]
            self.bases = [big]
            self.views = [[big[i, kv].reshape(pages, -1).view(torch.int16) for i in range(layers)]
                          for kv in range(2)]

    @property
    def token_bytes(self) -> int:
        return self.heads * self.head_dim * torch.tensor([], dtype=self.dtype).element_size()

    def fill(self, gen: "torch.Generator") -> None:
        """New random bits everywhere, generated ON the GPU: enqueued on the current
        stream without the host waiting, so it really runs after gpu_delay()."""
        for b in self.bases:
            b.view(torch.int16).random_(-32768, 32767, generator=gen)

    def snapshot(self):
        return [[v.clone() for v in plane] for plane in self.views]

    def pages_equal(self, dst: list[int], src_snapshot, src: list[int]) -> bool:
        di = torch.tensor(dst, device=self.views[0][0].device)
        si = torch.tensor(src, device=self.views[0][0].device)
        return all(torch.equal(self.views[kv][l].index_select(0, di),
                               src_snapshot[kv][l].index_select(0, si))
                   for kv in range(2) for l in range(self.layers))

    def unchanged_except(self, snap, written: list[int]) -> bool:
        keep = sorted(set(range(self.pages)) - set(written))
        ki = torch.tensor(keep, device=self.views[0][0].device)
        return all(torch.equal(self.views[kv][l].index_select(0, ki), snap[kv][l].index_select(0, ki))
                   for kv in range(2) for l in range(self.layers))


# ----------------------------------------------------------------- protocol steps


class Engine:
    def __init__(self, client: MPClient, device: int, encoding: Encoding, chunk: int):
        self.c, self.device, self.encoding, self.chunk = client, device, encoding, chunk
        self._next_instance = os.getpid() * 100
        self._rid = 0

    def register(self, pools: EnginePools, model: str, timeout: float = 30.0) -> int:
        self._next_instance += 1
        inst = self._next_instance
        if pools.layout == "sglang":
            hints = {"tokens_per_block": pools.page, "kv_list_layout": "k_v"}
        else:
            hints = {"kv_layout": "NHD"}
        self.c.call("register_kv_cache",
                    [inst, self.encoding(pools.registered), model, 1, pools.layout, hints, []],
                    timeout=timeout)
        return inst

    def unregister(self, inst: int) -> None:
        try:
            self.c.call("unregister_kv_cache", [inst], timeout=10)
        except TimeoutError:
            pass

    def rid(self, what: str) -> str:
        self._rid += 1
        return f"gpu-check-{what}-{self._rid}"

    def store(self, inst, model, tokens, block_ids, delay_and_refill=None):
        """Returns (ok, reply_seconds, total_seconds)."""
        if delay_and_refill is not None:
            gpu_delay()
            delay_and_refill()
        ev = engine_event()
        t0 = time.perf_counter()
        reply = self.c.call("store", [key(model, tokens, 0, len(tokens), self.rid("store"), 0),
                                      inst, [block_ids], ev.ipc_handle()])
        t1 = time.perf_counter()
        handle, ok = _pair(reply, "store")
        wait_server_event(handle, self.device)
        t2 = time.perf_counter()
        return bool(ok), t1 - t0, t2 - t0

    def lookup(self, model, tokens, rid) -> int:
        self.c.call("lookup", [key(model, tokens, 0, len(tokens), rid, None), 1])
        matched = self.c.call("wait_prefetch_status", [rid, 30.0], timeout=40)
        return -1 if matched is None else int(matched)

    def retrieve(self, inst, model, tokens, rid, block_ids, skip=0):
        ev = engine_event()
        t0 = time.perf_counter()
        reply = self.c.call("retrieve", [key(model, tokens, 0, len(tokens), rid, 0), inst,
                                         [block_ids], ev.ipc_handle(), skip])
        t1 = time.perf_counter()
        handle, ok = _pair(reply, "retrieve")
        wait_server_event(handle, self.device)
        t2 = time.perf_counter()
        return bool(ok), t1 - t0, t2 - t0

    def end_session(self, rid) -> None:
        self.c.call("end_session", [rid])


def _pair(reply, op):
    if not isinstance(reply, list) or len(reply) != 2:
        raise AssertionError(f"{op} replied {reply!r}, expected [event_handle, ok]")
    return reply[0], reply[1]


_TOKEN_BASE = [1000]


def fresh_tokens(n: int) -> list[int]:
    """Token ids no earlier request used, so every store is new to L1."""
    base = _TOKEN_BASE[0]
    _TOKEN_BASE[0] += n + 7
    return list(range(base, base + n))


# ----------------------------------------------------------------- checks


def probe_encoding(args, client: MPClient, device: int, chunk: int) -> Encoding | None:
    candidates = []
    if args.wrapper_encoding in ("auto", "msgpack"):
        candidates.append(Encoding("msgpack"))
    if args.wrapper_encoding in ("auto", "pickle"):
        candidates.append(Encoding("pickle", args.pickle_module, args.pickle_protocol))
    bs = 16
    for enc in candidates:
        eng = Engine(client, device, enc, chunk)
        pools = EnginePools("vllm", 1, chunk // bs + 1, bs, 8, 128, device)
        pools.fill(cuda_generator(eng.device, 1))
        inst = None
        try:
            inst = eng.register(pools, "kvs-gpu-probe", timeout=10)
            ok, _, _ = eng.store(inst, "kvs-gpu-probe", fresh_tokens(chunk),
                                 list(range(1, chunk // bs + 1)))
            if ok:
                record(f"probe: register + 1-chunk store with {enc}", True)
                return enc
            print(f"probe: {enc}: store answered ok=false", flush=True)
        except (TimeoutError, AssertionError) as e:
            print(f"probe: {enc}: {e}", flush=True)
        finally:
            if inst is not None:
                eng.unregister(inst)
    record("probe: a KV-cache wrapper encoding the sidecar accepts", False,
           "neither encoding worked; see sidecar.log")
    return None


def correctness(eng: Engine, layout: str, page: int, layers: int = 4, heads: int = 8,
                head_dim: int = 128, n_chunks: int = 2, seed: int = 0) -> None:
    name = f"{layout} page={page}"
    chunk = eng.chunk
    bpc = chunk // page
    n_ids = n_chunks * bpc
    pages = 3 * n_ids + 8  # page 0 stays a never-written placeholder (vLLM's null block)
    pools = EnginePools(layout, layers, pages, page, heads, head_dim, eng.device)
    gen = cuda_generator(eng.device, 1234 + seed)
    pools.fill(gen)
    perm = (torch.randperm(pages - 1, generator=torch.Generator().manual_seed(seed)) + 1).tolist()
    src, dst, dst2 = perm[:n_ids], perm[n_ids:2 * n_ids], perm[2 * n_ids:3 * n_ids]
    model = f"kvs-gpu-{layout}-{page}"
    tokens = fresh_tokens(n_chunks * chunk)
    inst = eng.register(pools, model)
    try:
        # STORE ordered after a GPU sleep and a refill of every pool.
        ok, _, _ = eng.store(inst, model, tokens, src, delay_and_refill=lambda: pools.fill(gen))
        if not record(f"{name}: store ok (ordered after the engine event)", ok):
            return
        truth = pools.snapshot()  # what the pools held when the engine event fired

        rid = eng.rid("lookup")
        matched = eng.lookup(model, tokens, rid)
        if not record(f"{name}: lookup finds the stored chunks", matched == n_chunks,
                      f"matched {matched} of {n_chunks}"):
            eng.end_session(rid)
            return
        before = pools.snapshot()
        ok, _, _ = eng.retrieve(inst, model, tokens, rid, dst)
        eng.end_session(rid)
        record(f"{name}: retrieve ok", ok)
        record(f"{name}: retrieved pages are bit-exact copies of the stored ones",
               pools.pages_equal(dst, truth, src))
        record(f"{name}: retrieve wrote nothing but its pages", pools.unchanged_except(before, dst))

        # Skip the first 3 blocks: placeholders (0) there must not be written.
        # The 5th RETRIEVE argument is a block count for SGLang's adapter but a
        # token count for vLLM's (LMCache 0.5.6: skip_first_n_tokens).
        skip_blocks = 3
        skip_arg = skip_blocks if layout == "sglang" else skip_blocks * page
        ids = [0] * skip_blocks + dst2[skip_blocks:]
        rid = eng.rid("lookup")
        matched = eng.lookup(model, tokens, rid)
        before = pools.snapshot()
        ok, _, _ = eng.retrieve(inst, model, tokens, rid, ids, skip=skip_arg)
        eng.end_session(rid)
        unit = "blocks" if layout == "sglang" else "tokens"
        record(f"{name}: retrieve with skip {skip_arg} {unit}", ok and matched == n_chunks,
               f"matched {matched}, ok {ok}")
        record(f"{name}: skipped pages untouched, the rest bit-exact",
               pools.pages_equal(dst2[skip_blocks:], truth, src[skip_blocks:]) and
               pools.unchanged_except(before, dst2[skip_blocks:]))
    finally:
        eng.unregister(inst)


def bandwidth(eng: Engine, chunks_per_req: int, iters: int) -> dict:
    layers, heads, head_dim, bs = 32, 8, 128, 16
    chunk = eng.chunk
    bpc = chunk // bs
    n_ids = chunks_per_req * bpc
    pools = EnginePools("vllm", layers, 2 * n_ids + 1, bs, heads, head_dim, eng.device)
    pools.fill(cuda_generator(eng.device, 7))
    src = list(range(1, n_ids + 1))
    dst = list(range(n_ids + 1, 2 * n_ids + 1))
    nbytes = 2 * layers * chunks_per_req * chunk * pools.token_bytes
    model = "kvs-gpu-bench-llama8b"
    inst = eng.register(pools, model)
    out = {"bytes_per_request": nbytes, "chunks_per_request": chunks_per_req}
    try:
        stores, replies, tokens, refused = [], [], None, 0
        for i in range(iters + 1):
            tokens = fresh_tokens(chunks_per_req * chunk)
            torch.cuda.synchronize()
            ok, reply_s, total_s = eng.store(inst, model, tokens, src)
            if not ok:
                refused += 1
                continue
            if i > 0:  # the first is a warm-up
                stores.append(total_s)
                replies.append(reply_s)
        out["store_s"], out["store_reply_s"], out["store_refused"] = stores, replies, refused
        record("bandwidth: every timed STORE accepted", refused == 0 and len(stores) == iters,
               f"{refused} refused (L1 too small? pass KVSIDECAR_EXTRA_ARGS)" if refused else "")

        retrieves, rreplies, misses = [], [], 0
        for i in range(iters + 1):
            rid = eng.rid("bench")
            matched = eng.lookup(model, tokens, rid)
            if matched != chunks_per_req:
                misses += 1
                eng.end_session(rid)
                continue
            torch.cuda.synchronize()
            ok, reply_s, total_s = eng.retrieve(inst, model, tokens, rid, dst)
            eng.end_session(rid)
            if ok and i > 0:
                retrieves.append(total_s)
                rreplies.append(reply_s)
        out["retrieve_s"], out["retrieve_reply_s"], out["retrieve_misses"] = retrieves, rreplies, misses
        record("bandwidth: every timed RETRIEVE hit and succeeded",
               misses == 0 and len(retrieves) == iters, f"{misses} lookups missed" if misses else "")
        if retrieves:
            record("bandwidth: retrieved Llama-8B pages bit-exact",
                   pools.pages_equal(dst, pools.snapshot(), src))
    finally:
        eng.unregister(inst)

    # Baseline: one contiguous cudaMemcpy of the same bytes, pinned host memory.
    dev = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{eng.device}")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    for direction in ("d2h", "h2d"):
        times = []
        for i in range(iters + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if direction == "d2h":
                host.copy_(dev, non_blocking=True)
            else:
                dev.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
            if i > 0:
                times.append(time.perf_counter() - t0)
        out[f"torch_{direction}_s"] = times
    del dev, host
    return out


def gbps(nbytes: int, seconds: list[float]):
    if not seconds:
        return None, None
    return nbytes / statistics.median(seconds) / 1e9, nbytes / min(seconds) / 1e9


def print_summary(meta: dict, bench: dict | None) -> None:
    print("\n" + "=" * 100)
    print(f"kvsidecar CUDA backend check — {meta['gpu']}, torch {meta['torch']}, "
          f"CUDA {meta['cuda']}, wrapper: {meta['encoding']}, transport: {meta['transport']}")
    print("-" * 100)
    print(f"{'check':<78} result")
    for r in RESULTS:
        print(f"{r['check'][:78]:<78} {'PASS' if r['ok'] else 'FAIL'}"
              + (f"  ({r['detail']})" if r["detail"] and not r["ok"] else ""))
    if bench:
        n = bench["bytes_per_request"]
        print("-" * 100)
        print(f"bandwidth: Llama-8B KV (32 layers x 8 kv heads x 128 dim, bf16), vLLM 16-token blocks, "
              f"{bench['chunks_per_request']} x 256-token chunks = {n / 2**20:.0f} MiB per request")
        print(f"{'path':<52}{'GB/s median':>14}{'GB/s best':>12}{'reply ms':>12}")
        rows = [
            ("kvsidecar STORE    GPU pages -> L1 (end to end)", bench.get("store_s"), bench.get("store_reply_s")),
            ("kvsidecar RETRIEVE L1 -> GPU pages (end to end)", bench.get("retrieve_s"), bench.get("retrieve_reply_s")),
            ("torch copy_ pinned D2H (one cudaMemcpy)", bench.get("torch_d2h_s"), None),
            ("torch copy_ pinned H2D (one cudaMemcpy)", bench.get("torch_h2d_s"), None),
        ]
        for label, secs, reply in rows:
            med, best = gbps(n, secs or [])
            rep = f"{statistics.median(reply) * 1e3:.2f}" if reply else "-"
            print(f"{label:<52}{(f'{med:.1f}' if med else 'n/a'):>14}"
                  f"{(f'{best:.1f}' if best else 'n/a'):>12}{rep:>12}")
    failed = sum(1 for r in RESULTS if not r["ok"])
    print("-" * 100)
    print(f"{len(RESULTS) - failed} passed, {failed} failed")
    print("=" * 100, flush=True)


# ----------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("KVSIDECAR_BIN"), help="kvsidecar binary")
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--transport", choices=["auto", "pyzmq", "zmtp"], default="auto")
    ap.add_argument("--wrapper-encoding", choices=["auto", "msgpack", "pickle"], default="auto")
    ap.add_argument("--pickle-module", default=WRAPPER_MODULE_056,
                    help="module path the pickled CudaIPCWrapper names")
    ap.add_argument("--pickle-protocol", type=int, default=4)
    ap.add_argument("--bench-chunks", type=int, default=8, help="256-token chunks per request")
    ap.add_argument("--bench-iters", type=int, default=4)
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--deadline", type=int, default=420, help="seconds before giving up")
    args = ap.parse_args()

    if not args.bin or not os.access(args.bin, os.X_OK):
        print(f"drive_cuda: no executable kvsidecar binary (--bin / KVSIDECAR_BIN): {args.bin}",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("drive_cuda: torch sees no CUDA device", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    torch.cuda.set_device(args.device)

    def on_deadline(signum, frame):
        raise DeadlineReached(f"deadline of {args.deadline} s reached")

    signal.signal(signal.SIGALRM, on_deadline)
    signal.alarm(args.deadline)

    meta = {"gpu": torch.cuda.get_device_name(args.device), "torch": torch.__version__,
            "cuda": torch.version.cuda, "encoding": "?", "transport": "?"}
    port = args.port or free_port()
    sidecar = Sidecar(args.bin, port, args.out)
    client = None
    bench = None
    status = 0
    try:
        client = connect(sidecar, port, args.transport)
        meta["transport"] = client.transport
        chunk = client.call("get_chunk_size", [])
        if not isinstance(chunk, int) or chunk <= 0 or chunk % 16:
            raise SetupError(f"get_chunk_size answered {chunk!r}")
        record("get_chunk_size", True, str(chunk))
        record("ping", client.call("ping", [None]) is True)

        enc = probe_encoding(args, client, args.device, chunk)
        if enc is None:
            raise SetupError("no wrapper encoding accepted")
        meta["encoding"] = str(enc)
        eng = Engine(client, args.device, enc, chunk)
        correctness(eng, "sglang", page=16, seed=1)
        correctness(eng, "sglang", page=1, seed=2)
        correctness(eng, "vllm", page=16, seed=3)
        if not args.no_bench:
            bench = bandwidth(eng, args.bench_chunks, args.bench_iters)
        record("sidecar still running", sidecar.alive())
    except SetupError as e:
        print(f"SETUP FAILED: {e}", file=sys.stderr, flush=True)
        status = 2
    except DeadlineReached as e:
        record("finished before the deadline", False, str(e))
        status = 124
    except TimeoutError as e:
        record("no request timed out", False, str(e))
        status = 1
    except Exception as e:  # report, then still print what we have
        import traceback

        traceback.print_exc()
        record("drive script ran to the end", False, f"{type(e).__name__}: {e}")
        status = 1
    finally:
        signal.alarm(0)
        if client is not None:
            client.close()
        sidecar.stop()

    print_summary(meta, bench)
    with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
        json.dump({"meta": meta, "results": RESULTS, "bench": bench,
                   "sidecar_cmd": sidecar.cmd}, f, indent=2)
    if any(not r["ok"] for r in RESULTS) and status == 0:
        status = 1
    if status:
        print("--- sidecar.log (tail) ---\n" + sidecar.tail(60), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
