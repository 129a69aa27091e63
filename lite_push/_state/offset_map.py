"""The offset map: which offsets above a committed offset are already finished.

A consumer commits, per queue, the lowest offset it has not finished.  Offsets
above it may be finished already (a parked message holds the committed offset
back while its queue flows on), so a commit also stores, as the metadata
string of :class:`~lite_push._types.OffsetAndMetadata`, the map of those
finished offsets.  After a crash or a rebalance the next owner resumes at the
committed offset and skips the offsets the map names.

Format (version 1): a JSON object, ASCII, one of two forms over the offsets
``[b, e)``, ``b`` being the committed offset (always unfinished)::

    {"v":1,"b":<base>,"e":<end>,"r":[u0,f0,u1,f1,...]}
    {"v":1,"b":<base>,"e":<end>,"m":"<base64>"}

``r`` (run-length) holds the lengths of alternating runs of unfinished and
finished offsets, starting with the unfinished run at ``b`` (so ``u0 >= 1``);
every run is at least 1 long and the runs add up to ``e - b``.  ``m``
(bitmap) is standard base64, with padding, of ``ceil((e - b) / 8)`` bytes: bit
``i`` of byte ``i // 8`` (least significant bit first) is set when offset
``b + 8 * (i // 8) + i % 8`` is finished; bit 0 (offset ``b``) and the bits
past ``e - b`` are clear.  :func:`encode` picks the shorter form; the empty
string means there is no map (nothing finished above the committed offset).

Size and memory, for a span ``S = e - b`` with ``U`` unfinished offsets:

* the bitmap form is about ``S / 6`` characters (``S / 8`` bytes in base64),
  whatever ``U``; the run-length form at most ``2 U`` runs averaging at most
  ``1 + log10(S / U)`` digits, plus commas.  A few parked messages in a long
  span take a few bytes each; dense patterns cap at the bitmap's size.  For
  ``S = 1,000,000`` with unfinished offsets at random: 10 take about 130
  bytes and 1,000 about 6.3 KB (run-length), 100,000 about 166.7 KB (bitmap:
  166,668 characters of base64).  Brokers limit commit metadata (Kafka:
  ``offset.metadata.max.bytes``, 4096 by default); :func:`estimate_size` is
  the cheap bound flow control compares with its limit.
* :func:`encode` builds the run lengths (a Python int each) and, unless that
  form is clearly the longer, its JSON; the bitmap form needs about ``2 S``
  bytes while it packs one flag byte per offset into bits.
* :func:`decode` keeps a run-length map as an array of 8-byte run boundaries
  (at most 16 bytes per unfinished offset) and a bitmap map as its ``S / 8``
  bytes; membership is ``O(log runs)`` or ``O(1)``.
"""

from __future__ import annotations

import base64
import binascii
import operator
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate
from typing import Any, Literal

import orjson

from .._kernels.offsets_py import MAX_OFFSET

__all__ = ["VERSION", "FinishedOffsets", "OffsetMapError", "decode", "encode", "estimate_size", "shrink"]

#: The format version :func:`encode` writes and :func:`decode` reads.
VERSION = 1

_KEYS_RUNS = frozenset(("v", "b", "e", "r"))
_KEYS_BITMAP = frozenset(("v", "b", "e", "m"))

#: Digits of the largest base or end (``MAX_OFFSET + 1``): 19.
_OFFSET_DIGITS = len(str(MAX_OFFSET + 1))
#: ``{"v":1,"b":,"e":,"r":[]}`` and ``{"v":1,"b":,"e":,"m":""}`` without the
#: base, the end and the body: both 24 characters.
_FIXED = len(f'{{"v":{VERSION},"b":,"e":,"r":[]}}')
#: Most characters a map takes besides its body (base and end at their longest).
_OVERHEAD = _FIXED + 2 * _OFFSET_DIGITS


class OffsetMapError(ValueError):
    """Commit metadata that is not a valid offset map; the message says what
    is wrong with it."""


