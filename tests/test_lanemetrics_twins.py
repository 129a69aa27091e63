"""The lanes' distribution recorders: the pure-Python twin against a naive
model, and the compiled twin against the Python one on the same arbitrary
input (same buckets, same sums, same errors).

The compiled cases skip when ``lite_push._kernels.lanemetrics_c`` was not built,
unless ``LITE_PUSH_REQUIRE_EXTENSIONS=1`` (then they fail), as
``compiled_twin`` decides.
"""

from __future__ import annotations

import math
import threading
import time
from types import ModuleType
from typing import Any

import pytest
from conftest import assert_compiled_selected, compiled_twin
from hypothesis import given, settings
from hypothesis import strategies as st

from lite_push import MessageExt
from lite_push._kernels import lanemetrics as _lanemetrics
from lite_push._kernels import lanemetrics_py as _lanemetrics_py
from lite_push.metrics import E2E_BUCKETS, LISTENER_BUCKETS, WAIT_BUCKETS, histogram_samples

BOUNDS = (LISTENER_BUCKETS, WAIT_BUCKETS, E2E_BUCKETS)


@pytest.fixture(scope="module")
def lanemetrics_c() -> ModuleType:
    return compiled_twin("lanemetrics_c")


def test_lanemetrics_c_loaded() -> None:
    """Fails when ``_lanemetrics_c`` was built (or is required) but the
    selector silently fell back to the Python twin."""
    assert_compiled_selected("lanemetrics_c", _lanemetrics.LANE_METRICS_IMPL, _lanemetrics.LaneMetrics, "LaneMetrics")


def msg(stored_ms: int) -> MessageExt:
    return MessageExt("T", 0, 0, b"", store_timestamp=stored_ms)


def naive(bounds: tuple[float, ...], values: list[tuple[float, int]]) -> tuple[list[int], float]:
    """Bucket ``i`` counts the values <= bounds[i] not counted before; the
    last one the rest (a NaN is <= nothing and > nothing: it counts in the
    first, as bisect_left puts it)."""
    counts = [0] * (len(bounds) + 1)
    total = 0.0
    for v, n in values:
        if math.isnan(v):
            i = 0
        else:
            i = next((j for j, b in enumerate(bounds) if v <= b), len(bounds))
        counts[i] += n
        total += v * n
    return counts, total


def assert_dist(got: tuple[list[int], float], want: tuple[list[int], float]) -> None:
    assert got[0] == want[0]
    if math.isnan(want[1]):
        assert math.isnan(got[1])
    else:
        assert got[1] == pytest.approx(want[1], rel=1e-12, abs=1e-12)


# -- the Python twin against the model ------------------------------------------------


def test_python_twin_buckets_by_hand() -> None:
    lm = _lanemetrics_py.LaneMetrics((0.001, 0.01), (1.0,), (0.5, 5.0))
    lm.call_at(10.0, 4, 10.02)  # 5 ms per message, 4 messages
    lm.segment_at(1.0, [msg(1000), msg(3000)], 1.001, 3.0)  # 0.5 ms each; stored at 2.0 s on average
    lm.completed_at(msg(0), msg(0), 7, 100.0)  # no store timestamp: not recorded
    lm.completed_at(msg(9000), msg(9000), 1, 1.0)  # stored "after" it finished: 0
    lm.waited_at([(5.0, 3), (5.9, 2), (4.0, 1)], 6.0)  # 1.0 s, 0.1 s, 2.0 s
    (lc, ls), (wc, ws), (ec, es) = lm.snapshot()
    assert lc == [2, 4, 0] and ls == pytest.approx(4 * 0.005 + 2 * 0.0005)
    assert wc == [5, 1] and ws == pytest.approx(3 * 1.0 + 2 * 0.1 + 2.0)
    assert ec == [1, 2, 0] and es == pytest.approx(2 * 1.0)


values = st.one_of(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    st.sampled_from([*LISTENER_BUCKETS, *WAIT_BUCKETS, *E2E_BUCKETS, 0.0, -0.0]),  # exactly on a bound: le
    st.just(math.inf),
    st.just(math.nan),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(values, st.integers(1, 10_000)), max_size=40))
def test_python_twin_waited_matches_model(obs: list[tuple[float, int]]) -> None:
    lm = _lanemetrics_py.LaneMetrics(*BOUNDS)
    now = 1000.0
    lm.waited_at([(now - v, n) for v, n in obs], now)
    want = naive(WAIT_BUCKETS, [(now - (now - v), n) for v, n in obs])
    assert_dist(lm.snapshot()[1], want)


def test_python_twin_merged_by_collector() -> None:
    """Two lanes' snapshots merge into cumulative Prometheus buckets."""
    a = _lanemetrics_py.LaneMetrics(*BOUNDS)
    b = _lanemetrics_py.LaneMetrics(*BOUNDS)
    a.call_at(0.0, 1, 0.0002)
    b.call_at(0.0, 2, 0.004)  # 2 ms each
    buckets, total = histogram_samples(LISTENER_BUCKETS, (lm.snapshot()[0] for lm in (a, b)))
    cum = dict(buckets)
    assert cum["0.00025"] == 1 and cum["0.001"] == 1 and cum["0.0025"] == 3 and cum["+Inf"] == 3
    assert list(cum) == [*map(repr, LISTENER_BUCKETS), "+Inf"]
    assert total == pytest.approx(0.0002 + 2 * 0.002)


# -- both twins: the same answers, the same errors ------------------------------------------


def twins(lanemetrics_c: ModuleType, *bounds: Any) -> tuple[Any, Any]:
    return _lanemetrics_py.LaneMetrics(*bounds), lanemetrics_c.LaneMetrics(*bounds)


