"""Benchmark workloads: what the PySpark load generator writes, and the bound
that a workload's key skew puts on any key-ordered consumer.

Pure Python (no Spark, no numpy): the harness and the tests import it cheaply.
The key strings live in ``keyspace`` and the bounds on the generated data
(per lane placement: :func:`partition_bound`) in ``partition``; both are
re-exported here.

A :class:`Workload` describes ``messages`` messages over ``keys`` keys sent to
a topic of ``queues`` queues (the queue is chosen by key hash when sending, as
RocketMQ's hash selector does; it is not part of the generated file).  Keys
are ranked ``0 .. keys-1``, rank 0 the most frequent; the key *string* of a
rank depends on ``key_format`` (:func:`key_string`):

* ``"luhn"`` (the default) -- a 16-digit account-number-like id with a Luhn
  check digit (:func:`key_for_rank`), spread over the id space by the seed;
* ``"sequential"`` -- ``f"acct-{rank}"``, so the hottest rank is ``acct-0``
  (ids as a database sequence hands them out; Java's ``String.hashCode`` of
  such strings differs only in its low bits from one key to the next).

Key skew (``skew``):

* ``"uniform"`` — every key equally likely;
* ``"zipf"`` — rank ``r`` has probability ``(r+1)**-zipf_s / H`` with
  ``H = sum(k**-zipf_s for k in 1..keys)`` (the exact finite Zipf law,
  :func:`key_pmf`);
* ``"hotkey"`` — rank 0 gets ``hot_share`` of the messages, the other keys
  share the rest uniformly.

Per-message processing cost (``cost``), in milliseconds; ``cost_ms`` is always
the **mean** cost:

* ``"none"`` — zero (runtime overhead only);
* ``"constant"`` — exactly ``cost_ms``;
* ``"uniform"`` — uniform on ``[2*cost_ms - cost_max_ms, cost_max_ms]``
  (so the mean is ``cost_ms``; e.g. ``cost_ms=2.5, cost_max_ms=5`` is 0–5 ms);
* ``"longtail"`` — **lognormal** with shape ``LONGTAIL_SIGMA`` (σ = 1.0),
  capped at ``cost_max_ms``; its location μ is solved so that the mean *after*
  the cap is exactly ``cost_ms`` (:func:`longtail_mu`).

The generator rounds costs to whole microseconds (column ``cost_us``).

Poisoned keys (``poison_keys``, ``poison_failures``): a share ``poison_keys``
of the keys is *poisoned* -- every message of such a key fails its first
``poison_failures`` listener attempts, then succeeds (column ``fail_times``;
the harness's listener raises while ``reconsume_times < fail_times``).
Exactly ``round(keys * poison_keys)`` ranks are poisoned, drawn from the seed
independently of how frequent a rank is (:func:`poisoned_ranks`), so a
poisoned key may be a hot one.  Both fields are 0 (no failures) or both set.
A poisoned message costs the run at least ``poison_failures`` retry delays
(``suspend_ms`` each): per key in ``KEY_ORDERLY``, per queue in
``QUEUE_ORDERLY``.  Keep ``poison_failures`` below the consumer's
``max_reconsume_times`` (16 by default) or the messages are dead-lettered.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from keyspace import KEY_FORMATS, KEY_SPACE, key_for_rank, key_string
from partition import partition_bound

from lite_push._kernels.router import lane_of

__all__ = [
    "COSTS",
    "KEY_FORMATS",
    "KEY_SPACE",
    "LONGTAIL_SIGMA",
    "SKEWS",
    "WORKLOADS",
    "SkewBound",
    "Workload",
    "ceiling_ratio",
    "cost_range_us",
    "get_workload",
    "hot_key_bound",
    "key_for_rank",
    "key_pmf",
    "key_string",
    "keys_for",
    "longtail_mu",
    "mean_cost_ms",
    "partition_bound",
    "poisoned_ranks",
    "poisoned_share",
    "queue_of",
    "queue_shares",
    "skew_bound",
]

SKEWS = ("uniform", "zipf", "hotkey")
COSTS = ("none", "constant", "uniform", "longtail")
#: Shape (σ of the underlying normal) of the ``longtail`` lognormal cost.
LONGTAIL_SIGMA = 1.0
#: Largest accepted seed (Spark hashes it as a signed 64-bit long).
MAX_SEED = 2**63 - 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


@dataclass(frozen=True)
class Workload:
    """One benchmark load; see the module docstring for the meaning of
    ``skew`` and ``cost``.  Fields that a chosen skew or cost does not use
    must be left at 0 (so a forgotten ``skew="zipf"`` is an error, not a
    silently uniform load).  Raises :class:`ValueError` naming the field."""

    name: str
    messages: int
    queues: int
    keys: int
    skew: str = "uniform"
    zipf_s: float = 0.0
    hot_share: float = 0.0
    body_size: int = 64
    cost: str = "none"
    cost_ms: float = 0.0
    cost_max_ms: float = 0.0
    seed: int = 42
    #: Share of the keys that are poisoned, in [0, 1) (see the module docstring).
    poison_keys: float = 0.0
    #: Failed attempts of every message of a poisoned key before it succeeds.
    poison_failures: int = 0
    #: How a key rank is written: ``"luhn"`` or ``"sequential"`` (see the
    #: module docstring).
    key_format: str = "luhn"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        ints = (("messages", 1), ("queues", 1), ("keys", 1), ("body_size", 0), ("seed", 0), ("poison_failures", 0))
        for field, low in ints:
            value = getattr(self, field)
            if not _is_int(value) or value < low:
                raise ValueError(f"{field} must be an int >= {low}, got {value!r}")
        if self.key_format not in KEY_FORMATS:
            raise ValueError(f"key_format must be one of {KEY_FORMATS}, got {self.key_format!r}")
        if self.key_format == "luhn" and self.keys > KEY_SPACE:
            raise ValueError(f"keys must be <= {KEY_SPACE} (distinct 16-digit ids), got {self.keys}")
        if self.seed > MAX_SEED:
            raise ValueError(f"seed must be < 2**63, got {self.seed}")
        for field in ("zipf_s", "hot_share", "cost_ms", "cost_max_ms"):
            value = getattr(self, field)
            if not _is_number(value) or value < 0:
                raise ValueError(f"{field} must be a finite number >= 0, got {value!r}")
            object.__setattr__(self, field, float(value))

        if self.skew not in SKEWS:
            raise ValueError(f"skew must be one of {SKEWS}, got {self.skew!r}")
        if self.skew == "zipf":
            if self.zipf_s <= 0:
                raise ValueError(f"zipf_s must be > 0 with skew='zipf', got {self.zipf_s}")
        elif self.zipf_s != 0:
            raise ValueError(f"zipf_s is only used with skew='zipf' (skew is {self.skew!r}); leave it 0")
        if self.skew == "hotkey":
            if not 0 < self.hot_share < 1:
                raise ValueError(f"hot_share must be in (0, 1) with skew='hotkey', got {self.hot_share}")
            if self.keys < 2:
                raise ValueError(f"keys must be >= 2 with skew='hotkey', got {self.keys}")
        elif self.hot_share != 0:
            raise ValueError(f"hot_share is only used with skew='hotkey' (skew is {self.skew!r}); leave it 0")

        if self.cost not in COSTS:
            raise ValueError(f"cost must be one of {COSTS}, got {self.cost!r}")
        if self.cost == "none":
            if self.cost_ms != 0:
                raise ValueError(f"cost_ms must be 0 with cost='none', got {self.cost_ms}")
        elif self.cost_ms <= 0:
            raise ValueError(f"cost_ms (the mean cost) must be > 0 with cost={self.cost!r}, got {self.cost_ms}")
        if self.cost in ("none", "constant"):
            if self.cost_max_ms != 0:
                raise ValueError(
                    f"cost_max_ms is only used with cost='uniform' or 'longtail' (cost is {self.cost!r}); leave it 0"
                )
        elif self.cost == "uniform":
            if not self.cost_ms <= self.cost_max_ms <= 2 * self.cost_ms:
                raise ValueError(
                    "cost_max_ms must be in [cost_ms, 2*cost_ms] with cost='uniform' (the range is "
                    f"[2*cost_ms - cost_max_ms, cost_max_ms]), got cost_ms={self.cost_ms}, "
                    f"cost_max_ms={self.cost_max_ms}"
                )
        elif self.cost_max_ms <= self.cost_ms:
            raise ValueError(
                f"cost_max_ms (the cap) must be > cost_ms (the mean) with cost='longtail', "
                f"got cost_ms={self.cost_ms}, cost_max_ms={self.cost_max_ms}"
            )

        if not _is_number(self.poison_keys) or not 0 <= self.poison_keys < 1:
            raise ValueError(f"poison_keys must be a finite number in [0, 1), got {self.poison_keys!r}")
        object.__setattr__(self, "poison_keys", float(self.poison_keys))
        if self.poison_keys > 0:
            if self.poison_failures == 0:
                raise ValueError("poison_failures must be >= 1 with poison_keys > 0 (a poisoned key must fail)")
            if round(self.keys * self.poison_keys) == 0:
                raise ValueError(
                    f"poison_keys * keys must round to at least one key, got {self.poison_keys} * {self.keys}"
                )
        elif self.poison_failures != 0:
            raise ValueError(
                f"poison_failures is only used with poison_keys > 0; leave it 0 (got {self.poison_failures})"
            )

    def to_dict(self) -> dict[str, Any]:
        """The fields, for ``_workload.json``."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Workload:
        """Inverse of :meth:`to_dict`; unknown fields are an error, missing
        ones take their defaults (so a ``_workload.json`` written before a
        field existed still loads)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown Workload fields: {unknown}")
        return cls(**data)

    def replace(self, **changes: Any) -> Workload:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)


# -- named workloads -----------------------------------------------------------

_SMS = Workload("sms", 100_000, 8, 10_000, skew="zipf", zipf_s=0.5, body_size=64, cost="constant", cost_ms=1.0)
_NOOP = Workload("noop", 1_000_000, 8, 10_000, skew="uniform", body_size=16)
_HOTKEY = Workload("hotkey", 100_000, 8, 10_000, skew="hotkey", hot_share=0.3, cost="constant", cost_ms=1.0)
_ZIPF11 = Workload("zipf11", 100_000, 8, 10_000, skew="zipf", zipf_s=1.1, cost="constant", cost_ms=1.0)
_PC_BENCH = Workload("pc-bench", 10_000, 1, 10_000, skew="uniform", cost="uniform", cost_ms=2.5, cost_max_ms=5.0)
#: ``sms`` with 0.1 % of the keys failing twice per message (issue 5).  At
#: seed 42 the 10 poisoned ranks (377, 664, 2471, 2700, 5000, 6173, 6422,
#: 6470, 6477, 9761; none of the hottest) hold 83 of the 100,000 generated
#: messages, the busiest key 20 (ranks 377 and 664) and the busiest queue 27;
#: at 2 x 1 s per message a KEY_ORDERLY run lasts at least 40 s and the
#: baseline's busiest queue stalls at least 54 s.  ``poison-small``: 11
#: messages, busiest key 4, busiest queue 4.
_POISON = _SMS.replace(name="poison", poison_keys=0.001, poison_failures=2)
#: ``sms`` with sequential key strings (``acct-0`` hottest), issue 17.
_SMS_SEQ = _SMS.replace(name="sms-seq", key_format="sequential")
#: Few keys, long awaited I/O: the hot-key bound, not the lanes, limits a run
#: (issue 17's "share of the hot-key bound").
_IO5 = Workload("io5", 2_000, 4, 100, skew="uniform", cost="constant", cost_ms=5.0)
#: A steep skew over many keys at 1 ms (issue 17).
_IO1 = Workload("io1", 20_000, 8, 10_000, skew="zipf", zipf_s=1.1, cost="constant", cost_ms=1.0)

#: The named workloads; ``*-small`` variants run in seconds to a minute per mode.
WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        _SMS,
        _NOOP,
        _HOTKEY,
        _ZIPF11,
        _PC_BENCH,
        _POISON,
        _SMS_SEQ,
        _IO5,
        _IO1,
        _SMS.replace(name="sms-small", messages=20_000),
        #: the asyncio executor's target shape (issue 7: 1,024 lanes, 1 ms awaited)
        _SMS.replace(name="sms-60k", messages=60_000),
        _SMS_SEQ.replace(name="sms-seq-small", messages=20_000),
        #: ``sms`` ten times longer, for runs at 100,000+ msg/s (issue 7)
        _SMS.replace(name="sms-1m", messages=1_000_000),
        _NOOP.replace(name="noop-small", messages=100_000),
        _HOTKEY.replace(name="hotkey-small", messages=20_000),
        _ZIPF11.replace(name="zipf11-small", messages=20_000),
        _PC_BENCH.replace(name="pc-bench-small", messages=2_000),
        _POISON.replace(name="poison-small", messages=20_000),
    )
}


def get_workload(name: str) -> Workload:
    """The named workload; ``KeyError`` listing the names if unknown."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}") from None


