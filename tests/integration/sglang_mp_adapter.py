"""LMCache 0.5.6's own SGLang MP connector against a cache server, on CPU.

Run under the engine venv's Python (``build-venv-engine``: torch for CPU and
``lmcache`` 0.5.6 installed), as

    python sglang_mp_adapter.py --url tcp://127.0.0.1:PORT [--page 16] [--dtype float16]

It builds the KV pools an SGLang MHA engine allocates (``MHATokenToKVPool``:
per layer a K and a V tensor ``[size + page_size, head_num, head_dim]``,
token-major, slot 0.. of page p at rows ``p*page .. p*page+page-1``), hands
them to ``lmcache.integration.sglang.multi_process_adapter.LMCacheMPConnector``
unmodified (it migrates them into ``/lmcache_kv_*`` shared memory and
registers them with ``EngineType.SGLANG`` and ``tokens_per_block``), then
drives it the way SGLang's radix cache does:

1. ``lookup_kv`` (a miss), ``store_kv`` a 2-chunk prompt (plus a partial
   chunk, never stored) whose KV lives in pages ``SRC``, ``end_session``;
2. ``lookup_kv`` in a new request: the matched tokens;
   ``retrieve_kv`` into other pages ``DST``: the bytes there must equal
   ``SRC``'s, K and V, every layer; ``end_session``;
3. the same with ``prefix_pad``: the leading pages the engine already has
   are sentinel -1 in the slot mapping and must stay untouched;
4. a prompt with another head: ``lookup_kv`` finds nothing;
5. ``close()``: unregister.

Prints one JSON line (the facts; the test asserts on them) and exits 0, or
prints ``{"error": ...}`` and exits 1. Stdlib + torch + lmcache only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from types import SimpleNamespace

CHUNK_TOKENS = 256
LAYERS = 2
HEADS = 2
HEAD_DIM = 64


def tokens(head: int, n: int) -> list[int]:
    ids = [(i * 7919 + 13) % 4086 + 10 for i in range(n)]
    for i in range(8):
        ids[i] = (head * 101 + i * 37 + 5) % 4086 + 10
    return ids


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True, help="tcp://H:P or grpc://H:P")
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--timeout", type=float, default=20.0)
    args = ap.parse_args()

    import torch
    from lmcache.integration.sglang.multi_process_adapter import LMCacheMPConnector
    from lmcache.integration.sglang.sglang_adapter import LoadMetadata, StoreMetadata

    page = args.page
    dtype = getattr(torch, args.dtype)
    n_tokens = 2 * CHUNK_TOKENS + page * 3  # 2 full chunks and a partial one
    pages_needed = (n_tokens + page - 1) // page
    src_page0, dst_page0, pad_page0 = 1, 1 + pages_needed, 1 + 2 * pages_needed
    num_pages = 1 + 3 * pages_needed
    size = num_pages * page
    # SGLang's MHATokenToKVPool: [size + page_size, head_num, head_dim] per layer.
    k_pool = [torch.zeros(size + page, HEADS, HEAD_DIM, dtype=dtype) for _ in range(LAYERS)]
    v_pool = [torch.zeros(size + page, HEADS, HEAD_DIM, dtype=dtype) for _ in range(LAYERS)]

    # "host" is the scheme part, "port" the rest, as SGLang's server args
    # pass them (the connector joins them back with ':').
    host, _, port = args.url.rpartition(":")
    report: dict = {"url": args.url, "page": page, "dtype": args.dtype}
    t0 = time.monotonic()
    conn = LMCacheMPConnector(
        sgl_config=SimpleNamespace(model_path="tiny-sglang-mha"),
        tp_size=1, rank=0, page_size=page, host=host, port=port,
        k_pool=k_pool, v_pool=v_pool, mq_timeout=args.timeout, heartbeat_interval=1.0)
    report["register_s"] = round(time.monotonic() - t0, 3)
    report["chunk_size"] = conn.chunk_size()
    report["instance_id"] = conn.instance_id

    # The pools now live in shared memory (the connector migrated them):
    # write the prompt's KV into the source pages in place.
    # The same values whatever the page size (each tensor its own seed, the
    # full chunks drawn apart from the partial one): a run with another
    # page size finds exactly these bytes in what an earlier run stored.
    full = 2 * CHUNK_TOKENS
    base = src_page0 * page
    for i, t in enumerate([*k_pool, *v_pool]):
        g = torch.Generator().manual_seed(1234 + i)
        t[base: base + full] = torch.randn(full, HEADS, HEAD_DIM, generator=g).to(dtype)
        t[base + full: base + n_tokens] = torch.randn(
            n_tokens - full, HEADS, HEAD_DIM, generator=g).to(dtype)

    def slots(first_page: int, n: int) -> torch.Tensor:
        return torch.arange(first_page * page, first_page * page + n, dtype=torch.int64)

    prompt = tokens(0, n_tokens)
    # Pass 1, as SGLang runs a request: lookup_kv when it is scheduled (a
    # miss), store_kv when it finishes, end_session (which LMCache's
    # connector sends only for a request it looked up).
    report["first_lookup_hit_tokens"] = conn.lookup_kv(prompt, "sgl-store-1")
    conn.store_kv(StoreMetadata(last_node=None, token_ids=prompt,
                                kv_indices=slots(src_page0, n_tokens), offset=0,
                                request_id="sgl-store-1"))
    conn.end_session("sgl-store-1")

    # Pass 2: a new request for the same prompt.
    hit = conn.lookup_kv(prompt, "sgl-load-1")
    report["lookup_hit_tokens"] = hit
    got = conn.retrieve_kv(LoadMetadata(token_ids=prompt, slot_mapping=slots(dst_page0, n_tokens),
                                        offset=0, request_id="sgl-load-1")) if hit else 0
    conn.end_session("sgl-load-1")
    report["retrieved_tokens"] = got
    dst_rows = slice(dst_page0 * page, dst_page0 * page + hit)
    same = [bool(torch.equal(t[src_page0 * page: src_page0 * page + hit], t[dst_rows]))
            for t in [*k_pool, *v_pool]]
    report["retrieved_equal"] = same
    report["retrieved_nonzero"] = bool(any(t[dst_rows].abs().sum().item() > 0
                                           for t in k_pool))
    tail = slice(dst_page0 * page + hit, dst_page0 * page + n_tokens)
    report["beyond_hit_untouched"] = all(bool((t[tail] == 0).all()) for t in [*k_pool, *v_pool])

    # prefix_pad: the engine's radix already has the first 2 pages; their
    # slots are -1 and the server must skip them.
    pad = 2 * page
    mapping = slots(pad_page0, n_tokens)
    mapping[:pad] = -1
    hit2 = conn.lookup_kv(prompt, "sgl-load-2")
    got2 = conn.retrieve_kv(LoadMetadata(token_ids=prompt, slot_mapping=mapping, offset=0,
                                         prefix_pad=pad, request_id="sgl-load-2")) if hit2 else 0
    conn.end_session("sgl-load-2")
    report["pad_hit_tokens"] = hit2
    report["pad_retrieved_tokens"] = got2
    # The connector names the skipped pages block 0 (SGLang's reserved
    # padding page) and sends prefix_pad // page, a count of pages, as
    # skip_prefix_n_blocks: a server that read it as tokens would write
    # the first pages of the chunk over page 0.
    report["page0_untouched"] = all(bool((t[:page] == 0).all()) for t in [*k_pool, *v_pool])
    pad_rows = slice(pad_page0 * page, pad_page0 * page + pad)
    report["pad_pages_untouched"] = all(bool((t[pad_rows] == 0).all()) for t in [*k_pool, *v_pool])
    rest_src = slice(src_page0 * page + pad, src_page0 * page + hit2)
    rest_dst = slice(pad_page0 * page + pad, pad_page0 * page + hit2)
    report["pad_rest_equal"] = all(bool(torch.equal(t[rest_src], t[rest_dst]))
                                   for t in [*k_pool, *v_pool])

    # Another head: every chunk hash differs.
    report["other_head_hit_tokens"] = conn.lookup_kv(tokens(1, n_tokens), "sgl-miss-1")
    conn.end_session("sgl-miss-1")
    report["healthy"] = conn.is_healthy
    conn.close()
    report["closed"] = True
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # the test prints it with the sidecar's log
        print(json.dumps({"error": f"{type(e).__name__}: {e}",
                          "trace": traceback.format_exc()}), flush=True)
        sys.exit(1)
