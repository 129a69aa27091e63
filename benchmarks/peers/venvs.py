"""Each peer's virtual environment, made from its pinned requirements.

A peer ``NAME`` with ``benchmarks/peers/NAME.requirements.txt`` runs under
``benchmarks/out/peers/NAME-venv/bin/python`` (``benchmarks/out`` is
gitignored).  The requirements file's first line names the interpreter,
``# python 3.12``: the newest ``~/.pyenv/versions/3.12.*`` (``$PYENV_ROOT``
honoured), else ``python3.12`` on ``PATH``.  Its ``NAME==VERSION`` lines are
the pins.  :func:`peer_python` reuses a venv whose interpreter has the
right minor version and every pinned version installed (a probe through
``importlib.metadata``), and otherwise makes it anew (``python -m venv
--clear``, ``pip install -r``).  A peer whose venv cannot be made gets a
:class:`VenvError` whose text is the failing step's last line (pip's error),
for its row in the table.  lite_push's runners have no requirements file:
they run with the project's own python (``sys.executable``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["OUT", "VenvError", "base_python", "peer_python", "pins", "python_version"]

HERE = Path(__file__).resolve().parent
#: Where the venvs go.
OUT = HERE.parent / "out" / "peers"

_PYTHON_LINE = re.compile(r"#\s*python\s+(\d+)\.(\d+)\s*$")
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;#]+)")


class VenvError(RuntimeError):
    """A peer's venv could not be made; ``str()`` is the reason, one line."""


def python_version(requirements: Path) -> tuple[int, int]:
    """The ``(major, minor)`` the first line ``# python X.Y`` names."""
    first = requirements.read_text().splitlines()[:1]
    match = _PYTHON_LINE.match(first[0].strip()) if first else None
    if match is None:
        raise VenvError(f"{requirements.name}: the first line must be '# python X.Y'")
    return int(match[1]), int(match[2])


def pins(requirements: Path) -> dict[str, str]:
    """The ``NAME==VERSION`` pins, names normalized (PEP 503)."""
    out = {}
    for line in requirements.read_text().splitlines():
        match = _PIN.match(line)
        if match:
            out[re.sub(r"[-_.]+", "-", match[1]).lower()] = match[2]
    return out


def base_python(version: tuple[int, int]) -> str:
    """An interpreter of ``version``: pyenv's newest patch release of it,
    else ``pythonX.Y`` on ``PATH``."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    major, minor = version
    found = sorted(
        root.glob(f"{major}.{minor}.*/bin/python{major}.{minor}"),
        key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.parent.name)],
    )
    if found:
        return str(found[-1])
    on_path = shutil.which(f"python{major}.{minor}")
    if on_path:
        return on_path
    raise VenvError(f"no Python {major}.{minor} (pyenv {root} or python{major}.{minor} on PATH)")


_PROBE = (
    "import importlib.metadata as m, json, sys\n"
    "def v(n):\n"
    "    try:\n"
    "        return m.version(n)\n"
    "    except m.PackageNotFoundError:\n"
    "        return None\n"
    "print(json.dumps([list(sys.version_info[:2]), {n: v(n) for n in sys.argv[1:]}]))\n"
)


def _installed(python: Path, names: list[str]) -> tuple[tuple[int, int], dict[str, str | None]] | None:
    try:
        out = subprocess.run([str(python), "-c", _PROBE, *names], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    version, found = json.loads(out.stdout)
    return (version[0], version[1]), found


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def peer_python(name: str, *, peers_dir: Path = HERE, out_dir: Path = OUT, base: str | None = None) -> Path:
    """The python of peer ``name``'s venv, made or remade when missing or
    stale (see the module docstring); ``base`` overrides the interpreter it
    is made with.  Raises :class:`VenvError`."""
    requirements = peers_dir / f"{name}.requirements.txt"
    if not requirements.exists():
        raise VenvError(f"no {requirements.name}")
    version = python_version(requirements)
    wanted = pins(requirements)
    venv = out_dir / f"{name}-venv"
    python = venv / "bin" / "python"
    if python.exists() and _installed(python, list(wanted)) == (version, wanted):
        return python
    interpreter = base or base_python(version)
    print(f"making {venv} with {interpreter} from {requirements.name}", file=sys.stderr)
    venv.parent.mkdir(parents=True, exist_ok=True)
    made = subprocess.run([interpreter, "-m", "venv", "--clear", str(venv)], capture_output=True, text=True)
    if made.returncode != 0:
        raise VenvError(f"python -m venv: {_last_line(made.stderr or made.stdout)}")
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", str(requirements)],
        capture_output=True,
        text=True,
    )
    if pip.returncode != 0:
        raise VenvError(f"pip install -r {requirements.name}: {_last_line(pip.stderr or pip.stdout)}")
    got = _installed(python, list(wanted))
    if got != (version, wanted):
        raise VenvError(f"{venv}: after pip install the probe found {got}, not {(version, wanted)}")
    return python
