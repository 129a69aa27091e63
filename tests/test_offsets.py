"""The offset tracker against a naive sorted model, for every twin.

Late offsets included: a call may start below the high-water mark with any
offset not in flight (a message-grain source's redelivery of a message
another member did not finish).
"""

from __future__ import annotations

import importlib

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from lite_push._kernels import offsets_py as _offsets_py


def _twins():
    params = [pytest.param(_offsets_py.OffsetTracker, id="py")]
    try:
        mod = importlib.import_module("lite_push._kernels.offsets_c")
        params.insert(0, pytest.param(mod.OffsetTracker, id="c"))
    except ImportError:
        pass
    return params


TWINS = _twins()


class Model:
    def __init__(self, start):
        self.inflight: set[int] = set()
        self.next = start

    def add_many(self, offs, next_offset=None):
        self.inflight.update(offs)
        if offs:
            self.next = max(self.next, offs[-1] + 1)
        if next_offset is not None and next_offset > self.next:
            self.next = next_offset

    def complete_many(self, offs):
        self.inflight.difference_update(offs)

    def lowest(self):
        return min(self.inflight) if self.inflight else self.next


@pytest.mark.parametrize("Tracker", TWINS)
def test_basic_and_gaps(Tracker):
    t = Tracker(10)
    assert t.lowest_unfinished() == 10 and t.in_flight == 0 and t.span == 0
    t.add_many([10, 11, 15, 16], next_offset=20)  # 12-14 filtered, 17-19 filtered
    assert t.lowest_unfinished() == 10 and t.in_flight == 4 and t.span == 10
    t.complete_many([11, 15])
    assert t.lowest_unfinished() == 10
    t.complete(10)
    assert t.lowest_unfinished() == 16
    t.complete(16)
    assert t.lowest_unfinished() == 20 and t.in_flight == 0
    t.add(25)
    assert t.lowest_unfinished() == 25
    with pytest.raises(ValueError, match="in flight"):
        t.add(25)
    with pytest.raises(ValueError, match="increase"):
        t.add_many([27, 26])
    with pytest.raises(ValueError, match="increase"):
        t.add_many([20, 20])
    assert t.unfinished() == [25] and t.next_offset == 26


@pytest.mark.parametrize("Tracker", TWINS)
def test_unfinished(Tracker):
    t = Tracker(10)
    assert t.unfinished() == []
    t.add_many([10, 11, 15, 16, 30], next_offset=40)
    assert t.unfinished() == [10, 11, 15, 16, 30]
    t.complete_many([11, 16])
    assert t.unfinished() == [10, 15, 30]
    t.complete(10)  # the lowest moves up to 15
    assert t.unfinished() == [15, 30] and t.lowest_unfinished() == 15
    with pytest.raises(ValueError):
        t.complete_many([30, 11])  # a failed call changes nothing
    assert t.unfinished() == [15, 30]
    t.complete_many([15, 30])
    assert t.unfinished() == [] and t.lowest_unfinished() == 40
    t.add_range(100, 200)  # grows the compiled twin's ring past 64 slots
    t.complete_many(range(101, 200, 2))
    assert t.unfinished() == list(range(100, 200, 2))


@pytest.mark.parametrize("Tracker", TWINS)
def test_add_range(Tracker):
    t = Tracker(0)
    t.add_range(0, 100)
    t.complete_many(range(1, 100))
    assert t.lowest_unfinished() == 0 and t.in_flight == 1
    t.complete(0)
    assert t.lowest_unfinished() == 100


