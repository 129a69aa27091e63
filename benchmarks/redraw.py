"""The generator's rows in pure Python: ``key`` and ``cost_us`` of every
``seq``, as ``gen_load.py`` writes them, without Spark.

``gen_load`` draws each row's randomness as Spark's
``xxhash64(seq, seed, stream)`` (XXH64 of the 8-byte ``seq``, its result the
seed of XXH64 of the 8-byte ``seed``, that the seed of XXH64 of the 4-byte
``stream``; Spark's own seed is 42), takes the top 53 bits as a double in
``[0, 1)``, and maps it to a rank (uniform, hotkey, or the inverse of the
exact Zipf CDF: ``numpy.searchsorted(cumsum(pmf), u, side="right")``) and a
cost.  This module computes the same: the same hash, the same IEEE doubles,
the same sequential cumulative sum (``itertools.accumulate`` adds in the
order ``numpy.cumsum`` does), ``bisect_right`` for ``searchsorted``.
``tests/test_spark_jobs.py`` checks the rows equal Spark's.

One exception: the ``longtail`` cost goes through ``log``, ``cos`` and
``exp``, whose last bit may differ between the JVM and the C library, and
Spark rounds half up where Python's ``round`` rounds half to even; so a rare
``longtail`` cost may differ by 1 µs.  Keys and every other cost are exact.

About 1-2 s per 100,000 messages.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from itertools import accumulate

from gen_load import _STREAM_COST_1, _STREAM_COST_2, _STREAM_HOT, _STREAM_KEY
from workloads import LONGTAIL_SIGMA, Workload, cost_range_us, key_pmf, keys_for, longtail_mu

__all__ = ["draw", "spark_xxhash64", "uniform"]

_M64 = (1 << 64) - 1
_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5
#: Spark's default seed of ``xxhash64``.
_SPARK_SEED = 42


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _avalanche(h: int) -> int:
    h ^= h >> 33
    h = (h * _P2) & _M64
    h ^= h >> 29
    h = (h * _P3) & _M64
    return h ^ (h >> 32)


def _xxh64_long(value: int, seed: int) -> int:
    """XXH64 of one 8-byte little-endian word (unsigned result)."""
    h = (seed + _P5 + 8) & _M64
    h ^= (_rotl(((value & _M64) * _P2) & _M64, 31) * _P1) & _M64
    h = (_rotl(h, 27) * _P1 + _P4) & _M64
    return _avalanche(h)


def _xxh64_int(value: int, seed: int) -> int:
    """XXH64 of one 4-byte little-endian word (unsigned result)."""
    h = (seed + _P5 + 4) & _M64
    h ^= ((value & 0xFFFFFFFF) * _P1) & _M64
    h = (_rotl(h, 23) * _P2 + _P3) & _M64
    return _avalanche(h)


def spark_xxhash64(seq: int, seed: int, stream: int) -> int:
    """Spark's ``xxhash64(seq (long), seed (long), stream (int))`` as an
    unsigned 64-bit int (Spark shows it signed)."""
    return _xxh64_int(stream, _xxh64_long(seed, _xxh64_long(seq, _SPARK_SEED)))


def uniform(seq: int, seed: int, stream: int) -> float:
    """``gen_load._uniform``: the hash's top 53 bits times ``2**-53``."""
    return (spark_xxhash64(seq, seed, stream) >> 11) * 2.0**-53


def _ranks(workload: Workload) -> list[int]:
    k = workload.keys
    seed = workload.seed
    n = workload.messages
    us = [uniform(s, seed, _STREAM_KEY) for s in range(n)]
    if workload.skew == "uniform":
        return [min(math.floor(u * k), k - 1) for u in us]
    if workload.skew == "hotkey":
        share = workload.hot_share
        return [
            0 if uniform(s, seed, _STREAM_HOT) < share else 1 + min(math.floor(u * (k - 1)), k - 2)
            for s, u in enumerate(us)
        ]
    cdf = list(accumulate(key_pmf(workload)))
    cdf[-1] = 1.0
    last = k - 1
    return [min(bisect_right(cdf, u), last) for u in us]


def _costs(workload: Workload) -> list[int]:
    low, high = cost_range_us(workload)
    n = workload.messages
    seed = workload.seed
    if workload.cost in ("none", "constant"):
        return [low] * n
    u1 = [uniform(s, seed, _STREAM_COST_1) for s in range(n)]
    if workload.cost == "uniform":
        span = high - low
        return [low + min(math.floor(u * (span + 1)), span) for u in u1]
    mu = longtail_mu(workload)
    out = []
    for s, a in enumerate(u1):
        b = uniform(s, seed, _STREAM_COST_2)
        z = math.sqrt(-2.0 * math.log(1.0 - a)) * math.cos(2 * math.pi * b)
        out.append(min(math.floor(math.exp(mu + LONGTAIL_SIGMA * z) * 1000.0 + 0.5), high))
    return out


def draw(workload: Workload) -> tuple[list[str], list[int]]:
    """``(keys, costs_us)`` by ``seq``: the generator's ``key`` and
    ``cost_us`` columns of ``workload``."""
    names = keys_for(workload)
    return [names[r] for r in _ranks(workload)], _costs(workload)