# -- keys ------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _keys_cached(count: int, seed: int, key_format: str) -> tuple[str, ...]:
    return tuple(key_string(r, seed, key_format) for r in range(count))


def keys_for(workload: Workload) -> tuple[str, ...]:
    """All key strings of ``workload``, indexed by rank (cached); the
    generator's keys (``gen_load`` broadcasts this table)."""
    return _keys_cached(workload.keys, workload.seed, workload.key_format)


def queue_of(key: str, queues: int) -> int:
    """The queue the embedded broker sends ``key`` to:
    ``floorMod(String.hashCode(key), queues)`` (RocketMQ's hash selector with
    a non-negative modulo; lite_push's ``lane_of``)."""
    return lane_of(key, queues)


# -- poisoned keys -----------------------------------------------------------------

_POISON_PERSON = b"lite-push-poison"  # BLAKE2b personalisation: its own stream


@lru_cache(maxsize=16)
def _poisoned_cached(keys: int, count: int, seed: int) -> frozenset[int]:
    seed_key = seed.to_bytes(8, "little", signed=False)
    chosen: set[int] = set()
    i = 0
    while len(chosen) < count:
        digest = hashlib.blake2b(i.to_bytes(8, "little"), digest_size=8, key=seed_key, person=_POISON_PERSON)
        chosen.add((int.from_bytes(digest.digest(), "little") * keys) >> 64)
        i += 1
    return frozenset(chosen)


