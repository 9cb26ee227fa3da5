#!/usr/bin/env python3
"""Seeds for tests/fuzz/fuzz_grpc_transcode.cpp: real request messages made
with LMCache's own generated protobuf classes (the 0.5.6 or 0.5.7rc2 wheel,
unpacked: --lmcache-src DIR holding lmcache/), one file per method and
release. Input layout: [method index][release][message bytes] (the index is
the position in the target's `paths` table).

  python3 tests/tools/make_grpc_fuzz_seeds.py --lmcache-src /tmp/lmc057/0.5.7rc2 --release 2
  python3 tests/tools/make_grpc_fuzz_seeds.py --lmcache-src /tmp/lmc057/0.5.6 --release 1
"""
import argparse
import importlib
import struct
import sys
import types
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("--lmcache-src", required=True)
ap.add_argument("--release", type=int, required=True, help="1 = 0.5.6, 2 = 0.5.7")
ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "fuzz/seeds/fuzz_grpc_transcode"))
a = ap.parse_args()
src = Path(a.lmcache_src)
# Import the generated modules without lmcache/__init__ (it wants torch).
gen = src / "lmcache/v1/multiprocess/transport/grpc_impl/_proto_gen"
sys.path.insert(0, str(gen))
for pkg, path in [("lmcache", src / "lmcache"), ("lmcache.v1", src / "lmcache/v1"),
                  ("lmcache.v1.multiprocess", src / "lmcache/v1/multiprocess"),
                  ("lmcache.v1.multiprocess.transport", src / "lmcache/v1/multiprocess/transport"),
                  ("lmcache.v1.multiprocess.transport.grpc_impl", src / "lmcache/v1/multiprocess/transport/grpc_impl"),
                  ("lmcache.v1.multiprocess.transport.grpc_impl._proto_gen", gen)]:
    m = types.ModuleType(pkg)
    m.__path__ = [str(path)]
    sys.modules[pkg] = m
P = "lmcache.v1.multiprocess.transport.grpc_impl._proto_gen."
common = importlib.import_module(P + "common_pb2")
lookup = importlib.import_module(P + "lookup_service_pb2")
ld = importlib.import_module(P + "lmcache_driven_service_pb2")
ed = importlib.import_module(P + "engine_driven_service_pb2")

toks = [1, 2, 3, 300, 70000]
def key(**kw):
    k = common.IpcCacheServerKey(model_name="m", world_size=1, start=0, end=5, request_id="r",
                                 num_kv_readers=1, **kw)
    if a.release == 2:
        k.token_bytes = b"".join(struct.pack(">I", t) for t in toks)
    else:
        k.token_ids.extend(toks)
    return k

seeds = {
    2: ld.StoreRequest(key=key(worker_id=0), instance_id=7,
                       gpu_block_ids=[common.BlockIdGroup(block_ids=[0, 1])], event_ipc_handle=b"e"),
    3: ld.RetrieveRequest(key=key(worker_id=0), instance_id=7,
                          gpu_block_ids=[common.BlockIdGroup(block_ids=[2, 3])], skip_first_n_tokens=0),
    4: lookup.LookupRequest(key=key(), tp_size=1),
    6: lookup.WaitPrefetchStatusRequest(request_id="r", timeout=5.0),
    7: lookup.FreeLookupLocksRequest(key=key(), tp_size=1),
    9: ed.RegisterKvCacheEngineDrivenContextRequest(instance_id=7, model_name="m", world_size=1,
                                                     block_size=16, num_layers=2, hidden_dim_size=512,
                                                     dtype_str="bfloat16", use_mla=False),
    11: ed.PrepareStoreRequest(key=key(worker_id=0), instance_id=7),
    12: ed.CommitStoreRequest(key=key(worker_id=0), instance_id=7, data=b""),
}
out = Path(a.out)
out.mkdir(parents=True, exist_ok=True)
for idx, msg in seeds.items():
    (out / f"r{a.release}_m{idx}").write_bytes(bytes([idx, a.release]) + msg.SerializeToString())
print(f"{len(seeds)} seeds in {out}")
