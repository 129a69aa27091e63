"""Rate limits: ``max_rate`` for the consumer and ``key_min_interval`` per key.

The limiter and the pacer on a manual clock (hypothesis drives the limiter
with any pattern of demand), and the settings' checks.  The consumer runs
them in ``test_rate_limit_consumer.py``.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lite_push import ConfigError, ConsumeMode, ConsumerConfig, ManualClock
from lite_push._lanes.rate_limit import KeyPacer, RateLimiter

# -- the limiter on a manual clock ---------------------------------------------------


def test_a_limiter_spaces_starts_at_its_rate_and_keeps_a_burst_after_idle() -> None:
    clock = ManualClock()
    lim = RateLimiter(100.0, clock.monotonic)  # burst: a tenth of a second = 10
    assert lim.burst == 10
    waits = [lim.reserve(1) for _ in range(30)]
    # idle before: the stored burst (10) and the slot now start at once; then 10 ms apart
    assert waits[:11] == [0.0] * 11
    assert waits[11:] == pytest.approx([0.01 * i for i in range(1, 20)])
    assert lim.delayed == 19 and lim.waited == pytest.approx(sum(waits))
    clock.advance(10.0)  # idle: the burst is back, never more
    assert [lim.reserve(1) for _ in range(11)] == [0.0] * 11
    assert lim.reserve(1) == pytest.approx(0.01)


def test_a_batch_takes_as_many_slots_as_messages() -> None:
    clock = ManualClock()
    lim = RateLimiter(10.0, clock.monotonic)  # burst 1
    assert lim.reserve(8) == 0.0  # starts now, takes 8 slots (0.8 s)
    assert lim.reserve(1) == pytest.approx(0.8 - 0.1)  # the burst slot was used by the first
    clock.advance(0.7)
    assert lim.reserve(1) == pytest.approx(0.1)


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(min_value=1.0, max_value=10_000.0),
    ops=st.lists(st.tuples(st.floats(min_value=0.0, max_value=0.5), st.integers(1, 8)), min_size=1, max_size=200),
)
def test_no_window_starts_more_than_rate_times_its_length_plus_burst(rate: float, ops: list[tuple[float, int]]) -> None:
    """Whatever the demand (gaps between requests, batch sizes), the starts
    the limiter hands out never exceed ``rate * T + burst + largest batch``
    in any window of length T, and no caller is told to wait for nothing."""
    clock = ManualClock()
    lim = RateLimiter(rate, clock.monotonic)
    starts: list[tuple[float, int]] = []
    for gap, n in ops:
        clock.advance(gap)
        wait = lim.reserve(n)
        assert wait >= 0.0
        starts.append((clock.monotonic() + wait, n))
    starts.sort()
    biggest = max(n for _, n in ops)
    eps = 1e-6 * (1 + len(ops))
    for i in range(len(starts)):
        total = 0
        for j in range(i, len(starts)):
            total += starts[j][1]
            span = starts[j][0] - starts[i][0]
            assert total <= rate * (span + eps) + lim.burst + biggest, (i, j, total, span)


def test_limiter_and_pacer_refuse_nonsense() -> None:
    clock = ManualClock()
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="rate"):
            RateLimiter(bad, clock.monotonic)
        with pytest.raises(ValueError, match="interval"):
            KeyPacer(bad)


# -- the pacer -------------------------------------------------------------------------


def test_the_pacer_says_when_a_key_may_start_again_and_forgets_old_keys() -> None:
    pacer = KeyPacer(0.5)
    now = 100.0
    assert pacer.due("a", now) == 0.0  # never seen
    pacer.started("a", now)
    assert pacer.due("a", now + 0.1) == pytest.approx(100.5)
    assert pacer.due("a", now + 0.5) == 0.0
    pacer.rotate(now + 0.2)  # "a" moves to the previous generation: still known
    assert pacer.due("a", now + 0.3) == pytest.approx(100.5)
    pacer.rotate(now + 0.3)  # too soon: no rotation before a period passed
    assert pacer.due("a", now + 0.3) == pytest.approx(100.5)
    pacer.rotate(now + 0.2 + pacer.period)  # dropped, and its interval has long passed
    assert len(pacer) == 0


def test_the_pacer_memory_is_the_keys_of_the_last_two_periods() -> None:
    pacer = KeyPacer(0.01)
    t = 0.0
    peak = 0
    for i in range(20_000):  # 20,000 keys, one start every 0.1 ms: 2 s
        t += 0.0001
        pacer.started(f"k{i}", t)
        pacer.rotate(t)
        peak = max(peak, len(pacer))
    # a period is interval + max(interval, 0.1) = 0.11 s: at most two periods of starts
    assert peak <= 2 * pacer.period / 0.0001 + 2


# -- configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("max_rate", 0, r"max_rate: must be in \(0.0"),
        ("max_rate", -5.0, "max_rate"),
        ("max_rate", math.nan, "max_rate"),
        ("max_rate", "fast", "max_rate: must be a number of messages per second"),
        ("key_min_interval", -0.1, "key_min_interval"),
        ("key_min_interval", math.inf, "key_min_interval"),
        ("key_min_interval", "1s", "key_min_interval"),
    ],
)
def test_bad_limits_are_refused_at_construction(field: str, value: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ConsumerConfig(group="g", **{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", [ConsumeMode.CONCURRENTLY, ConsumeMode.QUEUE_ORDERLY])
def test_a_key_interval_needs_key_orderly(mode: ConsumeMode) -> None:
    with pytest.raises(ConfigError, match="key_min_interval: .*only KEY_ORDERLY"):
        ConsumerConfig(group="g", mode=mode, key_min_interval=0.5)


# -- the command line ---------------------------------------------------------------------


def test_the_consume_command_takes_both_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    from lite_push.cli.parser import build_parser
    from lite_push.cli.plan import plan_of

    for var in ("LITE_PUSH_MAX_RATE", "LITE_PUSH_KEY_MIN_INTERVAL"):
        monkeypatch.delenv(var, raising=False)
    base = ["consume", "--source", "redis://127.0.0.1:1", "--group", "g", "--topic", "T", "--listener", "json:dumps"]
    args = build_parser().parse_args([*base, "--max-rate", "250", "--key-min-interval", "0.5"])
    plan, _, _ = plan_of(args)
    assert (plan.config.max_rate, plan.config.key_min_interval) == (250.0, 0.5)
    monkeypatch.setenv("LITE_PUSH_MAX_RATE", "75.5")
    plan, _, _ = plan_of(build_parser().parse_args(base))
    assert (plan.config.max_rate, plan.config.key_min_interval) == (75.5, 0.0)
    with pytest.raises(ConfigError, match="max_rate"):
        plan_of(build_parser().parse_args([*base, "--max-rate", "0"]))
