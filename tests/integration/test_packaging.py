"""Packaging for a sidecar container: the .deb, `cmake --install`, the
Kubernetes example and the Dockerfile's health check.

What is checked: `cpack -G DEB` in the build directory makes a package whose
Depends name the runtime libraries, whose config is a conffile, and which,
extracted into a temporary root (dpkg-deb -x), holds a binary that runs
`--check-config` on the shipped /etc/kvsidecar/kvsidecar.toml and on the
TOML of deploy/kubernetes' ConfigMap; `DESTDIR=... cmake --install` lays out
the same files; the pod example wires the probes to [http] listen and
shares a memory-backed /dev/shm; the Dockerfile's HEALTHCHECK command, run
against a live sidecar, passes, and its build stage installs every library
package the build needs (no container runtime is needed for any of it).

Run: KVSIDECAR_BIN=<build>/kvsidecar KVS_BINARY_DIR=<build> python3 -m pytest -q tests/integration/test_packaging.py
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kvsidecar_harness import free_port_range

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("KVS_BINARY_DIR", ROOT / "build"))
# The one source of the version (core/version.hpp is generated from it).
VERSION = re.search(r"^project\(kvsidecar VERSION (\S+)", (ROOT / "CMakeLists.txt").read_text(),
                    re.M).group(1)
POD_YAML = ROOT / "deploy" / "kubernetes" / "kvsidecar-pod.yaml"

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None or shutil.which("cpack") is None,
                                reason="needs dpkg-deb and cpack (Debian)")


def sh(*args, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, **kw)
    assert r.returncode == 0, f"{args} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def deb(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("deb")
    assert (BUILD / "CPackConfig.cmake").exists(), f"{BUILD} is not a configured build directory"
    sh("cpack", "-G", "DEB", "-B", out, cwd=BUILD)
    debs = list(out.glob("kvsidecar_*.deb"))
    assert len(debs) == 1, list(out.iterdir())
    return debs[0]


@pytest.fixture(scope="module")
def installed(deb, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("root")
    sh("dpkg-deb", "-x", deb, root)
    return root


def configmap_toml() -> str:
    docs = [d for d in yaml.safe_load_all(POD_YAML.read_text()) if d]
    cms = [d for d in docs if d["kind"] == "ConfigMap"]
    assert len(cms) == 1
    return cms[0]["data"]["kvsidecar.toml"]


def test_deb_metadata_names_the_runtime_libraries(deb, tmp_path):
    fields = sh("dpkg-deb", "-f", deb, "Package", "Version", "Architecture", "Depends").stdout
    assert re.search(r"^Package: kvsidecar$", fields, re.M), fields
    assert re.search(rf"^Version: {re.escape(VERSION)}$", fields, re.M), fields
    depends = re.search(r"^Depends: (.*)$", fields, re.M).group(1)
    for lib in ("libcaf-core", "libzmq5", "libprometheus-cpp-core", "libspdlog", "libsimdjson14"):
        assert lib in depends, f"{lib} missing from Depends: {depends}"
    sh("dpkg-deb", "-e", deb, tmp_path / "control")
    assert (tmp_path / "control" / "conffiles").read_text().split() == \
        ["/etc/kvsidecar/kvsidecar.toml"]


def test_installed_binary_checks_the_shipped_config(installed):
    binary = installed / "usr" / "bin" / "kvsidecar"
    conf = installed / "etc" / "kvsidecar" / "kvsidecar.toml"
    assert binary.exists() and os.access(binary, os.X_OK)
    assert conf.read_text() == (ROOT / "config" / "default.toml").read_text()
    assert (installed / "lib" / "systemd" / "system" / "kvsidecar.service").exists()
    r = sh(binary, "--check-config", conf)
    assert r.stdout.strip() == f"{conf}: valid"
    assert sh(binary, "--version").stdout.strip() == f"kvsidecar {VERSION}"


def test_installed_binary_checks_the_configmap_toml(installed, tmp_path):
    f = tmp_path / "configmap.toml"
    f.write_text(configmap_toml())
    r = sh(installed / "usr" / "bin" / "kvsidecar", "--check-config", f)
    assert r.stdout.strip() == f"{f}: valid"
    # A broken ConfigMap would be caught the same way.
    bad = tmp_path / "bad.toml"
    bad.write_text(configmap_toml().replace('listen = "0.0.0.0:9090"', 'listen = "9090"'))
    r = subprocess.run([installed / "usr" / "bin" / "kvsidecar", "--check-config", bad],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "http.listen" in r.stderr, r.stderr


def test_cmake_install_lays_out_binary_and_config(tmp_path):
    env = dict(os.environ, DESTDIR=str(tmp_path))
    sh("cmake", "--install", BUILD, "--prefix", "/usr", env=env)
    assert (tmp_path / "usr" / "bin" / "kvsidecar").exists()
    assert (tmp_path / "etc" / "kvsidecar" / "kvsidecar.toml").read_text() == \
        (ROOT / "config" / "default.toml").read_text()


def test_pod_example_wires_probes_ports_and_shared_memory():
    docs = [d for d in yaml.safe_load_all(POD_YAML.read_text()) if d]
    pod = next(d for d in docs if d["kind"] == "Pod")
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    assert set(containers) == {"engine", "kvsidecar"}
    side = containers["kvsidecar"]
    ports = {p["name"]: p["containerPort"] for p in side["ports"]}
    listen_port = int(re.search(r'listen = "[\d.]+:(\d+)"', configmap_toml()).group(1))
    assert ports["metrics"] == listen_port
    assert side["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert side["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert ports["kv-cache"] == 5555 and ports["kv-events"] == 5600
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["dshm"]["emptyDir"]["medium"] == "Memory"
    for c in containers.values():
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"], c["name"]
    assert side["securityContext"]["runAsNonRoot"] is True


def test_dockerfile_healthcheck_command_passes_against_a_live_sidecar(sidecar):
    text = (ROOT / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM debian:12", text, re.M)) == 2, "two Debian 12 stages"
    assert re.search(r"^USER 10001", text, re.M), "runs as a non-root user"
    m = re.search(r'^HEALTHCHECK .*\n\s*CMD \["bash", "-c", "(.*)"\]$', text, re.M)
    assert m, "HEALTHCHECK with a bash -c command"
    cmd = m.group(1).encode().decode("unicode_escape")
    assert "/healthz" in cmd and "9090" in cmd
    port = free_port_range(1)
    sc = sidecar({"events.enabled": False, "cache.enabled": False,
                  "http.listen": f"127.0.0.1:{port}"}).start()
    r = subprocess.run(["bash", "-c", cmd.replace("9090", str(port))], timeout=10)
    assert r.returncode == 0
    sc.stop()
    r = subprocess.run(["bash", "-c", cmd.replace("9090", str(port))], timeout=10,
                       stderr=subprocess.DEVNULL)
    assert r.returncode != 0, "the health check passed with nothing listening"


def test_dockerfile_build_stage_installs_every_library_the_build_needs():
    """The image builds from the Dockerfile alone: its build stage installs
    every -dev package scripts/install-deps.sh lists, except those only the
    benchmarks and fuzzers use (the image builds neither). A package added
    to one list and not the other fails here, not in someone's docker build
    (libhiredis-dev was missing until this test)."""
    deps = (ROOT / "scripts" / "install-deps.sh").read_text()
    listed = re.search(r"^DEB_PACKAGES=\((.*?)^\)", deps, re.M | re.S)
    assert listed, "install-deps.sh lists its Debian packages in DEB_PACKAGES=( ... )"
    wanted = {p for p in listed.group(1).split() if p.endswith("-dev")}
    # benchmarks (bench_json's nlohmann-json comparison), fuzzers
    wanted -= {"libbenchmark-dev", "nlohmann-json3-dev", "libclang-rt-14-dev"}
    text = (ROOT / "Dockerfile").read_text()
    build_stage = text.split("FROM debian:12-slim")[0]
    installed = set(re.findall(r"[\w.+-]+-dev\b", build_stage))
    assert wanted <= installed, f"Dockerfile's build stage lacks {sorted(wanted - installed)}"
    assert "-DKVSIDECAR_BENCH=OFF" in build_stage
