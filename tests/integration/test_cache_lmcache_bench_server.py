"""LMCache's own server benchmark, `lmcache bench server` (the CLI of the
0.5.6 wheel), run against kvsidecar as an LMCache user would run it (issue
#46), short: 3 requests of 2 chunks, a small KV shape, both transfer modes.

Each request is a cold LOOKUP (a miss) + STORE, then a warm LOOKUP +
RETRIEVE into zeroed pages. Asserted from the CLI's own report: every
request stored, every warm lookup hit every chunk, every retrieve
succeeded; in engine_driven mode the CLI hashes its own pages before the
store and after the retrieve, and every checksum must match (the bytes came
back). In lmcache_driven mode the CLI asks the server's POST
/cache/checksums (block-id form) for the digests, and every one must match
too (bfloat16 and the digests themselves: test_cache_lmcache_bench.py).

Needs the engine venv (build-venv-engine); skipped without it. The
benchmark itself, with LMCache's server beside: tests/bench/lmcache_bench_server.py.
Run: KVSIDECAR_BIN=<build>/kvsidecar python3 -m pytest -q tests/integration/test_cache_lmcache_bench_server.py
"""

from __future__ import annotations

import re

import pytest

pytest.register_assert_rewrite("conftest_cache")

from lmcache_cli import release_env, run_cli

pytest_plugins = ["conftest_cache"]

REQUESTS = 3
# 4 layers x 2 heads x 64, fp16, K and V: 2 KiB a token, 512 KiB a chunk.
SHAPE = "(2,128,16,2,64):float16:4"


@pytest.mark.parametrize("mode", ["engine_driven", "lmcache_driven"])
def test_lmcache_bench_server_against_kvsidecar(cache_server, mode):
    env, why = release_env("0.5.6")
    if env is None:
        pytest.skip(why)
    srv = cache_server()
    [r] = run_cli("0.5.6", [[
        "bench", "server", "--rpc-url", srv.endpoint,
        "--url", f"http://127.0.0.1:{srv.sidecar.http_port}", "--mode", "cpu",
        "--transfer-mode", mode, "--num-tokens", "512", "--kvcache-shape-spec", SHAPE,
        "--start", "0", "--end", str(REQUESTS), "--interval", "0"]], timeout=300)
    out = r["out"] + r["err"]
    assert r["rc"] == 0, out[-3000:]
    stored = re.findall(r"\[seq \d+/cold\] STORE: stored \(512 tokens", out)
    hits = re.findall(r"\[seq \d+/warm\] LOOKUP: 2/2 chunks hit", out)
    retrieved = re.findall(r"\[seq \d+/warm\] RETRIEVE: retrieved \(512 tokens", out)
    assert (len(stored), len(hits), len(retrieved)) == (REQUESTS,) * 3, out[-3000:]
    assert re.search(rf"Total requests:?\s+{REQUESTS}\b", out), out[-3000:]
    matched = len(re.findall(r"\[seq \d+\] CHECKSUM MATCH OK", out))
    assert "CHECKSUM MISMATCH" not in out, out[-3000:]
    # engine_driven: the CLI hashes its own pages; lmcache_driven: it asks
    # kvsidecar's POST /cache/checksums (block-id form) before and after.
    assert matched == REQUESTS, out[-3000:]