def poisoned_ranks(workload: Workload) -> frozenset[int]:
    """The poisoned key ranks of ``workload``: exactly
    ``round(keys * poison_keys)`` of them (Python's ``round``; empty when
    ``poison_keys`` is 0).

    Deterministic from ``seed`` alone (and ``keys``): for ``i = 0, 1, 2, ...``
    draw ``h_i``, the 64-bit little-endian BLAKE2b digest of ``i`` (8 bytes,
    little-endian) keyed with the seed (8 bytes, little-endian) and
    personalised ``b"lite-push-poison"``; the rank is ``(h_i * keys) >> 64``;
    keep the first ``round(keys * poison_keys)`` distinct ranks.  This is a
    uniform sample without replacement that ignores key frequency (rank 0,
    the hottest key, is as likely as any other), costs about one hash per
    poisoned key when the share is small, and does not depend on the Python
    version (unlike :mod:`random`)."""
    count = round(workload.keys * workload.poison_keys)
    if count == 0:
        return frozenset()
    return _poisoned_cached(workload.keys, count, workload.seed)


def poisoned_share(workload: Workload) -> float:
    """The expected share of the messages that belong to poisoned keys (the
    key pmf summed over :func:`poisoned_ranks`)."""
    pmf = key_pmf(workload)
    return math.fsum(pmf[r] for r in poisoned_ranks(workload))


