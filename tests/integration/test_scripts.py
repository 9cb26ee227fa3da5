"""scripts/run.sh and scripts/install-deps.sh leave apt alone when every
Debian package is installed, and ask apt only for the missing ones.

Hermetic: the two scripts are copied into a temporary tree whose PATH puts
stubs first. `apt-get` and `sudo` record their calls and fail (a test that
reached them would also fail loudly); `dpkg-query` answers from a list of
installed packages the test chooses; `cmake` records and succeeds; the tree's
build/kvsidecar is a stub that prints its arguments. Nothing is installed,
built or downloaded.

Run: python3 -m pytest -q tests/integration/test_scripts.py
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def deb_packages() -> list[str]:
    """The DEB_PACKAGES array of install-deps.sh."""
    text = (ROOT / "scripts" / "install-deps.sh").read_text()
    body = re.search(r"^DEB_PACKAGES=\((.*?)^\)", text, re.M | re.S).group(1)
    return body.split()


def stub(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)


@pytest.fixture
def tree(tmp_path):
    """A copy of scripts/ with stubs first on PATH; returns (root, env, calls)."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    for name in ("run.sh", "install-deps.sh"):
        shutil.copy2(ROOT / "scripts" / name, root / "scripts" / name)
    (root / "build").mkdir()
    stub(root / "build" / "kvsidecar", 'echo "kvsidecar $*"\n')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    installed = tmp_path / "installed"
    for name in ("apt-get", "sudo"):
        stub(bin_dir / name, f'echo "{name} $*" >> "{calls}"\nexit 1\n')
    stub(bin_dir / "cmake", f'echo "cmake $*" >> "{calls}"\n')
    # dpkg-query -W -f='${Package} ${Status}\n' P...: one line per installed
    # package named, an error (exit 1) for the others, as dpkg-query does.
    stub(bin_dir / "dpkg-query", f'''echo "dpkg-query" >> "{calls}"
rc=0
for p in "$@"; do
  case "$p" in -*) continue ;; esac
  if grep -qx "$p" "{installed}"; then echo "$p install ok installed"
  else echo "dpkg-query: no packages found matching $p" >&2; rc=1; fi
done
exit $rc
''')
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")

    def run(script, *args, have):
        installed.write_text("".join(p + "\n" for p in have))
        if calls.exists():
            calls.unlink()
        r = subprocess.run([str(root / "scripts" / script), *args], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
        return r, (calls.read_text().splitlines() if calls.exists() else [])

    return run


def test_install_deps_calls_no_apt_when_everything_is_installed(tree):
    r, calls = tree("install-deps.sh", have=deb_packages())
    assert r.returncode == 0, r.stderr
    assert not [c for c in calls if c.startswith(("apt-get", "sudo"))], calls
    # One query for every package, not one process per package.
    assert calls.count("dpkg-query") == 1, calls


def test_run_sh_starts_without_apt_when_everything_is_installed(tree):
    r, calls = tree("run.sh", "--version", have=deb_packages())
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "kvsidecar --version"
    assert not [c for c in calls if c.startswith(("apt-get", "sudo"))], calls
    assert any(c.startswith("cmake --build") for c in calls), calls


def test_run_sh_configures_only_an_unconfigured_tree(tree, tmp_path):
    """On a tree scripts/test.sh already built, run.sh only brings the binary
    up to date (configuring again with other options would rebuild)."""
    r, calls = tree("run.sh", "--version", have=deb_packages())
    assert r.returncode == 0, r.stderr
    assert any(c.startswith("cmake -S . -B build") for c in calls), calls
    (tmp_path / "repo" / "build" / "build.ninja").write_text("")
    r, calls = tree("run.sh", "--version", have=deb_packages())
    assert r.returncode == 0, r.stderr
    assert not any(c.startswith("cmake -S") for c in calls), calls
    assert any(c.startswith("cmake --build build") for c in calls), calls


def test_install_deps_asks_apt_for_the_missing_packages_only(tree):
    pkgs = deb_packages()
    missing = [pkgs[0], pkgs[-1]]
    r, calls = tree("install-deps.sh", have=[p for p in pkgs if p not in missing])
    # The apt-get stub fails, so the script stops there (set -e).
    assert r.returncode != 0
    assert f"installing Debian packages: {' '.join(missing)}" in r.stdout
    apt = [c for c in calls if "apt-get" in c]
    assert apt, calls
    assert apt[0].endswith("apt-get update -qq")


def cmake_configure_flags(text: str, build_dir: str) -> set[str]:
    """The -D options of the first `cmake -S . -B <build_dir>` command in a
    script or document, its continuation lines ('\\') joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    m = re.search(r"cmake -S \. -B " + re.escape(build_dir) + r"(?=\s)([^\n&|>]*)", joined)
    assert m, f"no `cmake -S . -B {build_dir}` line"
    return {t for t in m.group(1).split() if t.startswith("-D")}


def test_ci_builds_the_dockerfiles_configuration():
    """The container image's build (the way the sidecar ships), the README's
    build steps and the first stage of scripts/test.sh (what CI runs) are one
    configuration; CI adds only -Werror. A Release build that fails to
    compile can no longer pass CI unnoticed."""
    docker = cmake_configure_flags((ROOT / "Dockerfile").read_text(), "build-docker")
    assert "-DCMAKE_BUILD_TYPE=Release" in docker, docker
    test_sh = cmake_configure_flags((ROOT / "scripts" / "test.sh").read_text(), "build")
    assert test_sh == docker | {"-DKVSIDECAR_WERROR=ON"}, (test_sh, docker)
    readme = cmake_configure_flags((ROOT / "README.md").read_text(), "build")
    assert readme == docker, (readme, docker)
    # -Werror stays off for users: the option's default.
    cml = re.sub(r"#.*", "", (ROOT / "CMakeLists.txt").read_text())  # code, not comments
    assert re.search(r'option\(KVSIDECAR_WERROR "[^"]*" OFF\)', cml), "KVSIDECAR_WERROR must default to OFF"
    assert "-Werror" not in re.sub(r"if\(KVSIDECAR_WERROR\).*?endif\(\)", "", cml, flags=re.S), \
        "-Werror outside if(KVSIDECAR_WERROR)"