@st.composite
def scenarios(draw):
    start = draw(st.integers(0, 1 << 40))
    ops = []
    nxt = start
    pending: list[int] = []
    for _ in range(draw(st.integers(1, 40))):
        if pending and draw(st.booleans()):
            k = draw(st.integers(1, len(pending)))
            chosen = draw(st.permutations(pending))[:k]
            for c in chosen:
                pending.remove(c)
            ops.append(("complete", chosen))
        else:
            # Late offsets first (now and then): below the high-water mark,
            # not in flight -- never added, skipped or finished.
            offs = []
            if nxt and draw(st.integers(0, 3)) == 0:
                late = draw(st.lists(st.integers(max(0, start - 50), nxt - 1), min_size=1, max_size=4, unique=True))
                offs = sorted(set(late) - set(pending))
            gaps = draw(st.lists(st.integers(0, 3), min_size=0, max_size=10))
            for g in gaps:
                nxt += g
                offs.append(nxt)
                nxt += 1
            tail = draw(st.integers(0, 3))
            nxt += tail
            pending.extend(offs)
            ops.append(("add", offs, nxt))
    return start, ops


@pytest.mark.parametrize("Tracker", TWINS)
@settings(max_examples=300, deadline=None)
@given(scenario=scenarios())
def test_matches_naive_model(Tracker, scenario):
    start, ops = scenario
    t, m = Tracker(start), Model(start)
    for op in ops:
        if op[0] == "add":
            t.add_many(op[1], op[2])
            m.add_many(op[1], op[2])
        else:
            t.complete_many(op[1])
            m.complete_many(op[1])
        assert t.lowest_unfinished() == m.lowest()
        assert t.in_flight == len(m.inflight)
        assert t.span == ((m.next - m.lowest()) if m.inflight else 0)
        assert t.unfinished() == sorted(m.inflight)


@pytest.mark.parametrize("Tracker", TWINS)
def test_batch_methods_read_any_message_object(Tracker):
    # The compiled twin reads MessageExt's slots directly; any other object
    # with queue_offset and body goes through getattr, with the same result.
    from lite_push import MessageExt

    class Plain:
        def __init__(self, off, body):
            self.queue_offset, self.body = off, body

    class Odd(MessageExt):
        @property  # type: ignore[override]
        def body(self):
            return b"12345"

        @body.setter
        def body(self, value):
            pass

    t = Tracker(0)
    odd = Odd("T", 0, 3, b"")
    batch = [MessageExt("T", 0, 0, b"ab"), Plain(1, b"abc"), MessageExt("T", 0, 2, b""), odd, Plain(4, bytearray(b"z"))]
    assert t.add_batch(batch, None) == 2 + 3 + 0 + 5 + 1
    assert t.complete_batch([batch[1], odd]) == 3 + 5
    assert t.lowest_unfinished() == 0 and t.in_flight == 3
    with pytest.raises(AttributeError):
        t.complete_batch([Plain(0, b"")][:0] + [object()])
    assert t.in_flight == 3


# --- late offsets ---------------------------------------------------------------------


def reading(t):
    return (t.lowest_unfinished(), t.in_flight, t.span, t.next_offset, t.unfinished())


@pytest.mark.parametrize("Tracker", TWINS)
def test_a_late_offset_below_the_lowest_moves_it_down(Tracker):
    t = Tracker(100)
    t.add_many(range(100, 110))
    t.complete_many(range(100, 105))
    assert reading(t) == (105, 5, 5, 110, [105, 106, 107, 108, 109])
    t.add(50)  # below the lowest in flight (the compiled ring's base): the window moves back
    assert reading(t) == (50, 6, 60, 110, [50, 105, 106, 107, 108, 109])
    t.add_many([40, 60, 104])  # lower still, inside the window, and a finished offset again
    assert reading(t) == (40, 9, 70, 110, [40, 50, 60, 104, 105, 106, 107, 108, 109])
    t.complete_many([40, 50])
    assert t.lowest_unfinished() == 60 and t.span == 50
    t.complete_many([60, 104, 105, 106, 107, 108, 109])
    assert reading(t) == (110, 0, 0, 110, [])


