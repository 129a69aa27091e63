"""route(): one call routes a whole dispatch into per-lane segments; both
twins give the same segments, and lanes are exactly lane_of(key, n)."""

from __future__ import annotations

from types import ModuleType

import pytest
from conftest import compiled_twin
from hypothesis import given, settings
from hypothesis import strategies as st

from lite_push import MessageExt, _router_py


def _msg(qid: int, off: int, key: str | None) -> MessageExt:
    return MessageExt("T", qid, off, b"", keys=key)


def test_segments_group_by_queue_and_lane(router: ModuleType) -> None:
    a = [_msg(0, i, k) for i, k in enumerate(["Aa", "BB", None, "x", "Aa", ""])]
    b = [_msg(1, i, k) for i, k in enumerate(["x", None, "BB"])]
    segments, counts = router.route([("q0", a, 2), ("q1", b, 3)], 4, None)
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


def test_key_of_and_errors(router: ModuleType) -> None:
    msgs = [_msg(0, i, f"ignored{i}") for i in range(10)]
    segments, counts = router.route([("q", msgs, 0)], 8, lambda m: "same")
    lane = router.lane_of("same", 8)
    assert counts[lane] == 10 and sum(counts) == 10
    assert segments[lane] == [("q", msgs)]
    with pytest.raises(ValueError, match="positive"):
        router.route([("q", msgs, 0)], 0, None)
    with pytest.raises(IndexError, match="keyless lane"):
        router.route([("q", [_msg(0, 0, None)], 9)], 8, None)


def test_compiled_twin_is_used_by_the_runtime_when_built() -> None:
    from lite_push import _router

    if _router.ROUTER_IMPL == "cython":
        assert _router.route is compiled_twin("_router_c").route


keys = st.one_of(st.none(), st.just(""), st.text(max_size=12), st.sampled_from(["Aa", "BB", "polygenelubricants"]))


@settings(max_examples=200, deadline=None)
@given(
    groups=st.lists(st.lists(keys, max_size=40), max_size=6),
    n=st.integers(1, 70),
    data=st.data(),
)
def test_twins_agree(groups: list[list[str | None]], n: int, data: st.DataObject) -> None:
    c = compiled_twin("_router_c")
    built = [
        (f"q{g}", [_msg(g, i, k) for i, k in enumerate(ks)], data.draw(st.integers(0, n - 1)))
        for g, ks in enumerate(groups)
    ]
    want = _router_py.route(built, n, None)
    assert c.route(built, n, None) == want
    assert c.route(built, n, lambda m: m.keys) == want
    segments, counts = want
    for i, segs in enumerate(segments):
        for tag, sub in segs or []:
            for m in sub:
                assert i == (_router_py.lane_of(m.keys, n) if m.keys else dict((t, kl) for t, _, kl in built)[tag])
        assert counts[i] == sum(len(sub) for _, sub in segs or [])


def test_route_matches_java_floor_mod(router: ModuleType) -> None:
    import base64
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).parent / "data" / "java_hashes.json").read_text(encoding="ascii"))
    cases = [c for c in data["cases"] if c["key"]]  # the empty key is keyless by design
    keys = [base64.b64decode(c["utf16le_b64"]).decode("utf-16-le", "surrogatepass") for c in cases]
    for j, n in enumerate(data["moduli"]):
        msgs = [_msg(0, i, k) for i, k in enumerate(keys)]
        segments, _ = router.route([("q", msgs, 0)], n, None)
        got = {m.queue_offset: lane for lane, segs in enumerate(segments) for _, sub in segs or [] for m in sub}
        assert [got[i] for i in range(len(cases))] == [c["floor_mod"][j] for c in cases], n


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
    segments, counts = router.route([("q", items, 1)], 8, None)
    assert segments == _router_py.route([("q", items, 1)], 8, None)[0]
    sub = Upper.__new__(Upper)
    got = router.route([("q", [sub], 0)], 8, None)[0]
    assert got[router.lane_of("UPPER", 8)] == [("q", [sub])]
    with pytest.raises(AttributeError):
        router.route([("q", [_msg(0, 0, "a"), unset], 0)], 8, None)
