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

__all__ = ["bucket", "java_hash", "lane_of"]

T = TypeVar("T")

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