@pytest.mark.parametrize("Tracker", TWINS)
def test_late_offsets_inside_the_window(Tracker):
    t = Tracker(0)
    t.add_many([0, 2, 5, 8], next_offset=12)  # 1, 3, 4, 6, 7, 9-11 skipped
    t.complete_many([2, 5])
    t.add_many([1, 2, 3, 5, 11])  # skipped, finished, skipped, finished, skipped
    assert reading(t) == (0, 7, 12, 12, [0, 1, 2, 3, 5, 8, 11])
    t.complete_many([0, 1])
    assert t.lowest_unfinished() == 2 and t.span == 10
    t.add(1)  # finished a moment ago, below the lowest again
    assert t.lowest_unfinished() == 1 and t.unfinished() == [1, 2, 3, 5, 8, 11]
    t.complete_many([1, 2, 3, 5, 8, 11])
    assert reading(t) == (12, 0, 0, 12, [])


@pytest.mark.parametrize("Tracker", TWINS)
def test_a_mixed_batch_of_late_then_new_messages(Tracker):
    from lite_push import MessageExt

    t = Tracker(0)
    first = [MessageExt("T", 0, o, b"x" * o) for o in range(10)]
    assert t.add_batch(first, 10) == sum(range(10))
    t.complete_batch(first)
    assert t.lowest_unfinished() == 10
    mixed = [MessageExt("T", 0, o, b"y") for o in (3, 7, 10, 11, 14)]
    assert t.add_batch(mixed, 20) == 5
    assert reading(t) == (3, 5, 17, 20, [3, 7, 10, 11, 14])
    assert t.complete_batch(mixed[:2]) == 2
    assert reading(t) == (10, 3, 10, 20, [10, 11, 14])
    # The next_offset argument never lowers the high-water mark.
    t.add_many([4], next_offset=5)
    assert t.next_offset == 20 and t.lowest_unfinished() == 4


@pytest.mark.parametrize("Tracker", TWINS)
def test_late_offsets_when_nothing_is_in_flight(Tracker):
    t = Tracker(0)
    t.add_many([0, 1], next_offset=200)
    t.complete_many([0, 1])
    assert reading(t) == (200, 0, 0, 200, [])
    t.add(0)  # the compiled ring, re-anchored at 200, re-anchors at 0
    assert reading(t) == (0, 1, 200, 200, [0])
    t.add_range(150, 210)  # late and new in one range
    assert t.in_flight == 61 and t.next_offset == 210 and t.span == 210
    t.complete(0)
    assert t.lowest_unfinished() == 150
    t.complete_many(range(150, 210))
    assert reading(t) == (210, 0, 0, 210, [])
    t.add_range(5, 8)  # all late: the high-water mark stays
    assert reading(t) == (5, 3, 205, 210, [5, 6, 7])


def _late_calls(t):
    """Calls that must each fail on a tracker with 5, 10, 11 in flight and
    next_offset 20."""
    from lite_push import MessageExt

    return [
        lambda: t.add(10),
        lambda: t.add(5),
        lambda: t.add_many([10]),
        lambda: t.add_many([2, 3, 11, 25]),  # in flight in the middle, new offsets after
        lambda: t.add_many([4, 5], next_offset=100),
        lambda: t.add_many((1, 3, 3)),  # not strictly increasing within the call
        lambda: t.add_many([7, 6, 21]),
        lambda: t.add_many([-1, 0]),
        lambda: t.add(-1),
        lambda: t.add_batch([MessageExt("T", 0, o, b"x") for o in (0, 11, 30)], 40),
        lambda: t.add_range(0, 6),
        lambda: t.add_range(11, 30),
        lambda: t.add_range(-2, 3),
    ]


@pytest.mark.parametrize("Tracker", TWINS)
def test_an_offset_in_flight_cannot_be_added_again_and_a_failed_call_changes_nothing(Tracker):
    t = Tracker(0)
    t.add_many([5, 10, 11, 12], next_offset=20)
    t.complete(12)
    before = reading(t)
    assert before == (5, 3, 15, 20, [5, 10, 11])
    for i, call in enumerate(_late_calls(t)):
        with pytest.raises(ValueError):
            call()
        assert reading(t) == before, i
    with pytest.raises(ValueError, match="already in flight"):
        t.add(11)
    # and the tracker still works
    t.add_many([4, 12, 20])
    assert reading(t) == (4, 6, 17, 21, [4, 5, 10, 11, 12, 20])


