"""KeyRouter: one call routes a whole dispatch into per-lane segments; the
load placement keeps a key on its lane while it has work there and puts a
key with none on the least-loaded lane; both twins place keys identically,
event for event."""

from __future__ import annotations

from collections import deque
from types import ModuleType
from typing import Any

import pytest
from conftest import compiled_twin
from hypothesis import given, settings
from hypothesis import strategies as st

from lite_push import MessageExt
from lite_push._kernels import router_py as _router_py


def _msg(qid: int, off: int, key: str | None) -> MessageExt:
    return MessageExt("T", qid, off, b"", keys=key)


def _lanes_of(segments: list[Any]) -> dict[int, int]:
    """offset -> lane, from route()'s segments."""
    return {m.queue_offset: lane for lane, segs in enumerate(segments) for _, sub in segs or [] for m in sub}


def test_segments_group_by_queue_and_lane(router: ModuleType) -> None:
    a = [_msg(0, i, k) for i, k in enumerate(["Aa", "BB", None, "x", "Aa", ""])]
    b = [_msg(1, i, k) for i, k in enumerate(["x", None, "BB"])]
    segments, counts = router.KeyRouter(4, "java").route([("q0", a, 2), ("q1", b, 3)])
    lane = {k: router.lane_of(k, 4) for k in ("Aa", "BB", "x")}
    assert lane["Aa"] == lane["BB"]  # 2112: same hash, same lane
    expected: dict[int, list[tuple[str, list[MessageExt]]]] = {}

    def put(i: int, tag: str, m: MessageExt) -> None:
        segs = expected.setdefault(i, [])
        if not segs or segs[-1][0] != tag:
            segs.append((tag, []))
        segs[-1][1].append(m)

    for m in a:
        put(lane[m.keys] if m.keys else 2, "q0", m)
    for m in b:
        put(lane[m.keys] if m.keys else 3, "q1", m)
    assert segments == [expected.get(i) for i in range(4)]
    assert counts == [sum(len(s) for _, s in expected.get(i, [])) for i in range(4)]


def test_segments_are_cut_at_max_segment(router: ModuleType) -> None:
    a = [_msg(0, i, "k") for i in range(7)]
    b = [_msg(1, i, "k") for i in range(2)]
    segments, counts = router.KeyRouter(2, "java", max_segment=3).route([("q0", a, 0), ("q1", b, 0)])
    lane = router.lane_of("k", 2)
    assert segments[lane] == [("q0", a[:3]), ("q0", a[3:6]), ("q0", a[6:]), ("q1", b)]
    assert counts[lane] == 9
    with pytest.raises(ValueError, match="max_segment must be an int >= 0"):
        router.KeyRouter(2, max_segment=-1)


def test_key_of_and_errors(router: ModuleType) -> None:
    msgs = [_msg(0, i, f"ignored{i}") for i in range(10)]
    for placement in ("load", "hash", "java"):
        segments, counts = router.KeyRouter(8, placement, lambda m: "same").route([("q", msgs, 0)])
        assert sorted(counts) == [0] * 7 + [10]
        assert segments[counts.index(10)] == [("q", msgs)]
    assert router.KeyRouter(8, "java", lambda m: "same").lane_of_key("same") == router.lane_of("same", 8)
    for bad in (0, -1, 1.5, "4"):
        with pytest.raises(ValueError, match="lane count must be a positive int"):
            router.KeyRouter(bad)
    with pytest.raises(ValueError, match="placement must be one of"):
        router.KeyRouter(4, "random")
    with pytest.raises(IndexError, match="keyless lane 8 out of range for 8 lanes"):
        router.KeyRouter(8).route([("q", [_msg(0, 0, None)], 8)])


def test_the_compiled_twin_is_used_by_the_runtime_when_built() -> None:
    from lite_push._kernels import router as _router

    if _router.ROUTER_IMPL == "cython":
        assert _router.KeyRouter is compiled_twin("router_c").KeyRouter


# --- load placement ----------------------------------------------------------------


