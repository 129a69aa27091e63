"""The bootstrap installs a Java runtime for PySpark when ``java`` is missing.

``scripts/system_packages.sh`` (sourced by ``scripts/bootstrap.sh``) is run
here in bash with a PATH of its own: the few tools it uses, a fake
``apt-get`` that records its arguments (and, on ``install``, puts a fake
``java`` on that PATH), a fake ``sudo``, and a fake ``java`` when a test
wants one.  Nothing is installed on this machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "system_packages.sh"
BASH = shutil.which("bash") or "/bin/bash"

#: What the functions run besides bash's builtins and the fakes.
TOOLS = ("env", "id", "mktemp", "rm", "tail")


def _java(bin_dir: Path, version: str) -> None:
    """A fake ``java`` whose ``-version`` says ``version``, as OpenJDK does (on stderr)."""
    java = bin_dir / "java"
    java.write_text(f"#!{BASH}\necho 'openjdk version \"{version}\" 2025-04-15' >&2\n")
    java.chmod(0o755)


def _bin(tmp_path: Path, *, install: str = "java 17", java: str | None = None) -> tuple[Path, Path]:
    """A PATH directory: TOOLS, fake sudo and apt-get (``install``: what an
    ``apt-get install`` does: ``"java 17"`` puts java 17 there, ``"nothing"``
    succeeds without it, ``"fail"`` exits 100); and java ``java`` if given.
    Returns the directory and the file the fakes record their calls in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    calls.touch()
    for tool in TOOLS:
        real = shutil.which(tool)
        assert real is not None, tool
        (bin_dir / tool).symlink_to(real)
    (bin_dir / "sudo").write_text(f'#!{BASH}\necho "sudo $*" >> {calls}\nexec "$@"\n')
    cat, chmod = shutil.which("cat"), shutil.which("chmod")  # by their paths: not on the PATH under test
    on_install = {
        "java 17": f"{cat} > {bin_dir}/java <<'EOF'\n#!{BASH}\necho 'openjdk version \"17.0.9\" 2023-10-17' >&2\nEOF\n"
        f"{chmod} 755 {bin_dir}/java",
        "nothing": "true",
        "fail": "echo 'E: Unable to locate package' >&2; exit 100",
    }[install]
    (bin_dir / "apt-get").write_text(
        f'#!{BASH}\necho "apt-get $* (DEBIAN_FRONTEND=$DEBIAN_FRONTEND)" >> {calls}\n'
        f"if [[ $1 == install ]]; then\n{on_install}\nfi\n"
    )
    for fake in ("sudo", "apt-get"):
        (bin_dir / fake).chmod(0o755)
    if java is not None:
        _java(bin_dir, java)
    return bin_dir, calls


def _run(bin_dir: Path, snippet: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BASH, "-c", f"set -euo pipefail; source {SCRIPT}; {snippet}"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(bin_dir), **env},
    )


def _apt_calls(calls: Path) -> list[str]:
    return [line.removeprefix("sudo ") for line in calls.read_text().splitlines() if "apt-get" in line]


def test_the_path_of_the_test_has_no_java(tmp_path: Path) -> None:
    bin_dir, _ = _bin(tmp_path)
    done = _run(bin_dir, "command -v java || echo none")
    assert done.stdout.strip() == "none"


def test_a_missing_java_is_installed_with_apt_get(tmp_path: Path) -> None:
    bin_dir, calls = _bin(tmp_path)
    done = _run(bin_dir, "ensure_java; java_major")
    assert done.returncode == 0, done.stderr
    assert _apt_calls(calls) == [
        "apt-get update -qq (DEBIAN_FRONTEND=noninteractive)",
        "apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless (DEBIAN_FRONTEND=noninteractive)",
    ]
    assert "installing openjdk-17-jre-headless with apt-get (PySpark needs a Java runtime)" in done.stderr
    assert "java 17 installed" in done.stderr and done.stdout.strip() == "17"


def test_another_package_can_be_named(tmp_path: Path) -> None:
    bin_dir, calls = _bin(tmp_path)
    done = _run(bin_dir, "ensure_java", JAVA_PACKAGE="openjdk-21-jre-headless")
    assert done.returncode == 0, done.stderr
    assert _apt_calls(calls)[-1].startswith("apt-get install -y -qq --no-install-recommends openjdk-21-jre-headless")


@pytest.mark.parametrize(
    ("version", "major", "warns"),
    [("17.0.15", "17", False), ("21.0.2", "21", False), ("11.0.22", "11", True), ("1.8.0_402", "8", True)],
)
def test_a_java_on_the_path_is_left_alone(tmp_path: Path, version: str, major: str, warns: bool) -> None:
    bin_dir, calls = _bin(tmp_path, java=version)
    done = _run(bin_dir, "java_major; ensure_java")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == major
    assert _apt_calls(calls) == []
    assert (f"java {major} is on PATH; PySpark wants 17 21" in done.stderr) is warns, done.stderr


@pytest.mark.parametrize(
    ("install", "said"),
    [
        ("fail", "ERROR: apt-get install openjdk-17-jre-headless failed"),
        ("nothing", "ERROR: java still not on PATH after apt-get install openjdk-17-jre-headless"),
    ],
)
def test_an_install_that_brings_no_java_fails(tmp_path: Path, install: str, said: str) -> None:
    bin_dir, _ = _bin(tmp_path, install=install)
    done = _run(bin_dir, "ensure_java")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == f"bootstrap: {said}", done.stderr
    if install == "fail":
        assert "E: Unable to locate package" in done.stderr  # the tail of apt's log


def test_both_readme_commands_bootstrap_with_bench_which_ensures_java() -> None:
    for script in ("main.sh", "test.sh"):
        assert "bash scripts/bootstrap.sh --bench" in (REPO / "scripts" / script).read_text(), script
    bootstrap = (REPO / "scripts" / "bootstrap.sh").read_text()
    assert "source scripts/system_packages.sh" in bootstrap
    assert "if [[ -n $bench ]]; then\n    ensure_java\nfi" in bootstrap
    assert os.access(SCRIPT, os.R_OK)
