"""The processes benchmark (issue 19): a small run of 1 and 2 processes on a
Redis it starts itself passes its own checks (nothing lost, key order, every
queue committed, exit 0), and its hottest-key report reads the logs right."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from bench_processes import hottest  # noqa: E402  (benchmarks/ is put on sys.path above)


def test_the_hottest_key_report() -> None:
    s = 1_000_000_000  # ns
    rows = [
        (1, 0, 0, "a", 0, s, 0),
        (1, 0, 1, "b", 0, 2 * s, 0),
        (1, 0, 2, "a", 2 * s, 3 * s, 0),  # 1 s after a's first call ended
        (2, 1, 0, "c", 3 * s, 4 * s, 0),
    ]
    assert hottest(rows) == (
        "hottest key: 2 calls from 0.00 s to 3.00 s of a 4.00 s run, 2.00 s in calls (1000.00 ms each), "
        "1.00 s between them"
    )


def test_a_small_run_of_one_and_two_processes_passes_its_checks() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "bench_processes.py"),
            "--procs",
            "1,2",
            "--repeat",
            "1",
            "--messages",
            "3000",
            "--lanes",
            "32",
            "--check",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    checks = [line for line in done.stdout.splitlines() if line.strip().startswith("check:")]
    assert len(checks) == 2 and all("check: ok: 3,000 deliveries" in c for c in checks), done.stdout
    assert "32 | ratio 2/1 |" in done.stdout


def test_two_processes_balanced_by_message_pass_the_checks() -> None:
    """Issue 28, 2g: ``lite-push consume --processes 2 --balance message``
    on Redis: nothing lost, keys in order, no key in both processes at once."""
    done = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "bench_processes.py"),
            "--procs",
            "2",
            "--repeat",
            "1",
            "--messages",
            "6000",
            "--lanes",
            "2",
            "--check",
            "--balance",
            "message",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    checks = [line for line in done.stdout.splitlines() if line.strip().startswith("check:")]
    assert len(checks) == 1 and "check: ok: 6,000 deliveries by 2 processes" in checks[0], done.stdout