# -- distributions -----------------------------------------------------------------


@lru_cache(maxsize=16)
def _pmf_cached(skew: str, keys: int, zipf_s: float, hot_share: float) -> tuple[float, ...]:
    if skew == "uniform":
        return (1.0 / keys,) * keys
    if skew == "hotkey":
        rest = (1.0 - hot_share) / (keys - 1)
        return (hot_share,) + (rest,) * (keys - 1)
    weights = [k**-zipf_s for k in range(1, keys + 1)]
    total = math.fsum(weights)
    return tuple(w / total for w in weights)


def key_pmf(workload: Workload) -> tuple[float, ...]:
    """The exact probability of each key rank (rank 0 first).  For Zipf it is
    ``(r+1)**-s / sum(k**-s for k in 1..keys)``, normalised with ``fsum``."""
    return _pmf_cached(workload.skew, workload.keys, workload.zipf_s, workload.hot_share)


def cost_range_us(workload: Workload) -> tuple[int, int]:
    """``(low, high)`` bounds of the generated ``cost_us`` (inclusive)."""
    if workload.cost == "none":
        return 0, 0
    if workload.cost == "constant":
        c = round(workload.cost_ms * 1000)
        return c, c
    if workload.cost == "uniform":
        return round((2 * workload.cost_ms - workload.cost_max_ms) * 1000), round(workload.cost_max_ms * 1000)
    return 0, round(workload.cost_max_ms * 1000)


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _capped_lognormal_mean(mu: float, sigma: float, cap: float) -> float:
    """``E[min(X, cap)]`` for ``X = exp(mu + sigma*Z)``."""
    lc = math.log(cap)
    return math.exp(mu + sigma * sigma / 2) * _phi((lc - mu - sigma * sigma) / sigma) + cap * (
        1 - _phi((lc - mu) / sigma)
    )