class FinishedOffsets:
    """The finished offsets of a decoded offset map, over ``[base, end)``.

    ``offset in m`` says whether ``offset`` is finished (False outside
    ``[base, end)``): ``O(log runs)`` for a run-length map, ``O(1)`` for a
    bitmap.  Built by :func:`decode`.
    """

    __slots__ = ("_bitmap", "_bounds", "_finished", "base", "end")

    def __init__(
        self,
        base: int,
        end: int,
        *,
        bounds: array[int] | None = None,
        bitmap: bytes | None = None,
        finished: int,
    ) -> None:
        """``bounds``: the first offset of each run after the first one (an
        odd count of boundaries at or below an offset means it is finished);
        or ``bitmap``: one bit per offset of ``[base, end)``, as in the
        format.  ``finished``: how many offsets are finished.  Not validated:
        :func:`decode` checks its input."""
        #: The committed offset the map is relative to (unfinished).
        self.base = base
        #: One past the highest offset the map covers.
        self.end = end
        self._bounds: array[int] = bounds if bounds is not None else array("q")
        self._bitmap = bitmap
        self._finished = finished

    def __contains__(self, offset: int) -> bool:
        if not self.base <= offset < self.end:
            return False
        bitmap = self._bitmap
        if bitmap is not None:
            i = offset - self.base
            return bool(bitmap[i >> 3] >> (i & 7) & 1)
        return bool(bisect_right(self._bounds, offset) & 1)

    def finished_count(self) -> int:
        """How many offsets of ``[base, end)`` are finished."""
        return self._finished

    def __repr__(self) -> str:
        form = "bitmap" if self._bitmap is not None else "runs"
        return f"FinishedOffsets(base={self.base}, end={self.end}, finished={self._finished}, form={form})"


# --- encoding ---------------------------------------------------------------------


def _runs(base: int, end: int, unfinished: Sequence[int]) -> list[int]:
    """The alternating run lengths (unfinished first) over ``[base, end)``;
    ValueError if ``unfinished`` does not fit the contract of :func:`encode`."""
    if unfinished[0] != base:
        raise ValueError(f"first unfinished offset {unfinished[0]} is not base {base}")
    runs: list[int] = []
    start = base  # first offset of the current unfinished run
    nxt = base  # the offset after the last unfinished one
    for off in unfinished:
        if off == nxt:
            nxt += 1
            continue
        if off < nxt:
            raise ValueError(f"unfinished offsets not strictly increasing: {off} after {nxt - 1}")
        runs.append(nxt - start)
        runs.append(off - nxt)
        start = off
        nxt = off + 1
    if nxt > end:
        raise ValueError(f"unfinished offset {nxt - 1} not below end {end}")
    runs.append(nxt - start)
    if nxt < end:
        runs.append(end - nxt)
    return runs


def _bitmap(base: int, span: int, unfinished: Sequence[int]) -> bytes:
    """The bitmap over ``[base, base + span)``: bit set = not in ``unfinished``."""
    # One flag byte per offset (padded to whole bytes of the bitmap with 0),
    # then packed eight to a byte at C speed: the flags of offsets 8k + j
    # (``flags[j::8]``, each 0 or 1) read as a little-endian integer and
    # shifted left by j land on bit j of byte k, and no two slices overlap.
    flags = bytearray(b"\x01") * span + bytes(-span % 8)
    for off in unfinished:
        flags[off - base] = 0
    bits = 0
    for j in range(8):
        bits |= int.from_bytes(flags[j::8], "little") << j
    return bits.to_bytes(len(flags) >> 3, "little")


def _dumps(base: int, end: int, key: str, body: object) -> str:
    return orjson.dumps({"v": VERSION, "b": base, "e": end, key: body}).decode("ascii")


