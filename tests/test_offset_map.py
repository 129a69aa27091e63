"""The offset map stored with a commit: encoding, decoding, size bound.

Round trips in both forms and the automatic choice, that the choice is the
shorter string, that ``estimate_size`` bounds the real size, that malformed
metadata is refused with a message naming the problem, and sizes at the
scale of a long span (1,000,000 offsets).
"""

from __future__ import annotations

import base64
import importlib
import random
import time
from typing import Any, Literal

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lite_push._kernels import offsets_py as _offsets_py
from lite_push._kernels.offsets_py import MAX_OFFSET
from lite_push._state.offset_map import FinishedOffsets, OffsetMapError, decode, encode, estimate_size, shrink

FORMS: tuple[Literal["auto", "runs", "bitmap"], ...] = ("auto", "runs", "bitmap")


def check(metadata: str, base: int, end: int, unfinished: list[int]) -> FinishedOffsets | None:
    """Decode ``metadata`` and check it names exactly the finished offsets."""
    fin = decode(metadata, base)
    if metadata == "":
        assert end == base + len(unfinished), "a map was due: something above base is finished"
        return None
    assert fin is not None and (fin.base, fin.end) == (base, end)
    todo = set(unfinished)
    for off in range(max(0, base - 3), end + 3):
        assert (off in fin) == (base <= off < end and off not in todo), off
    assert fin.finished_count() == end - base - len(unfinished)
    return fin


# --- round trips ------------------------------------------------------------------------


@st.composite
def maps(draw: st.DrawFn) -> tuple[int, int, list[int]]:
    """``(base, end, unfinished)``: base first among the unfinished, the
    rest a random subset of ``(base, end)`` -- sparse, dense, runs, or
    nothing finished at all."""
    base = draw(st.one_of(st.integers(0, 20), st.integers(0, 1 << 40), st.just(MAX_OFFSET - 400)))
    span = draw(st.integers(0, 400))
    if span == 0:
        return base, base, []
    density = draw(st.sampled_from([0.0, 0.01, 0.3, 0.5, 0.9, 1.0]))
    rng = random.Random(draw(st.integers(0, 1 << 32)))
    if draw(st.booleans()):  # runs of unfinished offsets
        unfinished, off, todo = [base], base + 1, True
        while off < base + span:
            length = rng.randint(1, 20)
            if todo:
                unfinished.extend(range(off, min(off + length, base + span)))
            off += length
            todo = not todo
    else:
        unfinished = [base] + [o for o in range(base + 1, base + span) if rng.random() < density]
    return base, base + span, unfinished


@settings(max_examples=400, deadline=None)
@given(case=maps())
def test_round_trip_in_every_form(case: tuple[int, int, list[int]]) -> None:
    base, end, unfinished = case
    texts = {form: encode(base, end, unfinished, form=form) for form in FORMS}
    for text in texts.values():
        assert text.isascii()
        check(text, base, end, unfinished)
    if texts["auto"]:
        assert '"r":' in texts["runs"] and '"m":' in texts["bitmap"]
        # The automatic choice is the shorter form (run-length on a tie).
        assert len(texts["auto"]) == min(len(texts["runs"]), len(texts["bitmap"]))
        assert texts["auto"] == (texts["runs"] if len(texts["runs"]) <= len(texts["bitmap"]) else texts["bitmap"])
    else:
        assert texts["runs"] == texts["bitmap"] == ""


def test_format() -> None:
    # 10 and 11 unfinished, 12-14 finished, 15 unfinished, 16-17 finished.
    assert encode(10, 18, [10, 11, 15], form="runs") == '{"v":1,"b":10,"e":18,"r":[2,3,1,2]}'
    # Bits 2, 3, 4, 6, 7 set: 0b11011100.
    assert encode(10, 18, [10, 11, 15], form="bitmap") == '{"v":1,"b":10,"e":18,"m":"3A=="}'
    assert base64.b64decode("3A==") == bytes([0b11011100])
    # A trailing unfinished run is kept: the runs add up to end - base.
    assert encode(0, 5, [0, 3, 4], form="runs") == '{"v":1,"b":0,"e":5,"r":[1,2,2]}'