@lru_cache(maxsize=64)
def _solve_mu(mean: float, cap: float, sigma: float) -> float:
    lo, hi = math.log(mean) - 60.0, math.log(cap) + 60.0
    for _ in range(200):  # the capped mean is increasing in mu
        mid = (lo + hi) / 2
        if _capped_lognormal_mean(mid, sigma, cap) < mean:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def longtail_mu(workload: Workload) -> float:
    """μ of the ``longtail`` cost (ln of milliseconds): the lognormal
    ``exp(μ + σZ)``, σ = ``LONGTAIL_SIGMA``, capped at ``cost_max_ms``, has
    mean exactly ``cost_ms``."""
    if workload.cost != "longtail":
        raise ValueError(f"cost is {workload.cost!r}, not 'longtail'")
    return _solve_mu(workload.cost_ms, workload.cost_max_ms, LONGTAIL_SIGMA)


def mean_cost_ms(workload: Workload) -> float:
    """The expected per-message cost in milliseconds (0 for ``none``), as
    generated (microsecond rounding included for constant and uniform)."""
    if workload.cost == "longtail":
        return workload.cost_ms
    low, high = cost_range_us(workload)
    return (low + high) / 2000.0


# -- the skew bound ---------------------------------------------------------------


def queue_shares(workload: Workload) -> list[float]:
    """The exact expected share of messages of each queue: the key pmf summed
    over the queue each key is sent to (:func:`queue_of`)."""
    shares = [0.0] * workload.queues
    if workload.queues == 1:
        return [1.0]
    for key, p in zip(keys_for(workload), key_pmf(workload), strict=True):
        shares[queue_of(key, workload.queues)] += p
    return shares


