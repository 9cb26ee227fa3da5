"""The kvsidecar binary as an operator meets it: command line, config
validation and its one-line errors, start-up, signals, log formats."""

import json
import re
import signal
import socket
import subprocess
import tomllib

import pytest

from kvsidecar_harness import REPO_ROOT, binary_path, free_port_range, set_args, wait_until

DEFAULT_TOML = REPO_ROOT / "config" / "default.toml"
ERROR_RE = re.compile(r"^config error: (?P<source>.+?)(?::(?P<line>\d+))?: key '(?P<key>[^']+)': (?P<what>.+)$")


def run(*args, timeout=10):
    return subprocess.run([str(binary_path()), *args], capture_output=True, text=True,
                          timeout=timeout)


def free_ports_overrides(dp_size=1):
    """Every endpoint of the default config moved to free ports."""
    return {
        "events.endpoint": f"tcp://*:{free_port_range(dp_size)}",
        "events.replay_endpoint": f"tcp://*:{free_port_range(dp_size)}",
        "events.ingest_endpoint": f"tcp://127.0.0.1:{free_port_range(dp_size)}",
        "cache.endpoint": f"tcp://*:{free_port_range(1)}",
        "http.listen": f"127.0.0.1:{free_port_range(1)}",
    }


def only_error_line(stderr: str) -> re.Match:
    lines = [l for l in stderr.splitlines() if l.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{stderr}"
    m = ERROR_RE.match(lines[0])
    assert m, f"not the promised 'config error: FILE:LINE: key ...: what' line: {lines[0]!r}"
    return m


# --- command line -------------------------------------------------------------------


def test_help_lists_every_option():
    r = run("--help")
    assert r.returncode == 0
    for opt in ("--config", "--set", "--print-default-config", "--check-config", "--version",
                "--help"):
        assert opt in r.stdout, f"{opt} missing from --help:\n{r.stdout}"
    # The exit statuses are documented where operators look.
    assert "0 clean" in r.stdout and "1 start-up failure" in r.stdout and "2 invalid" in r.stdout


def test_print_default_config_is_the_documented_toml():
    r = run("--print-default-config")
    assert r.returncode == 0, r.stderr
    text = DEFAULT_TOML.read_text()
    assert r.stdout == text
    parsed = tomllib.loads(r.stdout)
    assert parsed == tomllib.loads(text)
    assert set(parsed) == {"sidecar", "events", "cache", "gpu", "security", "http", "l2", "coordinator"}
    assert parsed["events"]["endpoint"] == "tcp://*:5600"


def test_unknown_option_is_status_2():
    r = run("--no-such-option")
    assert r.returncode == 2


def test_check_config_valid_file(tmp_path):
    f = tmp_path / "ok.toml"
    f.write_text('[events]\nformat = "tokenspeed"\ndp_size = 4\n\n[cache]\nl1_size = "64MiB"\n')
    r = run("--check-config", str(f))
    assert r.returncode == 0, r.stderr
    assert "valid" in r.stdout
    # The default itself validates; an empty file means "all defaults".
    d = tmp_path / "default.toml"
    d.write_text(DEFAULT_TOML.read_text())
    assert run("--check-config", str(d)).returncode == 0
    e = tmp_path / "empty.toml"
    e.write_text("")
    assert run("--check-config", str(e)).returncode == 0


# (file text, key, line of the bad value, words the message must contain)
BAD_CONFIGS = {
    "unknown_key": ("[events]\nformat = \"vllm\"\nbogus = 1\n", "events.bogus", 3, ["unknown key"]),
    "wrong_type": ("[events]\ndp_size = \"two\"\n", "events.dp_size", 2, ["integer", "string"]),
    "port_out_of_range": ("[events]\n\nendpoint = \"tcp://*:70000\"\n", "events.endpoint", 3,
                          ["70000"]),
    "size_4XB": ("[cache]\nl1_size = \"4XB\"\n", "cache.l1_size", 2, ["4XB"]),
    "duration_parsecs": ("[sidecar]\nname = \"x\"\nstats_interval = \"10 parsecs\"\n",
                         "sidecar.stats_interval", 3, ["10 parsecs"]),
    "unknown_section": ("[events]\ndp_size = 2\n\n[bogus]\nx = 1\n", "bogus", 4,
                        ["unknown section"]),
    "bad_enum": ("[events]\nformat = \"sglang\"\n", "events.format", 2, ["sglang", "vllm",
                                                                         "tokenspeed"]),
    "dp_port_overflow": ("[events]\ndp_size = 2\nendpoint = \"tcp://*:65535\"\n", "events.endpoint",
                         3, ["65535", "dp rank 1"]),
    "http_listen_not_ipv4": ("[http]\nenabled = true\nlisten = \"localhost:9090\"\n",
                             "http.listen", 3, ["localhost:9090", "IPv4"]),
    "evict_low_not_below_high": ("[cache]\nevict_high = 0.5\nevict_low = 0.5\n", "cache.evict_low",
                                 3, ["evict_high"]),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
@pytest.mark.parametrize("mode", ["check", "run"])
def test_bad_config_rejected_with_one_line(tmp_path, case, mode):
    text, key, line, words = BAD_CONFIGS[case]
    f = tmp_path / f"{case}.toml"
    f.write_text(text)
    args = ["--check-config", str(f)] if mode == "check" else ["--config", str(f)]
    r = run(*args)
    assert r.returncode == 2, f"exit {r.returncode}\n{r.stderr}"
    m = only_error_line(r.stderr)
    assert m["source"] == str(f)
    assert m["key"] == key
    assert m["line"] is not None and int(m["line"]) == line, m.group(0)
    for w in words:
        assert w in m["what"], f"{w!r} not in {m['what']!r}"


@pytest.mark.parametrize("kv,key,words", [
    ("events.dp_size=abc", "events.dp_size", ["integer", "string"]),
    ("events.nope=1", "events.nope", ["unknown key"]),
    ("cache.l1_size=\"4XB\"", "cache.l1_size", ["4XB"]),
    ("events.endpoint=tcp://*:70000", "events.endpoint", ["70000"]),
])
def test_set_error_names_the_key(kv, key, words):
    r = run("--set", kv)
    assert r.returncode == 2, r.stderr
    m = only_error_line(r.stderr)
    assert m["source"] == "--set"
    assert m["key"] == key
    for w in words:
        assert w in m["what"]


def test_check_config_applies_set(tmp_path):
    f = tmp_path / "ok.toml"
    f.write_text("[events]\ndp_size = 2\n")
    assert run("--check-config", str(f), "--set", "events.format=\"tokenspeed\"").returncode == 0
    r = run("--check-config", str(f), "--set", "cache.events_rank=5")
    assert r.returncode == 2
    assert only_error_line(r.stderr)["key"] == "cache.events_rank"


# --- running --------------------------------------------------------------------------


def test_starts_on_default_config_and_logs_actor_tree(sidecar):
    o = free_ports_overrides()
    o["cache.l1_size"] = "16MiB"
    sc = sidecar(o).start()
    pub_port = int(o["events.endpoint"].rsplit(":", 1)[1])
    replay_port = int(o["events.replay_endpoint"].rsplit(":", 1)[1])
    log = sc.log_text()
    assert re.search(rf"pub\[dp=0\]#\d+ bound tcp://0\.0\.0\.0:{pub_port} \(events\.endpoint\)", log), log
    assert re.search(rf"replay_bridge\[dp=0\]#\d+ bound tcp://0\.0\.0\.0:{replay_port} "
                     r"\(events\.replay_endpoint\)", log), log
    tree = [l for l in sc.lines() if "actor tree:" in l]
    assert any(f"publisher (vllm) -> pub_bridge tcp://*:{pub_port}" in l for l in tree), tree
    assert any("ingest_bridge" in l for l in tree), tree
    assert any("replay" in l and f"tcp://*:{replay_port}" in l for l in tree), tree
    # Every line: UTC timestamp, level, actor[detail]#id, message.
    line_re = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z (TRACE|DEBUG|INFO |WARN |ERROR) "
                         r"\w+(\[[^\]]*\])?#\d+ \S")
    for l in sc.lines():
        assert line_re.match(l), f"log line not in the documented format: {l!r}"
    sc.stop()
    assert "exited with status 0" in sc.log_text()


def test_dp_ranks_bind_consecutive_ports(sidecar):
    o = free_ports_overrides(dp_size=3)
    o["cache.enabled"] = False
    o["events.dp_size"] = 3
    sc = sidecar(o).start()
    base = int(o["events.endpoint"].rsplit(":", 1)[1])
    for r in range(3):
        assert sc.find(rf"pub\[dp={r}\]#\d+ bound tcp://0\.0\.0\.0:{base + r} \(events\.endpoint\)"), \
            sc.log_text()


def test_port_in_use_is_status_1_naming_endpoint_and_key(sidecar):
    port = free_port_range(1)
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    blocker.bind(("0.0.0.0", port))
    blocker.listen(1)
    try:
        o = free_ports_overrides()
        o["cache.enabled"] = False
        o["events.endpoint"] = f"tcp://*:{port}"
        sc = sidecar(o).spawn()
        rc = sc.wait_exit(10)
        assert rc == 1, sc.log_text()
        bad = [l for l in sc.lines() if "events.endpoint" in l and f":{port}" in l
               and ("ERROR" in l)]
        assert bad, f"no error line naming the endpoint and events.endpoint:\n{sc.log_text()}"
        assert "kvsidecar ready" not in sc.log_text()
    finally:
        blocker.close()


def cuda_usable():
    """True when this machine has a GPU the CUDA runtime can use."""
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(cuda_usable(), reason="a GPU is present: backend cuda starts")
def test_backend_cuda_without_gpu_is_status_1(sidecar):
    o = free_ports_overrides()
    o["events.enabled"] = False
    o["gpu.backend"] = "cuda"
    o["cache.l1_size"] = "16MiB"
    sc = sidecar(o).spawn()
    rc = sc.wait_exit(10)
    assert rc == 1, sc.log_text()
    assert any("ERROR" in l and 'gpu.backend = "cuda"' in l for l in sc.lines()), sc.log_text()


@pytest.mark.skipif(cuda_usable(), reason="a GPU is present: auto picks cuda")
def test_backend_auto_without_gpu_says_host(sidecar):
    o = free_ports_overrides()
    o["events.enabled"] = False
    o["cache.l1_size"] = "16MiB"
    sc = sidecar(o).start()
    assert any('gpu.backend = "auto": no usable GPU' in l and "host backend" in l
               for l in sc.lines()), sc.log_text()
    sc.stop(signal.SIGTERM, timeout=5.0, expect=0)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_exits_0_within_5s(sidecar, sig):
    o = free_ports_overrides()
    o["cache.enabled"] = False
    sc = sidecar(o).start()
    sc.stop(sig, timeout=5.0, expect=0)
    assert f"{signal.Signals(sig).name} received" in sc.log_text()
    assert "exited with status 0" in sc.log_text()


def test_sigint_twice_exits_at_once(sidecar):
    o = free_ports_overrides()
    o["cache.enabled"] = False
    o["sidecar.shutdown_timeout"] = "30s"
    sc = sidecar(o).start()
    sc.send_signal(signal.SIGINT)
    sc.send_signal(signal.SIGINT)
    rc = sc.wait_exit(2.0)
    assert rc in (0, 130), f"exit {rc}\n{sc.tail()}"
    assert "SIGINT received" in sc.log_text()


def test_json_log_format_one_object_per_line(sidecar):
    o = free_ports_overrides()
    o["cache.enabled"] = False
    o["sidecar.log_format"] = "json"
    o["sidecar.stats_interval"] = "100ms"
    sc = sidecar(o).start()
    sc.wait_log(r'stats: ')
    sc.stop()
    lines = sc.lines()
    assert len(lines) > 5
    levels = set()
    for l in lines:
        obj = json.loads(l)
        assert isinstance(obj, dict)
        assert {"ts", "level", "actor", "msg"} <= set(obj), obj
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z$", obj["ts"]), obj
        levels.add(obj["level"])
    assert levels <= {"trace", "debug", "info", "warn", "error"}
    msgs = [json.loads(l)["msg"] for l in lines]
    assert any("kvsidecar ready" in m for m in msgs)
    assert any(json.loads(l)["actor"].startswith("pub[dp=0]#") for l in lines)


def test_json_log_startup_failure_lines_are_json(sidecar):
    # Error messages quote the endpoint: the JSON must still be valid.
    port = free_port_range(1)
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    blocker.bind(("0.0.0.0", port))
    blocker.listen(1)
    try:
        o = free_ports_overrides()
        o["cache.enabled"] = False
        o["sidecar.log_format"] = "json"
        o["events.endpoint"] = f"tcp://*:{port}"
        sc = sidecar(o).spawn()
        assert sc.wait_exit(10) == 1
    finally:
        blocker.close()
    objs = [json.loads(l) for l in sc.lines()]
    errors = [o for o in objs if o["level"] == "error"]
    assert errors and any(f'"tcp://*:{port}"' in o["msg"] and "events.endpoint" in o["msg"]
                          for o in errors), objs


def test_log_level_warn_hides_info(sidecar):
    o = free_ports_overrides()
    o["cache.enabled"] = False
    o["sidecar.log_level"] = "warn"
    sc = sidecar(o).spawn()
    # Nothing at info is printed, so readiness is observed by the port.
    port = int(o["events.endpoint"].rsplit(":", 1)[1])

    def bound():
        s = socket.socket()
        try:
            return s.connect_ex(("127.0.0.1", port)) == 0
        finally:
            s.close()

    wait_until(bound, 10, "events.endpoint to accept connections")
    sc.stop()
    assert not [l for l in sc.lines() if " INFO " in l], sc.log_text()


def test_version():
    r = run("--version")
    assert r.returncode == 0
    assert re.match(r"^kvsidecar \d+\.\d+\.\d+", r.stdout)


def test_set_args_quoting_roundtrip():
    # The harness's --set rendering is what the binary accepts.
    args = set_args({"events.endpoint": "tcp://*:5600", "events.dp_size": 2,
                     "events.enabled": True, "cache.evict_low": 0.5})
    f = run("--check-config", str(DEFAULT_TOML), *args)
    assert f.returncode == 0, f.stderr
