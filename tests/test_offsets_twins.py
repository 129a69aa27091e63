"""The two offset tracker twins behave identically, errors included.

``tests/test_offsets.py`` checks each twin against a naive model on valid
input.  Here the compiled twin is run side by side with the Python one on
arbitrary call sequences -- valid and invalid, late offsets (a call starting
below the high-water mark) included -- and after every call both
must have returned the same value or raised the same exception, and must
read the same (``lowest_unfinished``, ``in_flight``, ``span``,
``next_offset``, ``unfinished``).  A call that raises ``ValueError`` must leave a tracker as
it was (both twins promise to validate a whole call before changing
anything).

The compiled cases skip when ``lite_push._kernels.offsets_c`` was not built, unless
``LITE_PUSH_REQUIRE_EXTENSIONS=1`` (then they fail), as ``compiled_twin``
decides.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
from conftest import assert_compiled_selected, compiled_twin
from hypothesis import given, settings
from hypothesis import strategies as st

from lite_push import MessageExt
from lite_push._kernels import offsets as _offsets
from lite_push._kernels import offsets_py as _offsets_py

PyTracker = _offsets_py.OffsetTracker


@pytest.fixture(scope="module")
def offsets_c() -> ModuleType:
    return compiled_twin("offsets_c")


def test_offsets_c_loaded() -> None:
    """Fails when ``_offsets_c`` was built (or is required) but the selector
    silently fell back to the Python twin."""
    assert_compiled_selected("offsets_c", _offsets.OFFSETS_IMPL, _offsets.OffsetTracker, "OffsetTracker")


# --- running one call on both twins ------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One tracker call, rebuilt for each twin (iterators and messages are
    made fresh, so neither twin sees what the other consumed)."""

    method: str
    offsets: tuple[int, ...] = ()
    #: How ``offsets`` is passed: list, tuple, range, iter, or "messages".
    container: str = "list"
    next_offset: int | None = None
    start: int = 0
    stop: int = 0

    def args(self) -> tuple[Any, ...]:
        if self.method in ("add", "complete"):
            return (self.offsets[0],)
        if self.method == "add_range":
            return (self.start, self.stop)
        if self.container == "messages":
            arg: Any = [message(o) for o in self.offsets]
        elif self.container == "range":
            arg = range(self.offsets[0], self.offsets[-1] + 1) if self.offsets else range(0)
        else:
            arg = CONTAINERS[self.container](self.offsets)
        if self.method in ("add_many", "add_batch") and self.next_offset is not None:
            return (arg, self.next_offset)
        return (arg,)

    def touched(self) -> tuple[int, ...]:
        return tuple(range(self.start, self.stop)) if self.method == "add_range" else self.offsets


CONTAINERS: dict[str, Callable[[tuple[int, ...]], Any]] = {"list": list, "tuple": tuple, "iter": iter}


def message(offset: int) -> MessageExt:
    return MessageExt(topic="T", queue_id=0, queue_offset=offset, body=b"x" * (offset % 7))


def reading(t: Any) -> tuple[int, int, int, int, tuple[int, ...]]:
    return (t.lowest_unfinished(), t.in_flight, t.span, t.next_offset, tuple(t.unfinished()))


