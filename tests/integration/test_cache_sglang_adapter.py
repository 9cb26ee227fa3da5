"""LMCache's own SGLang MP connector against kvsidecar (issue #25 item 4).

``lmcache.integration.sglang.multi_process_adapter.LMCacheMPConnector``
from LMCache 0.5.6, unmodified, in the engine venv (torch for CPU, the
lmcache wheel installed; ``build-venv-engine``), with KV pools shaped as
SGLang's ``MHATokenToKVPool`` allocates them (per layer a K and a V tensor
``[size + page, heads, head_dim]``) on the CPU: the connector moves them
into ``/lmcache_kv_*`` shared memory and registers them with
``EngineType.SGLANG`` and ``tokens_per_block`` (the host backend maps them).
``sglang_mp_adapter.py`` drives it as SGLang's radix cache does (store,
lookup + retrieve into other pages, retrieve with ``prefix_pad``, a miss,
close) and reports what it found; the bytes are compared in the driver,
K and V of every layer.

No SGLang engine: SGLang's CPU build is not on PyPI (its wheel needs
``sgl-kernel``'s CUDA kernels), so the connector is driven directly.
LMCache 0.5.7's SGLang connector (``unified_lmcache_mp_connector``) is
built on SGLang's unified cache components (``sglang.srt.mem_cache``)
and cannot be imported without SGLang itself.

Skipped without the engine venv; runs under the sanitizer build too (no
engine, a few seconds).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from kvsidecar_harness import free_port_range  # noqa: E402
import vllm_cpu_engine as ve  # noqa: E402

pytest_plugins = ["conftest_cache"]

DRIVER = HERE / "sglang_mp_adapter.py"
CHUNK = 256


_reason = ve.venv_missing()
pytestmark = pytest.mark.skipif(_reason is not None, reason=_reason or "")


def run_driver(srv, url: str, page: int, dtype: str = "float16") -> dict:
    p = subprocess.run([str(ve.venv_python()), str(DRIVER), "--url", url, "--page", str(page),
                        "--dtype", dtype], capture_output=True, text=True, timeout=180)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    report = json.loads(lines[-1]) if lines else {"error": "no report"}
    assert p.returncode == 0 and "error" not in report, (
        f"{report.get('error')}\n{report.get('trace', '')}\nstderr tail:\n"
        f"{p.stderr[-3000:]}\nkvsidecar log tail:\n{srv.tail()}")
    return report


def check_report(r: dict, first_hit: int = 0, prompt_chunks: int = 2) -> None:
    hit = prompt_chunks * CHUNK
    assert r["chunk_size"] == CHUNK
    assert r["first_lookup_hit_tokens"] == first_hit, r
    assert r["lookup_hit_tokens"] == hit, r
    assert r["retrieved_tokens"] == hit, r
    # K and V of both layers, byte for byte, in pages other than the source.
    assert r["retrieved_equal"] == [True] * 4, r
    assert r["retrieved_nonzero"], r
    # The partial chunk is neither stored nor written back.
    assert r["beyond_hit_untouched"], r
    assert r["pad_hit_tokens"] == hit and r["pad_retrieved_tokens"] == hit, r
    assert r["pad_pages_untouched"], r
    # The skipped pages (block id 0 in the request) are not written: the
    # skip count is read as pages, as this connector sends it.
    assert r["page0_untouched"], r
    assert r["pad_rest_equal"], r
    assert r["other_head_hit_tokens"] == 0, r
    assert r["healthy"] and r["closed"], r


def _server(cache_server, grpc: bool):
    o = {}
    if grpc:
        o["cache.grpc_endpoint"] = f"grpc://127.0.0.1:{free_port_range(1)}"
    srv = cache_server(overrides=o)
    url = o.get("cache.grpc_endpoint") or srv.endpoint
    return srv, url


@pytest.mark.parametrize("transport", ["zmq", "grpc"])
def test_sglang_connector_stores_and_retrieves_bytes(cache_server, transport):
    srv, url = _server(cache_server, transport == "grpc")
    r = run_driver(srv, url, page=16)
    check_report(r)
    # What the server did: 2 chunks stored once, and the registration gone
    # after close() (unregister, not the heartbeat timeout).
    s = srv.wait_stats(lambda s: s["stored"] == 2 and s["chunks"] == 2, what="stored=2")
    assert s["hits"] == 4 and s["lookups"] == 4, s   # 2 of 4 lookups hit 2 chunks each
    srv.wait_stats(lambda s: s["instances"] == 0 and s["registered"] >= 1, actor="registry",
                   what="instances=0 (unregistered)")
    if transport == "grpc":
        g = srv.wait_stats(lambda s: s["calls"] > 0, actor="grpc_bridge", what="gRPC calls")
        assert g["bad_requests"] == 0 and g["unimplemented"] == 0, g
    srv.wait_idle()


def test_sglang_chunks_are_shared_across_page_sizes_and_transports(cache_server):
    """An engine with 64-token pages stores over ZeroMQ; another with
    16-token pages, over gRPC, finds the same chunks and gets the same bytes
    (L1 is token-major: the page size is the engine's business); its own
    store of the same prompt adds nothing."""
    srv, grpc_url = _server(cache_server, True)
    check_report(run_driver(srv, srv.endpoint, page=64))
    srv.wait_stats(lambda s: s["stored"] == 2, what="stored=2 after the first engine")
    check_report(run_driver(srv, grpc_url, page=16), first_hit=2 * CHUNK)
    s = srv.wait_stats(lambda s: s["lookups"] == 8, what="both engines' lookups")
    assert s["stored"] == 2 and s["chunks"] == 2, s
    srv.wait_idle()