def same_error(fn_py: Any, fn_c: Any) -> None:
    with pytest.raises(Exception) as e_py:
        fn_py()
    with pytest.raises(type(e_py.value)) as e_c:
        fn_c()
    assert str(e_c.value) == str(e_py.value)


ops = st.one_of(
    st.tuples(st.just("segment"), values, st.lists(st.integers(0, 2**41), min_size=1, max_size=5), values),
    st.tuples(st.just("call"), values, st.integers(1, 1000)),
    st.tuples(st.just("completed"), st.integers(-5, 2**41), st.integers(0, 2**41), st.integers(1, 1000), values),
    st.tuples(st.just("waited"), st.lists(st.tuples(values, st.integers(0, 10_000)), max_size=6), values),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, max_size=30))
def test_twins_agree(lanemetrics_c: ModuleType, calls: list[tuple[Any, ...]]) -> None:
    py, c = twins(lanemetrics_c, *BOUNDS)
    for op, *args in calls:
        if op == "segment":
            t0, stored, wall = args
            msgs = [msg(s) for s in stored]
            for lm in (py, c):
                lm.segment_at(t0, msgs, 1.0, wall)
        elif op == "call":
            t0, n = args
            for lm in (py, c):
                lm.call_at(t0, n, 2.0)
        elif op == "completed":
            first, last, n, wall = args
            for lm in (py, c):
                lm.completed_at(msg(first), msg(last), n, wall)
        else:
            stamps, now = args
            for lm in (py, c):
                lm.waited_at(stamps, now)
    for got, want in zip(c.snapshot(), py.snapshot(), strict=True):
        assert_dist(got, want)


def test_twins_same_errors(lanemetrics_c: ModuleType) -> None:
    for bad in ((), tuple(range(1, 34)), (1.0, 1.0), (2.0, 1.0), (0.1, math.nan), (math.inf,), ("x",), None):
        same_error(
            lambda bad=bad: _lanemetrics_py.LaneMetrics(LISTENER_BUCKETS, bad, E2E_BUCKETS),
            lambda bad=bad: lanemetrics_c.LaneMetrics(LISTENER_BUCKETS, bad, E2E_BUCKETS),
        )
    py, c = twins(lanemetrics_c, *BOUNDS)
    same_error(lambda: py.segment_at(0.0, [], 1.0, 1.0), lambda: c.segment_at(0.0, [], 1.0, 1.0))
    for n in (0, -3):
        same_error(lambda n=n: py.call_at(0.0, n, 1.0), lambda n=n: c.call_at(0.0, n, 1.0))
    assert py.snapshot() == c.snapshot()  # a failed call recorded nothing


def test_error_names_the_field() -> None:
    with pytest.raises(ValueError, match="wait_bounds: bucket bounds must be strictly increasing"):
        _lanemetrics.LaneMetrics(LISTENER_BUCKETS, (0.5, 0.1), E2E_BUCKETS)


# -- the clocks ----------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["python", "cython"])
def test_clocks(impl: str, request: pytest.FixtureRequest) -> None:
    """``clock`` is the clock lanes stamp puts with and ``t0`` is read with;
    the methods without ``_at`` read it (and the wall clock) themselves."""
    mod = _lanemetrics_py if impl == "python" else request.getfixturevalue("lanemetrics_c")
    assert abs(mod.clock() - time.perf_counter()) < 0.05
    lm = mod.LaneMetrics(*BOUNDS)
    t0 = mod.clock() - 0.03  # a call that started 30 ms ago (no sleep needed)
    lm.call(t0, 2)  # >= 15 ms per message
    now_ms = int(time.time() * 1000)
    lm.segment(mod.clock() - 1.0, [msg(now_ms - 60_000), msg(now_ms - 60_000)])  # 0.5 s each, stored a minute ago
    lm.completed(msg(now_ms + 3_600_000), msg(now_ms + 3_600_000), 3)  # stored in the future: 0
    lm.waited([(mod.clock() - 2.0, 4)])
    (lc, ls), (wc, ws), (ec, es) = lm.snapshot()
    assert sum(lc) == 4 and lc[LISTENER_BUCKETS.index(0.01)] == 0 and sum(lc[LISTENER_BUCKETS.index(0.01) :]) == 4
    assert lc[LISTENER_BUCKETS.index(0.5)] + lc[LISTENER_BUCKETS.index(1.0)] == 2  # 0.5 s plus a little
    assert 2 * 0.5 + 2 * 0.015 <= ls < 2 * 0.5 + 2 * 0.01 + 10.0
    assert wc[WAIT_BUCKETS.index(2.5)] == 4 and 8.0 <= ws < 9.0
    assert ec[0] == 3 and ec[E2E_BUCKETS.index(60.0)] + ec[E2E_BUCKETS.index(300.0)] == 2 and ec.count(0) == len(ec) - 2


@pytest.mark.parametrize("impl", ["python", "cython"])
def test_snapshot_under_concurrent_writes(impl: str, request: pytest.FixtureRequest) -> None:
    """A scrape thread reading snapshots while the lane writes never sees
    counts that go down, and ends with every observation counted."""
    mod = _lanemetrics_py if impl == "python" else request.getfixturevalue("lanemetrics_c")
    lm = mod.LaneMetrics(*BOUNDS)
    n = 20_000
    done = threading.Event()
    seen: list[int] = []

    def scrape() -> None:
        while not done.is_set():
            seen.append(sum(lm.snapshot()[0][0]))

    t = threading.Thread(target=scrape)
    t.start()
    try:
        for i in range(n):
            lm.call_at(0.0, 1, (i % 100) / 1000.0)
    finally:
        done.set()
        t.join()
    assert seen == sorted(seen)
    assert sum(lm.snapshot()[0][0]) == n
