"""LMCache's own server benchmark, ``lmcache bench server`` (the 0.5.6
wheel's CLI in the engine venv), against kvsidecar in its
``--mode cpu --transfer-mode lmcache_driven`` form: the benchmark registers
a CPU KV cache over POSIX shared memory, and for every request stores it
cold, retrieves it warm, and verifies both through
``POST /cache/checksums {"block_ids", "chunk_size", "instance_id",
"layerwise": false}`` on kvsidecar's HTTP side, comparing the cold digests
with the warm ones. Asserted from its JSON summary and its log: every
request completed, every checksum was available and matched, none failed,
and each request's digests were answered by kvsidecar (not skipped).

bfloat16 KV (LMCache hashes bfloat16 upcast to float32) runs a few small
requests here; float16 runs in test_cache_lmcache_bench_server.py. Side by side, kvsidecar's answer to the same
block-id call equals the one LMCache's own ``_compute_block_checksums``
gives over the same shared-memory bytes (tests/integration/
lmcache_block_checksums.py), aggregated and layerwise, with its errors.
Needs the engine venv (build-venv-engine: lmcache 0.5.6 with torch,
scripts/install-deps.sh --with-python); skipped with the reason without it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytest.register_assert_rewrite("conftest_cache")

from kvsidecar_harness import Sidecar, free_port_range
from lmcache_cli import VENV, release_env, run_cli
from test_http_control_plane import Engine, lmc, request  # noqa: F401 (lmc: a fixture)

pytest_plugins = ["conftest_cache"]

REQUESTS = 3


# float16 in both transfer modes: test_cache_lmcache_bench_server.py.
@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_lmcache_bench_server_verifies_every_request(dtype, tmp_path):
    env, why = release_env("0.5.6")
    if env is None:
        pytest.skip(why)
    port = free_port_range(1)
    sc = Sidecar(tmp_path / "sidecar", {
        "events.enabled": False,
        "cache.endpoint": f"tcp://127.0.0.1:{port}",
        "cache.l1_size": "64MiB",
        "gpu.backend": "host",
    })
    sc.start()
    try:
        out = tmp_path / "bench.json"
        # 2 layers of [2, 64 blocks, 16 tokens, 2 heads, 64 dims]: 4 KiB pages,
        # 256-token chunks of 16 blocks; 512 tokens a request = 2 chunks.
        [r] = run_cli("0.5.6", [[
            "bench", "server", "--rpc-url", f"tcp://127.0.0.1:{port}",
            "--url", f"http://127.0.0.1:{sc.http_port}",
            "--mode", "cpu", "--transfer-mode", "lmcache_driven",
            "--kvcache-shape-spec", f"(2,64,16,2,64):{dtype}:2",
            "--num-tokens", "512", "--start", "0", "--end", str(REQUESTS),
            "--interval", "0", "--format", "json", "--output", str(out)]], timeout=180)
        log = r["out"] + r["err"]
        assert r["rc"] == 0, log[-4000:]
        assert "Checksum query failed" not in log, log[-4000:]
        assert "[WARNING]" not in log, log[-4000:]
        summary = json.loads(out.read_text())
        flat = {}

        def walk(o):
            if isinstance(o, dict):
                for k, v in o.items():
                    if isinstance(v, (dict, list)):
                        walk(v)
                    else:
                        flat[k] = v
            elif isinstance(o, list):
                for v in o:
                    walk(v)
        walk(summary)
        assert flat.get("total_requests") == REQUESTS, summary
        assert flat.get("checksum_ok") == REQUESTS, summary
        assert flat.get("checksum_fail") == 0, summary
        # Cold and warm digests of every request came from kvsidecar: one
        # CHECKSUM line per pass, 2 chunks each, all matching.
        assert log.count("CHECKSUM MATCH OK") == REQUESTS, log[-4000:]
        assert log.count("] CHECKSUM: ") == 2 * REQUESTS, log[-4000:]
        assert log.count("] CHECKSUM: ") == log.count("(2 chunks)\n"), log[-4000:]
        for seq in range(REQUESTS):
            assert f"[seq {seq}/warm] LOOKUP: 2/2 chunks hit" in log, log[-4000:]
            assert f"[seq {seq}/warm] RETRIEVE: retrieved" in log, log[-4000:]
    finally:
        sc.stop()


def lmcache_answer(pools, body: dict) -> dict:
    r = subprocess.run([str(VENV / "bin" / "python"),
                        str(Path(__file__).with_name("lmcache_block_checksums.py")),
                        json.dumps({"descriptors": pools.descriptors(), "body": body})],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_block_checksums_equal_lmcache_own(lmc, cache_server, kv_pools):
    env, why = release_env("0.5.6")
    if env is None:
        pytest.skip(why)
    srv = cache_server()
    pools = kv_pools("vllm", num_blocks=40)  # bfloat16, 2 layers, [2, 40, 16, 2, 16]
    eng = Engine(lmc, srv, pools, instance=4901)
    port = srv.sidecar.http_port
    try:
        bodies = [
            {"block_ids": [5, 1, 2, 3, 9, 39, 0], "chunk_size": 3, "instance_id": 4901,
             "layerwise": False},
            {"block_ids": [7, 8, 9, 10], "chunk_size": 4, "instance_id": 4901,
             "layerwise": True},
        ]
        for body in bodies:
            status, ours = request(port, "POST", "/cache/checksums", body)
            assert status == 200, ours
            theirs = lmcache_answer(pools, body)
            assert ours == theirs
        # Different blocks, different digests (the comparison is not of constants).
        one = [request(port, "POST", "/cache/checksums",
                       {"block_ids": [b], "chunk_size": 1, "instance_id": 4901})[1]
               for b in (1, 2)]
        assert one[0]["chunk_checksums"] != one[1]["chunk_checksums"]

        # LMCache's refusals, with its status codes.
        for body, code, words in [
            ({"block_ids": [1], "chunk_size": 1, "instance_id": 77}, 404,
             "instance_id 77 not registered"),
            ({"block_ids": [], "chunk_size": 1, "instance_id": 4901}, 400,
             "block_ids is required"),
            ({"block_ids": [1], "chunk_size": 0, "instance_id": 4901}, 400,
             "chunk_size must be positive"),
            ({"block_ids": [40], "chunk_size": 1, "instance_id": 4901}, 400, "block_ids[0] = 40"),
            ({"block_ids": [1], "chunk_size": "x", "instance_id": 4901}, 422, "chunk_size"),
        ]:
            status, ans = request(port, "POST", "/cache/checksums", body)
            assert status == code, (body, ans)
            assert words in ans["detail"], (body, ans)
    finally:
        eng.close()
