"""The offset tracker against a naive sorted model, for every twin."""

from __future__ import annotations

import importlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lite_push import _offsets_py


def _twins():
    params = [pytest.param(_offsets_py.OffsetTracker, id="py")]
    try:
        mod = importlib.import_module("lite_push._offsets_c")
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
            self.next = offs[-1] + 1
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
    with pytest.raises(ValueError, match="increase"):
        t.add(24)
    with pytest.raises(ValueError, match="increase"):
        t.add_many([20, 21])


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
            gaps = draw(st.lists(st.integers(0, 3), min_size=0, max_size=10))
            offs = []
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