def ceiling_ratio(top_share: float, heaviest_queue_share: float) -> float:
    """``heaviest_queue_share / top_share`` (see :func:`hot_key_bound`),
    never below 1."""
    if not 0 < top_share <= 1 or not 0 < heaviest_queue_share <= 1:
        raise ValueError(f"shares must be in (0, 1], got {top_share}, {heaviest_queue_share}")
    return max(1.0, heaviest_queue_share / top_share)


@dataclass(frozen=True)
class SkewBound:
    """What a workload's skew allows; see :func:`hot_key_bound`."""

    #: p: the hottest key's expected share of all messages.
    top_share: float
    #: q: the most loaded queue's expected share (>= p, >= 1/queues).
    heaviest_queue_share: float
    #: The largest possible speed-up of a key-ordered consumer over the
    #: queue-ordered baseline, both at their ideal: ``max(1, q / p)``.
    ceiling_ratio: float
    #: c: mean per-message cost in ms.
    mean_cost_ms: float
    #: 1 / (p*c): no key-ordered consumer is faster (msg/s; inf when c = 0).
    key_ordered_max_rate: float
    #: 1 / (q*c): the queue-ordered baseline is no faster (msg/s; inf when c = 0).
    baseline_max_rate: float


def skew_bound(workload: Workload) -> SkewBound:
    """The full bound behind :func:`hot_key_bound`."""
    pmf = key_pmf(workload)
    p = max(pmf)
    q = max(queue_shares(workload))
    c = mean_cost_ms(workload) / 1000.0
    inf = float("inf")
    return SkewBound(
        top_share=p,
        heaviest_queue_share=q,
        ceiling_ratio=ceiling_ratio(p, q),
        mean_cost_ms=c * 1000.0,
        key_ordered_max_rate=1 / (p * c) if c > 0 else inf,
        baseline_max_rate=1 / (q * c) if c > 0 else inf,
    )


def hot_key_bound(workload: Workload) -> tuple[float, float]:
    """``(top_share, ceiling_ratio)``: the hottest key's expected share of the
    messages, and the ceiling on any key-ordered consumer's speed-up over the
    queue-ordered baseline that skew imposes.

    Let ``N`` messages have mean cost ``c`` and let the hottest key carry a
    share ``p`` of them (exact, from :func:`key_pmf`).  A key's messages run
    one after another, so any key-ordered consumer needs at least ``N·p·c``:
    its throughput is at most ``1/(p·c)``, however many lanes it has.

    The baseline runs at most ``queues`` messages at a time (one per queue),
    so its throughput is at most ``queues/c``.  Dividing, ``1/(p·queues)``;
    but that assumes balanced queues, which a hot key contradicts: the queue
    holding the hot key also serialises everything else hashed to it.  With
    ``q`` the most loaded queue's share (exact, from :func:`queue_shares`, the
    key pmf summed per ``queue_of(key)``) the baseline needs at least
    ``N·q·c``, so it runs at most ``1/(q·c)`` (which is ≤ ``queues/c``, as
    ``q ≥ 1/queues``).  The ceiling ratio is therefore ``q/p`` — equal to
    ``1/(p·queues)`` for balanced queues and never below 1 (``q ≥ p``).

    Worked example (``hotkey``): p = 0.30 and the hot key's queue also gets
    about 1/8 of the other 70 %, q ≈ 0.30 + 0.70/8 ≈ 0.39, ceiling ≈ 1.3×
    (exactly 1.30 with the seed-42 keys), where ``1/(p·queues)`` would
    say 0.42.  ``zipf11``: p ≈ 0.151, q ≈ 0.224, ceiling ≈ 1.48×.  ``sms``:
    p ≈ 0.0050, q ≈ 0.135, ceiling ≈ 27×.  The ratio compares both consumers at their
    ideal; a baseline running below its ideal makes a larger measured ratio
    possible, so report throughput against ``1/(p·c)`` too (:func:`skew_bound`).
    """
    bound = skew_bound(workload)
    return bound.top_share, bound.ceiling_ratio