def test_new_keys_go_to_the_least_loaded_lane_and_stay_while_they_have_work(router: ModuleType) -> None:
    r = router.KeyRouter(4)
    assert r.tracks_load and r.placement == "load"
    # ties go to the lowest index; each new key then loads its lane
    first = [_msg(0, i, k) for i, k in enumerate(["a", "b", "a", "c", "d", "e", "a"])]
    segments, counts = r.route([("q", first, 3)])
    assert _lanes_of(segments) == {0: 0, 1: 1, 2: 0, 3: 2, 4: 3, 5: 1, 6: 0}
    assert counts == [3, 2, 1, 1] and r.loads() == [3, 2, 1, 1]
    assert r.placed_keys() == 5 and r.lane_of_key("a") == 0 and r.lane_of_key("zz") is None
    # lane 0 finishes the first two "a"s: "a" still has work there and stays
    r.release(0, [first[0], first[2]])
    assert r.loads() == [1, 2, 1, 1] and r.lane_of_key("a") == 0
    segments, _ = r.route([("q", [_msg(0, 7, "a"), _msg(0, 8, "f")], 3)])
    assert _lanes_of(segments) == {7: 0, 8: 2}  # "f": lanes 2 and 3 hold 1, lane 2 is lower
    # every message of "a" released: it leaves the table and may move
    r.release(0, [first[6], _msg(0, 7, "a")])
    assert r.lane_of_key("a") is None and r.loads() == [0, 2, 2, 1]
    segments, _ = r.route([("q", [_msg(0, 9, "a")], 3)])
    assert _lanes_of(segments) == {9: 0}


def test_keyless_messages_load_their_queues_lane(router: ModuleType) -> None:
    r = router.KeyRouter(3)
    keyless = [_msg(0, i, None if i % 2 else "") for i in range(5)]
    r.route([("q0", keyless, 0)])
    assert r.loads() == [5, 0, 0] and r.placed_keys() == 0
    segments, _ = r.route([("q1", [_msg(1, 0, "k"), _msg(1, 1, "j")], 2)])
    assert _lanes_of(segments) == {0: 1, 1: 2}
    r.release(0, keyless)
    assert r.loads() == [0, 1, 1]


def test_a_hot_key_keeps_its_lane_and_new_keys_avoid_it(router: ModuleType) -> None:
    r = router.KeyRouter(4)
    hot = [_msg(0, i, "hot") for i in range(100)]
    r.route([("q", hot, 0)])
    segments, _ = r.route([("q", [_msg(0, 100 + i, f"k{i}") for i in range(30)], 0)])
    lanes = _lanes_of(segments)
    assert 0 not in lanes.values() and r.loads() == [100, 10, 10, 10]