def outcome(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[str, Any]:
    try:
        return ("returned", fn(*args))
    except Exception as exc:  # the comparison is the test
        return ("raised", type(exc).__name__)


def step(c: Any, py: Any, call: Call) -> bool:
    """Run ``call`` on both twins and check they agree; True if it succeeded."""
    before = reading(py)
    assert reading(c) == before
    got_py = outcome(getattr(py, call.method), call.args())
    got_c = outcome(getattr(c, call.method), call.args())
    assert got_c == got_py, f"{call}: compiled {got_c}, Python {got_py}"
    assert reading(c) == reading(py), f"after {call} ({got_py[0]}): compiled {reading(c)}, Python {reading(py)}"
    if got_py[0] == "raised":
        assert got_py[1] == "ValueError", f"{call} raised {got_py[1]}"
        assert reading(py) == before, f"{call} raised ValueError but changed the tracker"
        return False
    return True


# --- arbitrary call sequences ---------------------------------------------------------

# Strategies are built once here: building them inside the composites below,
# once per draw, made the test several times slower.

#: Skipped offsets before an added one: mostly none, some small gaps, and
#: now and then thousands, which grows the compiled twin's ring (64 slots
#: at first) and wraps it around.
GAP = st.integers(0, 99).map(lambda r: 0 if r < 70 else r - 69 if r < 95 else (r - 94) * 1000)
GAPS = st.lists(GAP, max_size=16)
ONE_IN_FIVE = st.integers(0, 4)
BAD_STEP = st.integers(-3, 0)
ADD_METHOD = st.sampled_from(["add", "add_many", "add_many", "add_range", "add_batch"])
NEXT_OFFSET = st.none() | st.integers(-3, 6000)
RANGE_START = st.integers(-3, 5)
RANGE_LEN = st.integers(-2, 40)
CONTIGUOUS_CONTAINER = st.sampled_from(["list", "tuple", "range"])
CONTAINER = st.sampled_from(["list", "tuple"])


#: How far below the high-water mark a late offset lies: mostly close, now
#: and then past the compiled ring's first capacity.
LATE_DEPTH = st.integers(1, 99).map(lambda r: r if r < 90 else (r - 89) * 300)
LATE = st.lists(LATE_DEPTH, min_size=1, max_size=4, unique=True)


@st.composite
def add_call(draw: st.DrawFn, nxt: int, live: list[int]) -> Call:
    valid = draw(ONE_IN_FIVE) > 0
    offs: list[int] = []
    prev = nxt - 1
    for gap in draw(GAPS):
        prev += 1 + gap
        offs.append(prev)
    late = nxt > 0 and draw(ONE_IN_FIVE) == 0
    if late:
        # Late offsets first: below the high-water mark, finished or never
        # added (valid), or in flight (the call fails).
        below = {nxt - d for d in draw(LATE) if nxt - d >= 0}
        if live and not valid:
            below.add(draw(st.sampled_from(live)))
        offs = sorted(below) + offs
    elif not valid:
        # Not strictly increasing, or below the high-water mark (late: valid
        # unless in flight or negative).
        pos = draw(st.integers(0, len(offs)))
        offs.insert(pos, (offs[pos - 1] if pos else nxt - 1) + draw(BAD_STEP))
    method = draw(ADD_METHOD)
    if method == "add":
        return Call("add", (offs[0] if offs else nxt + draw(BAD_STEP) + 1,))
    if method == "add_range":
        if late:
            start = max(-1, nxt - draw(LATE_DEPTH))
        else:
            start = nxt + (draw(RANGE_START) if not valid else draw(GAP))
        return Call("add_range", start=start, stop=start + draw(RANGE_LEN))
    skip = draw(NEXT_OFFSET)
    next_offset = None if skip is None else (offs[-1] if offs else nxt) + skip
    if method == "add_batch":
        return Call("add_batch", tuple(offs), "messages", next_offset)
    contiguous = bool(offs) and offs == list(range(offs[0], offs[-1] + 1))
    container = draw(CONTIGUOUS_CONTAINER if contiguous else CONTAINER)
    return Call("add_many", tuple(offs), container, next_offset)


WHERE = st.sampled_from(["lowest", "anywhere", "all"])
COMPLETE_METHOD = st.sampled_from(["complete", "complete_many", "complete_many", "complete_batch"])
ITERABLE = st.sampled_from(["list", "tuple", "iter"])


@st.composite
def complete_call(draw: st.DrawFn, live: list[int], finished: list[int], nxt: int) -> Call:
    # From the lowest in flight (the head moves), anywhere (finished offsets
    # pile up behind the head), or all of them (nothing left in flight).
    where = draw(WHERE)
    pool = sorted(live)[:8] if where == "lowest" else live
    if where == "all" and len(live) <= 40:
        offs = list(draw(st.permutations(live)))
    else:
        k = draw(st.integers(0, min(len(pool), 8)))
        picked = draw(st.lists(st.integers(0, len(pool) - 1), min_size=k, max_size=k, unique=True)) if k else []
        offs = [pool[i] for i in picked]
    method = draw(COMPLETE_METHOD)
    if draw(ONE_IN_FIVE) == 0 or (method == "complete" and not offs):
        # Something not in flight: finished, skipped, never added, below the
        # lowest in flight, negative -- or an offset twice.
        inflight = set(live)
        candidates = [nxt, nxt + 1, nxt + 100, -1, min(live, default=nxt) - 1] + finished[-20:]
        candidates += [o + 1 for o in live[:20] if o + 1 not in inflight]
        twice = bool(offs) and draw(st.booleans())
        bad = draw(st.sampled_from(offs)) if twice else draw(st.sampled_from(candidates))
        offs.insert(draw(st.integers(0, len(offs))), bad)
    if method == "complete":
        return Call("complete", (offs[0],))
    if method == "complete_batch":
        return Call("complete_batch", tuple(offs), "messages")
    return Call("complete_many", tuple(offs), draw(ITERABLE))


@settings(max_examples=300, deadline=None)
@given(start=st.one_of(st.integers(0, 5), st.integers(0, 1 << 40)), data=st.data())
def test_twins_agree_on_arbitrary_calls(offsets_c: ModuleType, start: int, data: st.DataObject) -> None:
    c, py = offsets_c.OffsetTracker(start), PyTracker(start)
    assert reading(c) == reading(py)
    live: list[int] = []
    finished: list[int] = []
    for _ in range(data.draw(st.integers(1, 40), label="calls")):
        if bool(live) and data.draw(st.booleans(), label="complete?"):
            call = data.draw(complete_call(live, finished, py.next_offset))
        else:
            call = data.draw(add_call(py.next_offset, live))
        if step(c, py, call):
            if call.method.startswith("add"):
                live.extend(call.touched())
            else:
                for o in call.offsets:
                    live.remove(o)
                finished.extend(call.offsets)
        assert py.in_flight == len(live)
        assert py.unfinished() == sorted(live)


def test_constructor_agrees(offsets_c: ModuleType) -> None:
    for start in (0, 1, 5, 1 << 40):
        assert reading(offsets_c.OffsetTracker(start)) == reading(PyTracker(start)) == (start, 0, 0, start, ())
    assert reading(offsets_c.OffsetTracker()) == reading(PyTracker()) == (0, 0, 0, 0, ())
    for bad in (-1, -(1 << 40)):
        with pytest.raises(ValueError):
            PyTracker(bad)
        with pytest.raises(ValueError):
            offsets_c.OffsetTracker(bad)


# --- a long seeded run -------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_twins_agree_over_a_long_lane_like_run(offsets_c: ModuleType, seed: int) -> None:
    """Tens of thousands of calls in the runtime's pattern -- batches added,
    finished out of order in small chunks, a few offsets left in flight for a
    long time, filtered gaps, finished offsets redelivered late, a wrong call
    now and then -- so the compiled twin's ring wraps, grows and moves back
    many times."""
    rng = random.Random(seed)
    start = rng.randrange(1 << 20)
    c, py = offsets_c.OffsetTracker(start), PyTracker(start)
    live: list[int] = []
    finished: deque[int] = deque(maxlen=2000)
    for _ in range(4000):
        nxt = py.next_offset
        offs = []
        for _ in range(rng.randint(1, 32)):
            nxt += 1 + (rng.randint(1, 300) if rng.random() < 0.02 else 0)
            offs.append(nxt - 1)
        skip = rng.choice([None, None, nxt + rng.randint(0, 5)])
        method = rng.choice(["add_many", "add_batch"])
        container = "messages" if method == "add_batch" else "list"
        assert step(c, py, Call(method, tuple(offs), container, skip))
        live.extend(offs)
        rng.shuffle(live)
        # Leave about one offset in 500 in flight for a while (a slow message).
        keep = [o for o in live if rng.random() < 0.002] if len(live) < 200 else []
        todo = [o for o in live if o not in keep]
        for i in range(0, len(todo), 4):
            chunk = tuple(todo[i : i + 4])
            methods = ["complete_many", "complete_batch"] + (["complete"] if len(chunk) == 1 else [])
            method = rng.choice(methods)
            container = "messages" if method == "complete_batch" else "list"
            assert step(c, py, Call(method, chunk, container))
            finished.extend(chunk)
        live = keep
        if rng.random() < 0.05:
            # Redelivered late (a message-grain source): a few finished
            # offsets, maybe far below those still in flight, maybe with the
            # next new ones.
            late = sorted(rng.sample(list(finished), min(len(finished), rng.randint(1, 4))))
            late += list(range(py.next_offset, py.next_offset + rng.randint(0, 3)))
            method = rng.choice(["add_many", "add_batch"])
            assert step(c, py, Call(method, tuple(late), "messages" if method == "add_batch" else "list"))
            live.extend(late)
            again = set(late)
            finished = deque((o for o in finished if o not in again), maxlen=2000)
        if rng.random() < 0.05:
            # A wrong call: must fail the same way and change nothing: an
            # add of an offset in flight or negative, a complete of one not.
            if rng.random() < 0.5:
                bad = rng.choice(live + [-5])
                assert not step(c, py, Call("add", (bad,)))
            else:
                bad = rng.choice([o for o in (py.next_offset - 1, offs[0], -5) if o not in live] or [-5])
                assert not step(c, py, Call("complete", (bad,)))
        assert py.in_flight == len(live)


# --- unfinished() ------------------------------------------------------------------------


def test_unfinished_agrees_across_ring_growth_wrap_and_skips(offsets_c: ModuleType) -> None:
    """``unfinished()`` scans the compiled twin's ring from its head: the same
    list when the head has wrapped, after the ring grew, across finished
    slots behind and ahead of the head, and when a skip put ``next_offset``
    far past the ring's capacity."""
    c, py = offsets_c.OffsetTracker(100), PyTracker(100)
    calls = [
        Call("add_range", start=100, stop=164),  # fills the first 64 slots
        Call("complete_many", tuple(range(100, 160))),  # head moves to slot 60
        Call("add_many", (164, 165, 170)),  # wraps around the ring
        Call("complete_many", (161, 165)),  # finished slots behind and ahead
        Call("add_many", tuple(range(171, 400, 3)), next_offset=1_000_000),  # grows, then a long skip
        Call("complete_many", tuple(range(171, 400, 6))),
        Call("add", (2_000_000,)),  # span far past the ring before it grows
        Call("complete_many", (160, 162, 163, 164)),  # the head jumps to 170
    ]
    for call in calls:
        assert step(c, py, call)
    assert c.unfinished() == py.unfinished()
    assert py.unfinished()[0] == py.lowest_unfinished() == 170
    assert py.unfinished()[-1] == 2_000_000
    # Everything finished: empty, and the next add re-anchors the ring.
    assert step(c, py, Call("complete_many", tuple(py.unfinished())))
    assert c.unfinished() == py.unfinished() == []
    assert step(c, py, Call("add_many", (2_000_005, 2_000_007)))
    assert c.unfinished() == py.unfinished() == [2_000_005, 2_000_007]


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(0, 1 << 40),
    gaps=st.lists(st.integers(0, 200), min_size=1, max_size=300),
    done=st.lists(st.booleans(), max_size=300),
    skip=st.none() | st.integers(0, 100_000),
)
def test_unfinished_agrees_on_random_patterns(
    offsets_c: ModuleType, start: int, gaps: list[int], done: list[bool], skip: int | None
) -> None:
    """Offsets added with random gaps, a random subset finished: both twins
    list the rest, in order."""
    offs, prev = [], start - 1
    for gap in gaps:
        prev += 1 + gap
        offs.append(prev)
    c, py = offsets_c.OffsetTracker(start), PyTracker(start)
    next_offset = None if skip is None else offs[-1] + 1 + skip
    assert step(c, py, Call("add_many", tuple(offs), next_offset=next_offset))
    finished = tuple(o for o, d in zip(offs, done, strict=False) if d)
    if finished:
        assert step(c, py, Call("complete_many", finished))
    assert c.unfinished() == py.unfinished() == sorted(set(offs) - set(finished))