def encode(
    base: int,
    end: int,
    unfinished: Sequence[int],
    *,
    form: Literal["auto", "runs", "bitmap"] = "auto",
) -> str:
    """The metadata string for a commit at ``base`` (the lowest unfinished
    offset) where the offsets of ``[base, end)`` not in ``unfinished`` are
    finished.

    ``unfinished`` is strictly increasing, within ``[base, end)``, and when
    not empty starts at ``base``.  Returns ``""`` when nothing above ``base``
    is finished (``end == base`` with nothing unfinished, or every offset of
    ``[base, end)`` unfinished).  ``form`` forces the run-length or the
    bitmap form; ``"auto"`` picks the shorter (run-length on a tie).
    Raises ValueError naming the problem when the input is inconsistent.
    """
    base = operator.index(base)
    end = operator.index(end)
    if not 0 <= base <= MAX_OFFSET + 1:
        raise ValueError(f"base {base} outside [0, {MAX_OFFSET + 1}]")
    if not base <= end <= MAX_OFFSET + 1:
        raise ValueError(f"end {end} outside [base {base}, {MAX_OFFSET + 1}]")
    if form not in ("auto", "runs", "bitmap"):
        raise ValueError(f"unknown offset map form {form!r}")
    span = end - base
    if not unfinished:
        if span:
            raise ValueError(f"nothing unfinished in [{base}, {end}): base is not the lowest unfinished offset")
        return ""
    runs = _runs(base, end, unfinished)
    if len(runs) == 1:  # one unfinished run up to end: nothing finished
        return ""
    if form == "runs":
        return _dumps(base, end, "r", runs)
    if form == "auto":
        # Characters the bitmap's base64 takes; the runs take at least one
        # digit each and a comma between two.
        bitmap_body = 4 * -(-((span + 7) >> 3) // 3)
        if 2 * len(runs) - 1 <= bitmap_body:
            text = _dumps(base, end, "r", runs)
            if len(text) <= _FIXED + len(str(base)) + len(str(end)) + bitmap_body:
                return text
    return _dumps(base, end, "m", base64.b64encode(_bitmap(base, span, unfinished)).decode("ascii"))


def _digits_bound(count: int, total: int) -> int:
    """Most decimal digits ``count`` positive integers adding up to ``total``
    can take together (``0 < count <= total``); at most 19 steps.

    Each integer takes one digit at least; its second digit costs 9 more of
    the total (1 -> 10), its third 90 more (10 -> 100), and so on.  The
    cheapest digits go first: every integer gets its second digit before any
    gets a third.
    """
    digits, spare, cost = count, total - count, 9
    while spare >= cost * count:
        spare -= cost * count
        digits += count
        cost *= 10
    return digits + spare // cost


def estimate_size(span: int, unfinished_count: int) -> int:
    """An upper bound, in O(1), on ``len(encode(base, base + span, u))`` for
    any ``base`` and any ``u`` of ``unfinished_count`` offsets.

    The smaller of the bitmap's exact size and a bound on the run-length
    form (at most ``2 * unfinished_count`` runs), plus the JSON around it
    with the base and end at their longest.  0 when ``span`` is 0 or no
    offset can be finished (``unfinished_count >= span``).  When ``span`` is
    positive the base itself is unfinished, so a ``unfinished_count`` of 0 is
    counted as 1.  Raises ValueError for a negative argument.
    """
    if span < 0 or unfinished_count < 0:
        raise ValueError(f"span {span} and unfinished_count {unfinished_count} must be >= 0")
    if unfinished_count >= span:
        return 0
    u = max(unfinished_count, 1)
    f = span - u
    bitmap_body = 4 * -(-((span + 7) >> 3) // 3)
    # Unfinished runs: at most u, and at most one more than the finished
    # offsets (a finished run separates two).  Finished runs: one after each
    # unfinished run at most, and at most f.
    u_runs = min(u, f + 1)
    f_runs = min(u_runs, f)
    runs_body = _digits_bound(u_runs, u) + _digits_bound(f_runs, f) + u_runs + f_runs - 1
    return _OVERHEAD + min(bitmap_body, runs_body)


# --- decoding ---------------------------------------------------------------------


def _offset_field(doc: dict[str, Any], key: str, name: str) -> int:
    value = doc.get(key)
    if type(value) is not int:
        raise OffsetMapError(f"offset map {name} {key!r} must be an integer, got {value!r}")
    if not 0 <= value <= MAX_OFFSET + 1:
        raise OffsetMapError(f"offset map {name} {value} outside [0, {MAX_OFFSET + 1}]")
    return value


def _decode_runs(base: int, end: int, runs: object) -> FinishedOffsets:
    if type(runs) is not list:
        raise OffsetMapError(f"offset map runs 'r' must be a list, got {type(runs).__name__}")
    if not all(type(r) is int and r >= 1 for r in runs):
        for i, r in enumerate(runs):
            if type(r) is not int:
                raise OffsetMapError(f"offset map run {i} must be an integer, got {r!r}")
            if r < 0:
                raise OffsetMapError(f"offset map run {i} has negative length {r}")
            if r == 0:
                raise OffsetMapError(f"offset map run {i} has length 0")
    total = sum(runs)
    if total != end - base:
        raise OffsetMapError(f"offset map runs add up to {total}, not end - base = {end - base}")
    bounds = array("q", accumulate(runs[:-1], initial=base))
    del bounds[0]
    return FinishedOffsets(base, end, bounds=bounds, finished=sum(runs[1::2]))


def _decode_bitmap(base: int, end: int, text: object) -> FinishedOffsets:
    if type(text) is not str:
        raise OffsetMapError(f"offset map bitmap 'm' must be a string, got {type(text).__name__}")
    try:
        bitmap = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise OffsetMapError(f"offset map bitmap is not base64: {exc}") from None
    span = end - base
    want = (span + 7) >> 3
    if len(bitmap) != want:
        which = "short" if len(bitmap) < want else "long"
        raise OffsetMapError(f"offset map bitmap too {which}: {len(bitmap)} bytes, {want} cover end - base = {span}")
    bits = int.from_bytes(bitmap, "little")
    if bits & 1:
        raise OffsetMapError(f"offset map marks its base {base} finished")
    if bits >> span:
        raise OffsetMapError(f"offset map bitmap marks offsets at or above its end {end} finished")
    return FinishedOffsets(base, end, bitmap=bitmap, finished=bits.bit_count())


def decode(metadata: str, committed: int) -> FinishedOffsets | None:
    """The finished offsets the commit metadata names, for a commit at
    ``committed``; None for ``""`` (no map).

    Raises OffsetMapError, naming the problem, for metadata that is not a
    version-1 offset map over ``[committed, end)``: not JSON, not an object,
    another version, missing, unknown or mistyped fields, a base other than
    ``committed``, run lengths below 1 or not adding up to ``end - base``, a
    bitmap of the wrong length or with bits set for the base or past the end.
    """
    if metadata == "":
        return None
    try:
        doc = orjson.loads(metadata)
    except orjson.JSONDecodeError as exc:
        raise OffsetMapError(f"offset map is not JSON: {exc}") from None
    if type(doc) is not dict:
        raise OffsetMapError(f"offset map is not a JSON object: {metadata[:40]!r}")
    if "v" not in doc:
        raise OffsetMapError("offset map has no version 'v'")
    version = doc["v"]
    if type(version) is not int or version != VERSION:
        raise OffsetMapError(f"offset map version {version!r} is not {VERSION}")
    keys = doc.keys()
    if keys != _KEYS_RUNS and keys != _KEYS_BITMAP:
        raise OffsetMapError(f"offset map fields {sorted(keys)} are not {sorted(_KEYS_RUNS)} or {sorted(_KEYS_BITMAP)}")
    base = _offset_field(doc, "b", "base")
    end = _offset_field(doc, "e", "end")
    if base != committed:
        raise OffsetMapError(f"offset map base {base} is not the committed offset {committed}")
    if end <= base:
        raise OffsetMapError(f"offset map end {end} is not above its base {base}")
    if "r" in doc:
        return _decode_runs(base, end, doc["r"])
    return _decode_bitmap(base, end, doc["m"])


def shrink(metadata: str, committed: int, max_bytes: int) -> str:
    """An offset map of at most ``max_bytes`` characters that names a prefix
    of what ``metadata`` (a map for a commit at ``committed``) names as
    finished: the longest such prefix.  Offsets past the prefix count as
    unfinished, so the next owner runs them again (at-least-once holds;
    only the skipping is lost).  ``""`` when even the shortest map does not
    fit; ``metadata`` itself when it fits.  For brokers that limit commit
    metadata (Kafka's ``offset.metadata.max.bytes``)."""
    if len(metadata) <= max_bytes:
        return metadata
    finished = decode(metadata, committed)
    if finished is None:  # pragma: no cover - "" always fits
        return ""
    base = finished.base
    unfinished = [o for o in range(base, finished.end) if o not in finished]
    best = ""
    lo, hi = base + 1, finished.end - 1  # the end of the map: at least one offset past the base
    while lo <= hi:
        mid = (lo + hi) // 2
        text = encode(base, mid, unfinished[: bisect_right(unfinished, mid - 1)])
        if len(text) <= max_bytes:
            best, lo = text, mid + 1
        else:
            hi = mid - 1
    return best
