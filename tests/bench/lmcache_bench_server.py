#!/usr/bin/env python3
"""LMCache's own server benchmark, `lmcache bench server`, against LMCache's
MP server and against kvsidecar, side by side in one run (issue #46).

An LMCache user judging a replacement runs exactly this: the CLI of the
LMCache release (0.5.6's `lmcache`, or another full release's with
--cli) drives each server with the same flags. Every run gets a fresh server
(the cold store of a fresh server is what a first user sees: L1 memory
never touched before), started, benchmarked, stopped; the order of the
two servers alternates every repetition (A B, B A, ...), one server at a
time (their L1s would not both fit beside each other on a small machine).

Per run it records, for each step the CLI reports (cold lookup, cold store,
warm lookup, warm retrieve), the p50 of its --end - --start requests, and:
- how many requests stored, how many warm lookups hit every chunk, how many
  retrieves succeeded (from the CLI's log), how many checksums matched
  (the CLI's "Checksum OK"; lmcache_driven asks the server's
  POST /cache/checksums, engine_driven hashes the client's own pages);
- the server's start time (launch until it answers), RSS when ready and its
  peak (VmHWM), and its CPU seconds (user + system) over the run;
- kvsidecar's own copy time per store / retrieve (/metrics
  kvsidecar_cache_copy_seconds_total; engine_driven: the staging copies).
The table: medians over the repetitions, ratios to the first of --servers.
result.json is rewritten after every run (--render prints its table).

  python3 tests/bench/lmcache_bench_server.py --kvsidecar build/kvsidecar \\
      [--venv build-venv-engine] [--cli DIR] [--reps 3] [--l1-gb 6] \\
      [--modes lmcache_driven,engine_driven] [--end 20] [--num-tokens 2048] \\
      [--kvs-set cache.l1_prefault=off ...] [--keep DIR]
  # kvsidecar configurations side by side (no LMCache):
  ... --servers off,background --variant off:cache.l1_prefault=off \\
      --variant background:cache.l1_prefault=background

LMCache's server: `lmcache server --l1-size-gb L1 --chunk-size 256
--eviction-policy LRU` (+ `--supported-transfer-mode engine_driven
--shm-name NAME` for engine_driven: its server hands out slots of its
shared-memory L1). kvsidecar: its defaults, cache.l1_size = L1, its
control plane (checksums) on a free port.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEPS = [("cold_lookup", "cold lookup"), ("cold_store", "cold store"),
         ("warm_lookup", "warm lookup"), ("warm_retrieve", "warm retrieve")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon... in KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if v.strip().endswith("kB"):
                out[k] = int(v.split()[0])
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process and its waited-for children."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def tcp_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class Server:
    """One fresh server: started, waited for, measured, stopped."""

    def __init__(self, name: str, cmd: list[str], env: dict, log: Path, ready, timeout: float):
        self.name = name
        self.log = log
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                     stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = t0 + timeout
        while not ready(self):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.proc.returncode} before ready; "
                                   f"log {log}:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{name} not ready after {timeout} s; log {log}:\n{self.tail()}")
            time.sleep(0.05)
        self.start_s = time.monotonic() - t0
        self.ready_status = proc_status(self.proc.pid)
        self.cpu0 = cpu_seconds(self.proc.pid)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, n: int = 3000) -> str:
        return self.text()[-n:]

    def figures(self) -> dict:
        st = proc_status(self.proc.pid)
        return {"start_s": self.start_s,
                "rss_ready_mib": self.ready_status.get("VmRSS", 0) / 1024,
                "rss_peak_mib": st.get("VmHWM", 0) / 1024,
                "cpu_s": cpu_seconds(self.proc.pid) - self.cpu0}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def start_lmcache(a, mode: str, work: Path, tag: str) -> tuple[Server, str, str]:
    port, http = free_port(), free_port()
    cmd = [str(a.venv / "bin" / "lmcache"), "server", "--host", "127.0.0.1", "--port", str(port),
           "--chunk-size", "256", "--l1-size-gb", str(a.l1_gb), "--eviction-policy", "LRU",
           "--http-host", "127.0.0.1", "--http-port", str(http)]
    if mode == "engine_driven":
        cmd += ["--supported-transfer-mode", "engine_driven",
                "--shm-name", f"lmc_bench_{os.getpid()}_{tag}"]
    env = dict(os.environ, LMCACHE_TRACK_USAGE="false", DO_NOT_TRACK="1",
               PROMETHEUS_MULTIPROC_DIR=str(work))
    env.pop("PYTHONPATH", None)

    def ready(s: Server) -> bool:  # both the MP port and the HTTP frontend answer
        return tcp_open(port) and tcp_open(http)
    srv = Server("lmcache", cmd, env, work / f"lmcache-{tag}.log", ready, a.start_timeout)
    return srv, f"tcp://127.0.0.1:{port}", f"http://127.0.0.1:{http}"


def start_kvsidecar(a, mode: str, work: Path, tag: str, sets: tuple[str, ...] = (),
                    binary: Path | None = None) -> tuple[Server, str, str]:
    port, http = free_port(), free_port()
    cmd = [str(binary or a.kvsidecar), "--set", "events.enabled=false", "--set", "gpu.backend=host",
           "--set", f"cache.endpoint=tcp://127.0.0.1:{port}",
           "--set", f"cache.l1_size={a.l1_gb}GiB", "--set", f"http.listen=127.0.0.1:{http}"]
    for kv in [*a.kvs_set, *sets]:
        cmd += ["--set", kv]

    def ready(s: Server) -> bool:
        return "kvsidecar ready" in s.text()
    srv = Server("kvsidecar", cmd, dict(os.environ), work / f"kvsidecar-{tag}.log", ready,
                 a.start_timeout)
    return srv, f"tcp://127.0.0.1:{port}", f"http://127.0.0.1:{http}"


def copy_seconds(http: str) -> dict:
    """kvsidecar's own copy time, by op, from /metrics (LMCache: none): the
    share of a step spent in the server's copies (engine_driven: staging <-> L1)."""
    import urllib.request
    try:
        text = urllib.request.urlopen(f"{http}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    out = {}
    for op in ("store", "retrieve"):
        m = re.search(rf'^kvsidecar_cache_copy_seconds_total{{[^}}]*op="{op}"[^}}]*}} ([\d.e+-]+)$',
                      text, re.M)
        if m:
            out[f"copy_s_{op}"] = float(m.group(1))
    return out


def find_key(d, key):
    if isinstance(d, dict):
        if key in d:
            return d[key]
        for v in d.values():
            r = find_key(v, key)
            if r is not None:
                return r
    return None


def bench(a, mode: str, rpc: str, http: str, out: Path) -> dict:
    cmd = [str(a.cli_python), "-m", "lmcache.cli.main", "bench", "server", "--rpc-url", rpc,
           "--url", http, "--mode", "cpu", "--transfer-mode", mode,
           "--num-tokens", str(a.num_tokens), "--start", "0", "--end", str(a.end),
           "--interval", "0", "--format", "json", "--output", str(out.with_suffix(".json"))]
    env = dict(os.environ, LMCACHE_TRACK_USAGE="false", DO_NOT_TRACK="1")
    env.pop("PYTHONPATH", None)
    if a.cli:
        env["PYTHONPATH"] = str(a.cli)
    # The CLI's CPU (its gather/scatter and page faults in engine_driven
    # mode): the children reaped while it runs are the CLI alone, the
    # servers are reaped after.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=a.bench_timeout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    client_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    out.with_suffix(".log").write_text(r.stdout + r.stderr)
    if r.returncode != 0 or not out.with_suffix(".json").is_file():
        raise RuntimeError(f"lmcache bench server exited {r.returncode}: {r.stderr[-2000:]}")
    res = json.loads(out.with_suffix(".json").read_text())
    log = r.stdout
    fig = {s: find_key(res, f"{s}_p50") for s, _ in STEPS}
    fig["client_cpu_s"] = client_cpu
    fig["requests"] = find_key(res, "total_requests") or 0
    fig["checksum_ok"] = find_key(res, "checksum_ok") or 0
    fig["checksum_fail"] = find_key(res, "checksum_fail") or 0
    fig["stored"] = len(re.findall(r"\[seq \d+/cold\] STORE: stored", log, re.I))
    fig["warm_hit"] = sum(1 for h, t in re.findall(r"\[seq \d+/warm\] LOOKUP: (\d+)/(\d+)", log)
                          if h == t and int(t) > 0)
    fig["retrieved"] = len(re.findall(r"\[seq \d+/warm\] RETRIEVE: retrieved", log,
                                      re.I))
    return fig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvsidecar", type=Path, required=True)
    ap.add_argument("--venv", type=Path, default=ROOT / "build-venv-engine",
                    help="LMCache 0.5.6's venv (its server; its CLI unless --cli)")
    ap.add_argument("--cli", type=Path, default=None,
                    help="a folder holding another release's full lmcache package (pip install "
                         "--no-deps --target), put first on PYTHONPATH of the CLI only; the "
                         "servers stay 0.5.6's. The slim lmcache-cli 0.5.7rc3.dev0 wheel cannot "
                         "run bench server so (it lacks lmcache.device_ops)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--l1-gb", type=int, default=6)
    ap.add_argument("--modes", default="lmcache_driven,engine_driven")
    ap.add_argument("--servers", default="lmcache,kvsidecar",
                    help="columns, the first the baseline of the ratios: lmcache, kvsidecar, "
                         "or a --variant's name")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VAL[,KEY=VAL]",
                    help="a kvsidecar with these --set values, named NAME in --servers "
                         "(e.g. off:cache.l1_prefault=off)")
    ap.add_argument("--binary", action="append", default=[], metavar="NAME:PATH",
                    help="another kvsidecar build, named NAME in --servers (an A/B of two "
                         "builds side by side, e.g. before:/tmp/kvsidecar-old)")
    ap.add_argument("--end", type=int, default=20)
    ap.add_argument("--num-tokens", type=int, default=2048)
    ap.add_argument("--kvs-set", action="append", default=[],
                    help="extra kvsidecar --set KEY=VALUE (repeatable)")
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--bench-timeout", type=float, default=900)
    ap.add_argument("--keep", type=Path, default=None)
    ap.add_argument("--render", type=Path, default=None,
                    help="print the table of a result.json (of a stopped run too) and exit")
    a = ap.parse_args()
    if a.render:
        runs = json.loads(a.render.read_text())
        a.reps = max(r["rep"] for r in runs) + 1
        print(table(runs, a.modes.split(","), a.servers.split(","), a))
        return 0
    # SIGTERM unwinds like an exception: each run's finally stops its server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    a.cli_python = a.venv / "bin" / "python"
    if not a.cli_python.is_file():
        sys.exit(f"--venv {a.venv}: no bin/python (LMCache 0.5.6's venv)")
    if not os.access(a.kvsidecar, os.X_OK):
        sys.exit(f"--kvsidecar {a.kvsidecar}: not an executable")
    work = a.keep or Path(tempfile.mkdtemp(prefix="lmc-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    modes = a.modes.split(",")
    servers = a.servers.split(",")
    starters = {"lmcache": start_lmcache, "kvsidecar": start_kvsidecar}
    for v in a.variant:
        name, _, sets = v.partition(":")
        starters[name] = (lambda sets: lambda a, m, w, t: start_kvsidecar(a, m, w, t, sets))(
            tuple(x for x in sets.split(",") if x))
    for b in a.binary:
        name, _, path = b.partition(":")
        if not os.access(path, os.X_OK):
            sys.exit(f"--binary {b}: {path} is not an executable")
        starters[name] = (lambda path: lambda a, m, w, t: start_kvsidecar(
            a, m, w, t, binary=Path(path)))(path)
    unknown = [s for s in servers if s not in starters]
    if unknown:
        sys.exit(f"--servers: {unknown} are neither lmcache, kvsidecar, a --variant nor a "
                 "--binary")
    runs = []  # dicts: server, mode, rep, figures | error
    for rep in range(a.reps):
        for mode in modes:
            order = servers if rep % 2 == 0 else servers[::-1]
            for name in order:
                tag = f"{name}-{mode}-{rep}"
                row = {"server": name, "mode": mode, "rep": rep}
                srv = None
                try:
                    srv, rpc, http = starters[name](a, mode, work, tag)
                    row.update(bench(a, mode, rpc, http, work / f"bench-{tag}"))
                    if name != "lmcache":
                        for op, n in copy_seconds(http).items():  # per request, ms
                            row[op.replace("copy_s_", "copy_ms_")] = n * 1000 / max(
                                row["stored" if op.endswith("store") else "retrieved"], 1)
                    row.update(srv.figures())
                    row["total_cpu_s"] = row["cpu_s"] + row["client_cpu_s"]
                except Exception as e:  # recorded and reported, not retried
                    row["error"] = str(e)[-1500:]
                finally:
                    if srv:
                        srv.stop()
                row["load"] = os.getloadavg()[0]
                runs.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
                # after every run: a stopped run keeps what it measured
                (work / "result.json").write_text(json.dumps(runs, indent=1))
    print(table(runs, modes, servers, a))
    print(f"\nraw runs and logs: {work}")
    return 0 if all("error" not in r for r in runs) else 1


def med(rows, key):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def table(runs, modes, servers, a) -> str:
    fmt = lambda v, d=1: "—" if v is None else f"{v:.{d}f}"  # noqa: E731
    base, others = servers[0], servers[1:]
    out = [f"`lmcache bench server --mode cpu --num-tokens {a.num_tokens} --start 0 --end {a.end} "
           f"--interval 0`, L1 {a.l1_gb} GiB, fresh server per run, medians of {a.reps} runs "
           f"(p50 of each run's {a.end} requests), ms:", "",
           "| mode | step | " + " | ".join(servers) + "".join(f" | {o} / {base}" for o in others)
           + " |", "|---|---|" + "---|" * (len(servers) + len(others))]
    for mode in modes:
        ok = {s: [r for r in runs if r["mode"] == mode and r["server"] == s and "error" not in r]
              for s in servers}
        rows = [(k, lbl, 2) for k, lbl in STEPS] + [
            ("start_s", "start (s)", 1), ("rss_ready_mib", "RSS ready (MiB)", 0),
            ("rss_peak_mib", "RSS peak (MiB)", 0), ("cpu_s", "server CPU (s)", 1),
            ("client_cpu_s", "the CLI's CPU (s)", 1), ("total_cpu_s", "server + CLI CPU (s)", 1),
            ("copy_ms_store", "server's copy per store (ms)", 2),
            ("copy_ms_retrieve", "server's copy per retrieve (ms)", 2)]
        for key, label, d in rows:
            vals = [med(ok[s], key) for s in servers]
            cells = [fmt(v, d) for v in vals]
            ratios = [f"{v / vals[0]:.2f}×" if vals[0] and v is not None else "—"
                      for v in vals[1:]]
            out.append(f"| {mode} | {label} | " + " | ".join(cells + ratios) + " |")
        for key, label in [("stored", "stored"), ("warm_hit", "warm lookups all hit"),
                           ("retrieved", "retrieved"), ("checksum_ok", "checksums verified")]:
            cells = ["/".join(str(r.get(key, 0)) for r in ok[s]) or "—" for s in servers]
            out.append(f"| {mode} | {label} (of {a.end}, per run) | " + " | ".join(cells)
                       + " |" * (len(others) + 1))
    for r in (r for r in runs if "error" in r):
        out.append(f"\nrun failed: {r['server']} {r['mode']} rep {r['rep']}: {r['error']}")
    loads = [r.get("load") for r in runs if r.get("load") is not None]
    if loads:
        out.append(f"\nload average (1 min) after each run: min {min(loads):.1f}, "
                   f"max {max(loads):.1f}; machine: {os.cpu_count()} CPUs")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