def test_everything_released_leaves_nothing_behind(router: ModuleType) -> None:
    r = router.KeyRouter(8)
    msgs = [_msg(i % 3, i, f"k{i % 500}") for i in range(5000)]
    segments, _ = r.route([("q", msgs, 5)])
    assert r.placed_keys() == 500
    box: deque[tuple[int, list[MessageExt]]] = deque()
    for lane, segs in enumerate(segments):
        for _, sub in segs or []:
            box.append((lane, sub[: len(sub) // 2]))
            box.append((lane, sub[len(sub) // 2 :]))
    assert r.release_from(box) == 5000 and not box
    assert r.placed_keys() == 0 and r.loads() == [0] * 8


def test_the_table_stays_bounded_by_the_work_in_flight(router: ModuleType) -> None:
    """Keys without work are kept for when they come back, but swept once
    they outnumber the keys with work by ``SWEEP_SLACK``: a stream of ever
    new keys does not grow the table without bound."""
    r = router.KeyRouter(4)
    slack = router.SWEEP_SLACK
    held = [_msg(0, i, f"held-{i}") for i in range(100)]
    r.route([("q", held, 0)])  # 100 keys keep work throughout
    segments_held = {lane: [m for m in held if r.lane_of_key(m.keys) == lane] for lane in range(4)}
    biggest = 0
    for start in range(0, 3 * slack, 1000):
        batch = [_msg(0, 1000 + start + i, f"new-{start + i}") for i in range(1000)]
        segments, _ = r.route([("q", batch, 0)])
        for lane, segs in enumerate(segments):
            for _, sub in segs or []:
                r.release(lane, sub)
        biggest = max(biggest, r.table_size())
    assert r.placed_keys() == 100
    assert biggest <= 2 * 100 + slack + 1000
    # releasing the keys that kept work leaves nothing placed
    for lane, ms in segments_held.items():
        r.release(lane, ms)
    assert r.placed_keys() == 0 and r.loads() == [0] * 4


def test_bad_releases_are_errors_naming_the_key(router: ModuleType) -> None:
    r = router.KeyRouter(4)
    m = _msg(0, 0, "k")
    r.route([("q", [m], 0)])
    with pytest.raises(ValueError, match="release of key 'k' on lane 1: the key is placed on lane 0"):
        r.release(1, [m])
    with pytest.raises(IndexError, match="lane 4 out of range for 4 lanes"):
        r.release(4, [m])
    r.release(0, [m])
    with pytest.raises(ValueError, match="release of key 'k' on lane 0: the key is not placed"):
        r.release(0, [m])
    with pytest.raises(ValueError, match="release of 1 message"):
        r.release(2, [_msg(0, 1, None)])


def test_a_run_of_one_key_releases_its_count_and_no_more(router: ModuleType) -> None:
    # A run of messages of one key (equal keys, distinct str objects, as a
    # decoder makes them) is released with one lookup; its count still holds.
    ms = [_msg(0, i, "".join(["k", "ey"])) for i in range(3)]
    r = router.KeyRouter(4)
    r.route([("q", [_msg(0, 9, "other")], 0), ("q", ms, 1)])
    lane = r.lane_of_key("key")
    r.release(lane, ms)
    assert r.placed_keys() == 1 and r.lane_of_key("key") is None and sum(r.loads()) == 1
    r = router.KeyRouter(4)
    r.route([("q", ms[:2], 0)])
    lane = r.lane_of_key("key")
    with pytest.raises(ValueError, match=f"release of key 'key' on lane {lane}: the key is not placed"):
        r.release(lane, ms)


def test_fixed_placements_ignore_releases(router: ModuleType) -> None:
    for placement in ("hash", "java"):
        r = router.KeyRouter(4, placement)
        assert not r.tracks_load
        m = _msg(0, 0, "k")
        r.route([("q", [m], 0)])
        r.release(3, [m, m])  # nothing is tracked, so nothing to get wrong
        assert r.loads() == [0] * 4 and r.placed_keys() == 0


def test_the_heap_stays_exact_through_many_releases(router: ModuleType) -> None:
    # Releases push heap entries without routes popping them; past
    # 2 * lanes + HEAP_SLACK the heap is rebuilt.  Placements stay exact.
    r = router.KeyRouter(3)
    msgs = [_msg(0, i, f"k{i}") for i in range(600)]
    segments, _ = r.route([("q", msgs, 0)])
    held = {lane: [m for _, sub in segs for m in sub] for lane, segs in enumerate(segments) if segs}
    for i in range(199):  # lane 2 drains to 1, lanes 0 and 1 keep 200 each
        r.release(2, [held[2][i]])
    assert r.loads() == [200, 200, 1]
    segments, _ = r.route([("q", [_msg(0, 600, "new")], 0)])
    assert _lanes_of(segments) == {600: 2}


def test_route_reads_keys_of_any_object(router: ModuleType) -> None:
    # The compiled twin reads MessageExt's slot directly; other classes,
    # subclasses overriding ``keys`` and unset slots take the getattr path.
    class Plain:
        def __init__(self, keys: str | None) -> None:
            self.keys = keys

    class Upper(MessageExt):
        @property  # type: ignore[override]
        def keys(self) -> str:
            return "UPPER"

        @keys.setter
        def keys(self, value: object) -> None:
            pass

    class Slotted:
        __slots__ = ("keys",)

    unset = Slotted()
    items = [_msg(0, 0, "a"), Plain("b"), _msg(0, 1, "c"), Plain(None), _msg(0, 2, "a")]
    for placement in ("load", "java"):
        got = router.KeyRouter(8, placement).route([("q", items, 1)])
        assert got == _router_py.KeyRouter(8, placement).route([("q", items, 1)])
        sub = Upper.__new__(Upper)
        segments, _ = router.KeyRouter(8, "java").route([("q", [sub], 0)])
        assert segments[router.lane_of("UPPER", 8)] == [("q", [sub])]
        with pytest.raises(AttributeError):
            router.KeyRouter(8, placement).route([("q", [_msg(0, 0, "a"), unset], 0)])


# --- the twins agree, event for event ----------------------------------------------

KEYS = st.one_of(
    st.none(), st.just(""), st.sampled_from(["Aa", "BB", "polygenelubricants", "k1", "k2", "k3"]), st.text(max_size=6)
)


@st.composite
def _events(draw: st.DrawFn) -> tuple[int, str, bool, int, list[tuple[str, Any]]]:
    """A sequence of routes, releases and limits: ``("route", [(queue, keys,
    keyless)])``, ``("release", (lane, how_many, wrong))`` (``wrong``: on
    another lane) or ``("limit", lanes)``."""
    n = draw(st.integers(1, 40))
    placement = draw(st.sampled_from(["load", "hash", "java"]))
    custom = draw(st.booleans())
    cap = draw(st.sampled_from([0, 1, 2, 8]))
    events: list[tuple[str, Any]] = []
    for _ in range(draw(st.integers(1, 30))):
        if draw(st.integers(0, 9)) == 0:  # the asyncio admission's limit moves
            events.append(("limit", draw(st.integers(-1, n + 2))))
        elif draw(st.integers(0, 5)) == 0:  # a lane stuck in a call takes no new key, then does again
            events.append((draw(st.sampled_from(["stall", "unstall"])), draw(st.integers(0, n - 1))))
        elif draw(st.booleans()):
            groups = [
                (q, draw(st.lists(KEYS, max_size=30)), draw(st.integers(0, n - 1)))
                for q in range(draw(st.integers(1, 4)))
            ]
            events.append(("route", groups))
        else:
            release = (draw(st.integers(0, n - 1)), draw(st.integers(0, 40)), draw(st.integers(0, 20)) == 0)
            events.append(("release", release))
    return n, placement, custom, cap, events


@settings(max_examples=300, deadline=None)
@given(case=_events())
def test_twins_place_keys_identically(case: tuple[int, str, bool, int, list[tuple[str, Any]]]) -> None:
    n, placement, custom, cap, events = case
    c = compiled_twin("router_c")
    key_of = (lambda m: m.keys) if custom else None
    twins = [c.KeyRouter(n, placement, key_of, cap), _router_py.KeyRouter(n, placement, key_of, cap)]
    held: list[list[MessageExt]] = [[] for _ in range(n)]  # what each lane holds, in order
    offset = 0
    for kind, arg in events:
        if kind == "limit":
            for t in twins:
                t.limit = arg
            assert twins[0].limit == twins[1].limit == min(n, max(1, arg))
        elif kind in ("stall", "unstall"):
            for t in twins:
                getattr(t, kind)(arg)
            assert twins[0].stalled == twins[1].stalled
        elif kind == "route":
            groups = []
            for q, keys, keyless in arg:
                groups.append((q, [_msg(q, offset + i, k) for i, k in enumerate(keys)], keyless))
                offset += len(keys)
            got = [t.route(groups) for t in twins]
            assert got[0] == got[1]
            for lane, segs in enumerate(got[0][0]):
                assert got[0][1][lane] == sum(len(sub) for _, sub in segs or [])
                for _, sub in segs or []:
                    assert 0 < len(sub) <= (cap or len(sub))
                    held[lane] += sub
        else:
            lane, count, wrong = arg
            items = held[lane][:count]
            target = (lane + 1) % n if wrong else lane
            outcomes = []
            for t in twins:
                try:
                    t.release(target, items)
                    outcomes.append(None)
                except (ValueError, IndexError) as e:
                    outcomes.append((type(e), str(e)))
            assert outcomes[0] == outcomes[1]
            if target != lane and placement == "load" and items:
                # a bad release (an error, or keyless messages, which name no
                # lane to check, taken off the wrong lane's count): the state
                # is the caller's fault from here; the twins still agree
                assert twins[0].loads() == twins[1].loads()
                return
            del held[lane][:count]
        assert twins[0].loads() == twins[1].loads()
        assert twins[0].placed_keys() == twins[1].placed_keys()
        if placement == "load":
            assert twins[0].loads() == [len(h) for h in held]


# --- the load placement against a model ---------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 12),
    steps=st.lists(
        st.tuples(
            st.booleans(),
            st.lists(st.integers(0, 15), max_size=20),
            st.integers(0, 11),
            st.integers(0, 25),
            st.integers(0, 13),
            st.frozensets(st.integers(0, 11), max_size=12),
        ),
        max_size=40,
    ),
)
def test_load_placement_matches_its_definition(router: ModuleType, n: int, steps: list[Any]) -> None:
    """Every key's unreleased messages are on one lane; a key with none goes
    to ``min((load, lane))`` over the loads at that moment (messages routed
    and not released, counting those routed earlier in the same call) of
    the lanes under the limit that are not stalled (all of them when every
    one is stalled)."""
    r = router.KeyRouter(n)
    held: list[list[MessageExt]] = [[] for _ in range(n)]
    offset = 0
    for is_route, keys, lane, count, limit, stalled in steps:
        stalled = {i for i in stalled if i < n}
        for i in range(n):
            (r.stall if i in stalled else r.unstall)(i)
        assert r.stalled == stalled
        if is_route:
            r.limit = limit
            under = min(n, max(1, limit))
            open_ = [i for i in range(under) if i not in stalled] or list(range(under))
            msgs = [_msg(0, offset + i, f"k{k}") for i, k in enumerate(keys)]
            offset += len(msgs)
            loads = [len(h) for h in held]
            where = {m.keys: i for i, h in enumerate(held) for m in h}
            want = {}
            for m in msgs:
                if m.keys not in where:
                    where[m.keys] = min(open_, key=lambda i: (loads[i], i))
                want[m.queue_offset] = where[m.keys]
                loads[where[m.keys]] += 1
            segments, _ = r.route([("q", msgs, 0)])
            assert _lanes_of(segments) == want
            for i, segs in enumerate(segments):
                for _, sub in segs or []:
                    held[i] += sub
        else:
            lane %= n
            done, held[lane] = held[lane][:count], held[lane][count:]
            r.release(lane, done)
        assert r.loads() == [len(h) for h in held]
        assert r.placed_keys() == len({m.keys for h in held for m in h})
        for i, h in enumerate(held):
            for m in h:
                assert r.lane_of_key(m.keys) == i


def test_a_stalled_lane_gets_no_new_key_but_keeps_its_own(router: ModuleType) -> None:
    r = router.KeyRouter(3)
    segs, _ = r.route([("q", [_msg(0, 0, "a")], 0)])
    assert r.lane_of_key("a") == 0
    r.stall(0)
    r.stall(0)  # twice is once
    assert r.stalled == frozenset({0})
    segs, _ = r.route([("q", [_msg(0, 1, "a"), _msg(0, 2, "b"), _msg(0, 3, "c")], 0)])
    assert _lanes_of(segs) == {1: 0, 2: 1, 3: 2}  # "a" has work on lane 0 and stays; "b" and "c" avoid it
    r.stall(1)
    r.stall(2)
    segs, _ = r.route([("q", [_msg(0, 4, "d")], 0)])
    assert _lanes_of(segs) == {4: 1}  # every lane stalled: the least-loaded all the same (0 has 2, 1 and 2 have 1)
    r.unstall(0)
    r.unstall(0)
    segs, _ = r.route([("q", [_msg(0, 5, "e")], 0)])
    assert _lanes_of(segs) == {5: 0}  # the one lane not stalled, though the most loaded (2, 2, 1)
    with pytest.raises(IndexError):
        r.stall(3)
    with pytest.raises(IndexError):
        r.unstall(-1)
    fixed = router.KeyRouter(3, "hash")
    fixed.stall(1)
    assert fixed.stalled == frozenset()  # fixed placements pin keys: nothing to avoid
