"""Running one runner once: its command line, its environment, its OUT.json.

The runner runs in a work directory of its own (``benchmarks/out/peers/runs``)
with an environment stripped of the variables peers read their settings from
(``KAFKA_*``, ``FASTSTREAM_*``, ``PYTHONPATH`` ...), so nothing but its
arguments configures it; lite_push's runners get ``PYTHONPATH`` set to this
repository, so they run the lite_push of this working copy.  A runner still
alive ``GRACE`` seconds after its ``--timeout`` is killed, with its
process group (its own session, whose id is the PID of the shell below);
so is a runner whose orchestrator is interrupted.

The runner is started through ``/bin/sh``, which forks it and waits: Linux
keeps a process's peak RSS (``ru_maxrss``) across ``execve``, so a runner
forked straight from this process would report this process's peak (the
orchestrator's keys and costs, 50-150 MB) as its own; forked from a fresh
shell it starts from the shell's 2 MB.
"""

from __future__ import annotations

import array
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GRACE", "Output", "launch"]

REPO = Path(__file__).resolve().parent.parent.parent
#: Seconds a runner has after its ``--timeout`` before it is killed.
GRACE = 60.0
#: Environment variable prefixes left out of a runner's environment.
STRIPPED = (
    "KAFKA_",
    "EXECUTION_",
    "PARALLEL_CONSUMER_",
    "PROCESS_",
    "METRICS_",
    "FASTSTREAM_",
    "QUIX",
    "FAUST_",
    "ARROYO_",
    "REDIS_",
    "PYTHONPATH",
    "LITE_PUSH_",
)


@dataclass
class Output:
    """What one run left: OUT.json's fields (``data``, None when it wrote
    none), its exit code, the tail of its stderr, its wall seconds."""

    data: dict[str, Any] | None
    returncode: int | None
    stderr_tail: str
    wall_s: float

    @property
    def error(self) -> str | None:
        """The run's error: the runner's own, else a crash or a missing OUT."""
        if self.data is None:
            return f"runner exited {self.returncode} without output: {self.stderr_tail or '(no stderr)'}"
        if self.data.get("error"):
            return str(self.data["error"])
        if self.returncode != 0:
            return f"runner exited {self.returncode}: {self.stderr_tail}"
        return None


def launch(
    python: Path | str,
    runner: Path,
    broker_args: Sequence[str],
    *,
    topic: str,
    group: str,
    costs_us: Sequence[int],
    work_dir: Path,
    timeout: float,
    cap: float | None,
    settings: Sequence[str] = (),
    project_python: bool = False,
    keys: Sequence[str] | None = None,
) -> Output:
    """Run ``runner`` under ``python`` over ``topic`` with ``group`` and wait
    for it; ``settings`` are ``KEY=VALUE`` strings passed as ``--set``;
    ``keys`` (a runner without a broker: ``broker_args`` empty) are written
    to a file passed as ``--keys``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    costs_file = work_dir / f"{group}.costs"
    keys_file = work_dir / f"{group}.keys.json"
    out_file = work_dir / f"{group}.json"
    costs_file.write_bytes(array.array("q", costs_us).tobytes())
    if keys is not None:
        keys_file.write_text(json.dumps(list(keys)))
        broker_args = [*broker_args, "--keys", str(keys_file)]
    out_file.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(STRIPPED)}
    if project_python:
        env["PYTHONPATH"] = str(REPO)
    cmd = [
        str(python),
        str(runner),
        *broker_args,
        "--topic",
        topic,
        "--group",
        group,
        "--costs",
        str(costs_file),
        "--out",
        str(out_file),
        "--timeout",
        f"{timeout:g}",
    ]
    if cap is not None:
        cmd += ["--cap", f"{cap:g}"]
    for setting in settings:
        cmd += ["--set", setting]
    t0 = time.perf_counter()
    # '; exit $?': a command after it, so the shell forks the runner rather than exec it
    proc = subprocess.Popen(
        ["/bin/sh", "-c", '"$0" "$@"; exit $?', *cmd],
        cwd=work_dir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = proc.communicate(timeout=timeout + GRACE)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the shell and the runner (their own session)
        _, stderr = proc.communicate()
    except BaseException:  # interrupted: the runner (in a session of its own) must not outlive the run
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    wall = time.perf_counter() - t0
    tail = " | ".join(line.strip() for line in (stderr or "").strip().splitlines()[-3:])[-600:]
    data = None
    if out_file.exists():
        try:
            data = json.loads(out_file.read_text())
        except ValueError as e:  # cut short: the row says so
            tail = f"OUT.json unreadable ({e}); {tail}"
    costs_file.unlink(missing_ok=True)
    keys_file.unlink(missing_ok=True)
    out_file.unlink(missing_ok=True)
    return Output(data, proc.returncode, tail, wall)
