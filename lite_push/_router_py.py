"""Pure-Python twin of the key-hash router (see ``_router.py``).

Java's ``String.hashCode`` is ``s[0]*31^(n-1) + ... + s[n-1]`` over the
string's UTF-16 code units, wrapped to a signed 32-bit int.  Characters outside
the Basic Multilingual Plane are two code units (a surrogate pair), so the
hash is taken over the UTF-16 encoding, not over Python's code points.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["bucket", "java_hash", "lane_of", "route"]

T = TypeVar("T")
K = TypeVar("K")

_MASK = 0xFFFFFFFF


def java_hash(key: str) -> int:
    """Java's ``String.hashCode`` of ``key`` (a signed 32-bit int)."""
    h = 0
    if key.isascii():
        units: Sequence[int] = key.encode("ascii")
    else:
        units = array("H", key.encode("utf-16-le", "surrogatepass"))
    for unit in units:
        h = (31 * h + unit) & _MASK
    return h - 0x100000000 if h & 0x80000000 else h


def lane_of(key: str, n: int) -> int:
    """The lane of ``key`` among ``n``: ``floorMod(hashCode, n)``, never
    negative (Java's ``Math.abs(h) % n`` is negative for ``Integer.MIN_VALUE``)."""
    if n <= 0:
        raise ValueError(f"lane count must be positive, got {n}")
    return java_hash(key) % n  # Python's % is floorMod


def bucket(
    items: Sequence[T],
    n: int,
    key_of: Callable[[T], str | None],
    keyless_lane: int,
    cache: dict[str, int],
) -> list[list[T]]:
    """Route ``items`` into ``n`` lists by ``lane_of(key_of(item), n)``.

    Items whose key is ``None`` or empty go to ``keyless_lane``.  ``cache``
    maps keys to lanes for this ``n``; the caller owns it and bounds its size.
    Order within each list is the order of ``items``.
    """
    out: list[list[T]] = [[] for _ in range(n)]
    get = cache.get
    for item in items:
        key = key_of(item)
        if not key:
            out[keyless_lane].append(item)
            continue
        lane = get(key)
        if lane is None:
            lane = cache[key] = java_hash(key) % n
        out[lane].append(item)
    return out


#: key -> lane caches of :func:`route`, one per lane count (lanes are a pure
#: function of key and count, so consumers may share them).
_ROUTE_CACHES: dict[int, dict[str, int]] = {}
#: A route cache is cleared when it grows past this many keys.
ROUTE_CACHE_LIMIT = 1 << 17


def route(
    groups: Sequence[tuple[K, Sequence[T], int]],
    n: int,
    key_of: Callable[[T], str | None] | None,
) -> tuple[list[list[tuple[K, list[T]]] | None], list[int]]:
    """Route several batches into per-lane *segments* in one call.

    ``groups`` holds ``(tag, items, keyless_lane)`` per batch (lite_push passes
    one per polled queue, tagged with its ProcessQueue).  Returns
    ``(segments, counts)``: ``segments[i]`` is ``None`` when lane ``i`` got
    nothing, else the list of ``(tag, sub_items)`` routed to it, one per group
    in group order, items in their order; ``counts[i]`` is the number of items
    lane ``i`` got.  ``key_of=None`` reads ``item.keys``.  Lanes are
    ``lane_of(key, n)``; empty or ``None`` keys go to the group's
    ``keyless_lane``.  (This twin caches lanes per key, bounded by
    ``ROUTE_CACHE_LIMIT``; the compiled one hashes every key.)
    """
    if n <= 0:
        raise ValueError(f"lane count must be positive, got {n}")
    cache = _ROUTE_CACHES.get(n)
    if cache is None or len(cache) > ROUTE_CACHE_LIMIT:
        cache = _ROUTE_CACHES[n] = {}
    segments: list[list[tuple[K, list[T]]] | None] = [None] * n
    counts = [0] * n
    get = cache.get
    for tag, items, keyless_lane in groups:
        if not 0 <= keyless_lane < n:
            raise IndexError(f"keyless lane {keyless_lane} out of range for {n} lanes")
        current: dict[int, list[T]] = {}
        for item in items:
            key = item.keys if key_of is None else key_of(item)  # type: ignore[attr-defined]
            if not key:
                lane = keyless_lane
            else:
                cached = get(key)
                if cached is None:
                    cached = cache[key] = java_hash(key) % n
                lane = cached
            sub = current.get(lane)
            if sub is None:
                sub = current[lane] = []
                segs = segments[lane]
                if segs is None:
                    segs = segments[lane] = []
                segs.append((tag, sub))
            sub.append(item)
        for lane, sub in current.items():
            counts[lane] += len(sub)
    return segments, counts