# --- both twins and a set-based model over random adds (late ones too) and completes --


TRACKERS = [p.values[0] for p in TWINS]


class LateOffsetsMachine(RuleBasedStateMachine):
    """Every twin against a set of in-flight offsets and a high-water mark.
    Offsets stay under a few hundred past the start, so late offsets, both
    never added and finished, are drawn often; the start is near 0 or far."""

    def __init__(self):
        super().__init__()
        self.trackers = []
        self.inflight: set[int] = set()
        self.done: set[int] = set()
        self.start = self.next = 0

    @initialize(start=st.sampled_from([0, 3, 1 << 40]))
    def begin(self, start):
        self.trackers = [cls(start) for cls in TRACKERS]
        self.start = self.next = start

    def _add(self, method, offs, next_offset=None):
        from lite_push import MessageExt

        for t in self.trackers:
            if method == "add":
                t.add(offs[0])
            elif method == "add_range":
                t.add_range(offs[0], offs[-1] + 1)
            elif method == "add_batch":
                assert t.add_batch([MessageExt("T", 0, o, b"ab") for o in offs], next_offset) == 2 * len(offs)
            else:
                t.add_many(offs, next_offset)
        self.inflight.update(offs)
        self.done.difference_update(offs)
        self.next = max(self.next, offs[-1] + 1, next_offset or 0)

    @rule(gaps=st.lists(st.integers(0, 3), min_size=1, max_size=8), skip=st.none() | st.integers(0, 70))
    def add_new(self, gaps, skip):
        offs, prev = [], self.next - 1
        for g in gaps:
            prev += 1 + g
            offs.append(prev)
        self._add("add_many", offs, None if skip is None else prev + 1 + skip)

    @precondition(lambda self: self.next > 0)
    @rule(data=st.data())
    def add_late(self, data):
        """Offsets below the high-water mark and not in flight (finished or
        never added), maybe followed by new ones, through any add method."""
        pool = sorted(self.done) + list(range(max(0, self.start - 20), self.next))
        late = sorted(set(data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=6))) - self.inflight)
        assume(late)
        new = list(range(self.next, self.next + data.draw(st.integers(0, 3))))
        offs = late + new
        contiguous = offs == list(range(offs[0], offs[-1] + 1))
        methods = ["add_many", "add_batch"] + ["add_range"] * contiguous + ["add"] * (len(offs) == 1)
        skip = data.draw(st.none() | st.integers(0, 5))
        method = data.draw(st.sampled_from(methods))
        self._add(method, offs, None if skip is None or method in ("add", "add_range") else offs[-1] + skip)

    @precondition(lambda self: self.inflight)
    @rule(data=st.data())
    def add_in_flight(self, data):
        """A call naming an offset in flight fails and changes nothing."""
        bad = data.draw(st.sampled_from(sorted(self.inflight)))
        before = [reading(t) for t in self.trackers]
        for t in self.trackers:
            with pytest.raises(ValueError, match="in flight"):
                t.add_many([o for o in range(bad - 3, bad) if o >= 0 and o not in self.inflight] + [bad, self.next])
        assert [reading(t) for t in self.trackers] == before

    @precondition(lambda self: self.inflight)
    @rule(data=st.data())
    def complete(self, data):
        offs = data.draw(st.lists(st.sampled_from(sorted(self.inflight)), min_size=1, max_size=8, unique=True))
        for t in self.trackers:
            if len(offs) == 1 and data.draw(st.booleans()):
                t.complete(offs[0])
            else:
                t.complete_many(offs)
        self.inflight.difference_update(offs)
        self.done.update(offs)

    @invariant()
    def agree_with_the_model(self):
        low = min(self.inflight) if self.inflight else self.next
        want = (low, len(self.inflight), self.next - low if self.inflight else 0, self.next, sorted(self.inflight))
        for t in self.trackers:
            assert reading(t) == want, type(t).__module__


LateOffsetsMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
TestLateOffsetsMachine = LateOffsetsMachine.TestCase
