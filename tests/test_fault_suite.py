"""The fault suite's fast subset (issue 16.7): one run of the SIGSTOP
scenario -- three member processes on a real redis-server, one frozen past
its session and continued -- must show no loss, no inversion and no overlap.
The full suite (every scenario, several runs) is
``benchmarks/fault_suite.py``; its figures are in benchmarks/RESULTS.md."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from fault_suite import inversions, overlaps, run_redis  # noqa: E402  (benchmarks/ is put on sys.path above)


def test_the_measures_count_what_they_name() -> None:
    a1 = (1, 0, 0, "a", 0, 10, 0)
    b1 = (2, 0, 1, "a", 5, 12, 0)  # member 2 runs key a while member 1 still does
    assert overlaps([a1, b1], set()) == 1
    assert overlaps([a1, b1], {a1}) == 0
    assert inversions([a1, b1], set()) == 1  # offset 1 began before offset 0 ended
    assert inversions([a1, b1], {a1}) == 0
    assert inversions([(1, 0, 0, "a", 0, 4, 0), (1, 0, 1, "a", 5, 9, 0)], set()) == 0


def test_a_member_frozen_past_its_session_breaks_nothing() -> None:
    res = run_redis("sigstop", 3000, seed=7)
    assert (res.lost, res.inversions, res.overlaps) == (0, 0, 0), res
    assert res.recovery is not None and res.recovery < 15, res