def test_nothing_finished_is_the_empty_string() -> None:
    assert encode(7, 7, []) == ""
    assert encode(7, 8, [7]) == ""
    assert encode(7, 10, [7, 8, 9], form="bitmap") == ""
    assert decode("", 7) is None


def test_membership_outside_the_map() -> None:
    fin = decode(encode(100, 110, [100, 105]), 100)
    assert fin is not None
    assert [o for o in range(90, 120) if o in fin] == [101, 102, 103, 104, 106, 107, 108, 109]
    assert fin.finished_count() == 8 and fin.base == 100 and fin.end == 110
    assert "finished=8" in repr(fin)


@pytest.mark.parametrize(
    ("base", "end", "unfinished", "match"),
    [
        (10, 20, [11, 12], "first unfinished offset 11 is not base 10"),
        (10, 20, [9, 12], "first unfinished offset 9 is not base 10"),
        (10, 20, [10, 13, 12], "not strictly increasing: 12 after 13"),
        (10, 20, [10, 12, 12], "not strictly increasing: 12 after 12"),
        (10, 20, [10, 20], "unfinished offset 20 not below end 20"),
        (10, 20, [], "nothing unfinished in \\[10, 20\\)"),
        (10, 9, [], "end 9 outside \\[base 10"),
        (-1, 5, [-1], "base -1 outside"),
        (0, MAX_OFFSET + 2, [0], "end .* outside"),
    ],
)
def test_encode_refuses_inconsistent_input(base: int, end: int, unfinished: list[int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        encode(base, end, unfinished)


def test_encode_refuses_an_unknown_form() -> None:
    with pytest.raises(ValueError, match="unknown offset map form 'rle'"):
        encode(0, 5, [0], form="rle")  # type: ignore[arg-type]


# --- the shorter form ---------------------------------------------------------------------


def test_few_parked_offsets_in_a_huge_span_take_runs() -> None:
    base, end = 5_000_000, 6_000_000
    unfinished = [base, base + 17, base + 500_000, base + 999_999]
    text = encode(base, end, unfinished)
    assert text == '{"v":1,"b":5000000,"e":6000000,"r":[1,16,1,499982,1,499998,1]}'
    check(text, base, end, unfinished)


def test_dense_alternating_pattern_takes_the_bitmap() -> None:
    base, end = 1000, 1000 + 4096
    unfinished = list(range(base, end, 2))
    text = encode(base, end, unfinished)
    assert '"m":' in text
    assert len(text) < len(encode(base, end, unfinished, form="runs")) / 3
    check(text, base, end, unfinished)


# --- estimate_size --------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(case=maps(), far=st.booleans())
def test_estimate_size_bounds_the_encoded_size(case: tuple[int, int, list[int]], far: bool) -> None:
    base, end, unfinished = case
    if far:  # base and end at their longest
        shift = MAX_OFFSET + 1 - end
        base, end, unfinished = base + shift, end + shift, [u + shift for u in unfinished]
    bound = estimate_size(end - base, len(unfinished))
    assert bound >= len(encode(base, end, unfinished))


GAPS = st.sampled_from([1, 2, 9, 10, 11, 99, 100, 999, 1000, 99_999, 100_000, 10**7])


@settings(max_examples=300, deadline=None)
@given(
    base=st.integers(0, MAX_OFFSET - 10**9),
    gaps=st.lists(GAPS, min_size=1, max_size=60),
    parked=st.lists(st.integers(1, 40), min_size=1, max_size=60),
    tail=st.integers(0, 10**6),
)
def test_estimate_size_bounds_long_spans(base: int, gaps: list[int], parked: list[int], tail: int) -> None:
    """Long spans, runs of digit-heavy lengths (10**k, 10**k - 1): the
    bound holds where the run-length form is the one chosen."""
    unfinished: list[int] = []
    off = base
    for gap, count in zip(gaps, parked, strict=False):
        unfinished.extend(range(off, off + count))
        off += count + gap
    end = off - gaps[min(len(gaps), len(parked)) - 1] + tail  # the last gap is cut to ``tail``
    end = max(end, unfinished[-1] + 1)
    assert estimate_size(end - base, len(unfinished)) >= len(encode(base, end, unfinished))


@pytest.mark.parametrize("digits", [1, 2, 3, 4, 6])
def test_estimate_size_bounds_equal_runs(digits: int) -> None:
    """One parked offset every 10**digits: the run-length bound is within a
    digit per finished run (the same span and count allow runs of 10**digits
    where these are 10**digits - 1 long)."""
    gap = 10**digits
    base, span = MAX_OFFSET + 1 - 100 * gap, 100 * gap
    unfinished = list(range(base, base + span, gap))
    text = encode(base, base + span, unfinished)
    bound = estimate_size(span, len(unfinished))
    assert bound >= len(text)
    if digits > 1:
        assert '"r":' in text and bound <= len(text) + len(unfinished)


def test_estimate_size_edges() -> None:
    assert estimate_size(0, 0) == 0
    assert estimate_size(5, 5) == 0  # nothing finished: no map
    assert estimate_size(5, 9) == 0
    # The base is always unfinished: a count of 0 counts as 1.
    assert estimate_size(1000, 0) == estimate_size(1000, 1) >= len(encode(0, 1000, [0]))
    # Grows with the unfinished count up to the bitmap's size, then stays.
    sizes = [estimate_size(1_000_000, u) for u in (1, 10, 100, 1000, 10_000, 100_000, 500_000)]
    assert sizes == sorted(sizes)
    assert sizes[-1] == sizes[-2] <= 62 + 4 * -(-125_000 // 3)
    with pytest.raises(ValueError):
        estimate_size(-1, 0)
    with pytest.raises(ValueError):
        estimate_size(10, -1)


# --- malformed metadata ----------------------------------------------------------------------


def _map(**fields: Any) -> str:
    doc: dict[str, Any] = {"v": 1, "b": 10, "e": 20, "r": [1, 9]}
    doc.update(fields)
    return orjson.dumps({k: v for k, v in doc.items() if v is not ...}).decode()


@pytest.mark.parametrize(
    ("metadata", "match"),
    [
        ("offset=17", "not JSON"),
        ('{"v":1,"b":10', "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ("17", "not a JSON object"),
        (_map(v=...), "no version"),
        (_map(v=2), "version 2 is not 1"),
        (_map(v="1"), "version '1' is not 1"),
        (_map(v=True), "version True is not 1"),
        (_map(r=...), "fields .* are not"),
        (_map(m="AA=="), "fields .* are not"),
        (_map(x=1), "fields .* are not"),
        (_map(b="10"), "base 'b' must be an integer"),
        (_map(e=20.0), "end 'e' must be an integer"),
        (_map(b=-1), "base -1 outside"),
        (_map(b=11, e=20, r=[1, 8]), "base 11 is not the committed offset 10"),
        (_map(e=10, r=[]), "end 10 is not above its base 10"),
        (_map(e=5), "end 5 is not above its base 10"),
        (_map(r="1,9"), "runs 'r' must be a list"),
        (_map(r=[1, 9.0]), "run 1 must be an integer"),
        (_map(r=[1, True, 8]), "run 1 must be an integer"),
        (_map(r=[3, -2, 9]), "run 1 has negative length -2"),
        (_map(r=[0, 10]), "run 0 has length 0"),
        (_map(r=[1, 0, 9]), "run 1 has length 0"),
        (_map(r=[1, 8]), "runs add up to 9, not end - base = 10"),
        (_map(r=[1, 9, 1]), "runs add up to 11, not end - base = 10"),
        (_map(r=..., m=5), "bitmap 'm' must be a string"),
        (_map(r=..., m="not base64!"), "not base64"),
        (_map(r=..., m="AA"), "not base64"),
        (_map(r=..., m="AA=="), "bitmap too short: 1 bytes, 2 cover end - base = 10"),
        (_map(r=..., m="AAAA"), "bitmap too long: 3 bytes, 2 cover end - base = 10"),
        (_map(r=..., m=base64.b64encode(b"\x03\x00").decode()), "marks its base 10 finished"),
        (_map(r=..., m=base64.b64encode(b"\x02\x04").decode()), "at or above its end 20"),
    ],
)
def test_malformed_metadata_is_refused(metadata: str, match: str) -> None:
    with pytest.raises(OffsetMapError, match=match):
        decode(metadata, 10)


def test_offset_map_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        decode("{}", 0)
    fin = decode(_map(r=..., m=base64.b64encode(b"\x02\x02").decode()), 10)
    assert fin is not None and [o for o in range(10, 20) if o in fin] == [11, 19]


# --- with the tracker ---------------------------------------------------------------------------


def _trackers() -> list[Any]:
    params = [pytest.param(_offsets_py.OffsetTracker, id="py")]
    try:
        params.insert(0, pytest.param(importlib.import_module("lite_push._kernels.offsets_c").OffsetTracker, id="c"))
    except ImportError:
        pass
    return params


@pytest.mark.parametrize("Tracker", _trackers())
@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 1 << 32), start=st.integers(0, 1 << 40))
def test_a_commit_point_round_trips(Tracker: Any, seed: int, start: int) -> None:
    """What a consumer commits -- ``encode(lowest_unfinished(), next_offset,
    unfinished())`` -- names every offset added and finished, or skipped,
    above the committed one."""
    rng = random.Random(seed)
    t = Tracker(start)
    for _ in range(rng.randint(1, 30)):
        nxt = t.next_offset
        offs = [nxt + i for i in range(rng.randint(0, 20)) if rng.random() < 0.8]
        skip = rng.choice([None, (offs[-1] if offs else nxt) + rng.randint(1, 50)])
        t.add_many(offs, next_offset=skip)
        live = t.unfinished()
        t.complete_many(rng.sample(live, rng.randint(0, len(live))))
    low, end, unfinished = t.lowest_unfinished(), t.next_offset, t.unfinished()
    check(encode(low, end, unfinished), low, end, unfinished)


# --- a long span -----------------------------------------------------------------------------------

SPAN = 1_000_000


@pytest.mark.parametrize(
    ("count", "form", "limit"),
    [
        pytest.param(10, "r", 160, id="10-unfinished-runs-under-160B"),
        pytest.param(1_000, "r", 8 * 1024, id="1000-unfinished-runs-under-8KiB"),
        pytest.param(100_000, "m", 62 + 166_668, id="100000-unfinished-bitmap-166.7kB"),
    ],
)
def test_a_long_span(count: int, form: str, limit: int) -> None:
    """Span 1,000,000 with parked offsets at random positions: the size (in
    the test id), the form, and decoding fast enough for a restart."""
    rng = random.Random(count)
    base = 1 << 40
    unfinished = sorted([base, *rng.sample(range(base + 1, base + SPAN), count - 1)])
    text = encode(base, base + SPAN, unfinished)
    assert f'"{form}":' in text
    assert len(text) <= limit
    assert len(text) <= estimate_size(SPAN, count)
    if count == 1_000:
        assert len(text) < 16 * 1024
    started = time.perf_counter()
    fin = decode(text, base)
    elapsed = time.perf_counter() - started
    assert fin is not None and fin.finished_count() == SPAN - count
    assert elapsed < 0.5, f"decoding took {elapsed:.3f} s"
    # A restart checks each polled message: spot-check a stretch of them.
    todo = set(unfinished)
    assert all((o in fin) == (o not in todo) for o in range(base, base + 20_000))
    assert all((o in fin) == (o not in todo) for o in unfinished)


@given(
    st.integers(0, 10**9),
    st.sets(st.integers(1, 30_000), max_size=3000),
    st.integers(64, 4096),
)
@settings(max_examples=60, deadline=None)
def test_shrink_keeps_the_longest_prefix_that_fits(base: int, holes: set[int], limit: int) -> None:
    end = base + 30_001
    unfinished = [base, *sorted(base + h for h in holes)]
    full = encode(base, end, unfinished)
    cut = shrink(full, base, limit)
    assert len(cut) <= limit
    if len(full) <= limit:
        assert cut == full
        return
    whole = decode(full, base)
    part = decode(cut, base)
    assert whole is not None
    if part is None:  # not even the shortest map fits
        return
    assert part.end <= whole.end
    # a prefix: the same verdict on every offset it covers, nothing claimed past it
    for off in range(base, part.end):
        assert (off in part) == (off in whole)
    assert not any(off in part for off in range(part.end, min(part.end + 50, end)))
    # the longest: one more offset would not fit
    longer = encode(base, part.end + 1, [u for u in unfinished if u <= part.end])
    assert len(longer) > limit