# --- late offsets in the compiled ring ----------------------------------------------------


def test_late_offsets_agree_across_ring_moves(offsets_c: ModuleType) -> None:
    """Late offsets at each place the compiled ring treats apart: inside the
    window (GAP and DONE slots), below ``base`` with the head wrapped (the
    window moves back and the ring grows), in the skipped region above the
    stored slots (whose ring position is an in-flight slot's), and with
    nothing in flight (re-anchored)."""
    c, py = offsets_c.OffsetTracker(1000), PyTracker(1000)
    calls = [
        Call("add_range", start=1000, stop=1064),  # fills the 64 slots
        Call("complete_many", tuple(range(1000, 1060))),  # head at slot 60
        Call("complete", (1062,)),  # a DONE slot behind the lowest in flight
        Call("add_many", (1064, 1070)),  # wraps
        Call("add_many", (1062, 1066)),  # inside the window: a DONE and a GAP slot
        Call("add_batch", (1020, 1055), "messages"),  # below base, the head wrapped: the ring moves back
        Call("complete_many", (1020,)),
        Call("add_many", (1010, 1011), "tuple", next_offset=5000),  # below base again, then a long skip
        Call("add_range", start=1200, stop=1300),  # a late range past the stored slots
        Call("complete_many", tuple(range(1200, 1300, 2))),
        Call("add_batch", tuple(range(1200, 1300, 2)), "messages"),  # the finished ones again
        Call("add_many", (3, 4999, 6000)),  # far below, late and new in one call
    ]
    for call in calls:
        assert step(c, py, call), call
    assert py.lowest_unfinished() == 3 and py.next_offset == 6001
    # In flight, anywhere in the window: refused, nothing changed.
    for bad in (3, 1010, 1055, 1062, 1066, 1201, 4999):
        assert not step(c, py, Call("add", (bad,)))
        assert not step(c, py, Call("add_range", start=bad - 1, stop=bad + 1))
        assert not step(c, py, Call("add_many", (0, bad, 7000)))
    # Nothing in flight: the ring, re-anchored at next_offset, re-anchors lower.
    assert step(c, py, Call("complete_many", tuple(py.unfinished())))
    assert step(c, py, Call("add_many", (100, 6000, 6001, 6100)))
    assert step(c, py, Call("add_range", start=50, stop=60))
    assert c.unfinished() == py.unfinished() == [*range(50, 60), 100, 6000, 6001, 6100]
    assert step(c, py, Call("complete_many", tuple(py.unfinished())))
    assert reading(c) == reading(py) == (6101, 0, 0, 6101, ())
    # Above the stored slots (64 from base 0): 64 and 128 sit in 0's ring slot
    # but are not in flight.
    c, py = offsets_c.OffsetTracker(0), PyTracker(0)
    for call in (
        Call("add_many", (0,), next_offset=1000),
        Call("add", (64,)),
        Call("add_range", start=127, stop=130),
        Call("add_batch", (192, 256), "messages"),
    ):
        assert step(c, py, call), call
    assert c.unfinished() == py.unfinished() == [0, 64, 127, 128, 129, 192, 256]
