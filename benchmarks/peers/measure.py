"""One run's row: its rate, its share of the hot-key bound, its latency and
its delivery check, from the runner's OUT.json and what its group committed.

* ``rate``: the distinct ``seq`` handled over the seconds from the start of
  the peer's first call to the end of its last call: a consumer's
  throughput once it consumes.  Connecting and joining the group come
  before (3 s for quixstreams' replicas on the delayed cluster, as for any
  fresh group on a Kafka broker with its default initial rebalance delay)
  and are not throughput; they are ``first_call_ms``.  A capped run's rate
  is over what it handled.
* ``first_call_ms``: from ``t0`` (just before the peer's client was made)
  to the start of its first call (the table's "start ms").
* ``of_bound``: ``rate`` over the topic's hot-key bound
  (``partition.hot_key_rate`` of all its messages: a capped run covered
  fewer, whose own bound is about the same for these uniform shapes).
* ``p99_ms``: the 99th percentile, over the handled messages, of the time
  from when the message was there for this consumer to the end of its first
  call.  The topic is filled once before the first consumer runs, so a
  message is "there" at ``max(its send time, the run's t0)`` (both wall
  clock; a call's end is ``end_ns + wall_minus_perf_ns``): with a backlog,
  mostly how long the message waited in it, i.e. about 99 % of the run for
  a consumer that drains in offset order, less for one that runs keys
  unevenly.  It is comparable between peers, not a latency under load.
* ``lost``: messages the group's commit took as done (``acked``, see
  ``committed.py``) that were never handled; a run that was neither capped
  nor failed must also have handled every message (each one it did not is
  lost).  ``None`` when the commit could not be read.
* ``duplicates``, ``order_violations``, ``overlaps``: ``bench_kafka.check``'s
  (calls beyond the first per ``seq``; per key, first deliveries out of
  ``seq`` order, which is offset order within the key's partition; per key,
  a call that started before an earlier one of that key ended).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench_kafka import check

from .loading import Placement

__all__ = ["lost_count", "measure", "p99_ms"]


def lost_count(handled: bytearray, acked: bytearray | None, complete: bool) -> int | None:
    """Messages ``acked`` but not ``handled``; with ``complete``, every
    message not handled.  None when ``acked`` is unknown and the run was not
    complete."""
    if complete:
        return len(handled) - sum(handled)
    if acked is None:
        return None
    return sum(1 for h, a in zip(handled, acked, strict=True) if a and not h)


def p99_ms(
    seqs: Sequence[int], ends: Sequence[int], wall_minus_perf_ns: int, t0_ns: int, sent_ns: Sequence[int]
) -> float | None:
    """See the module docstring; None without calls."""
    t0_wall = t0_ns + wall_minus_perf_ns
    first_end: dict[int, int] = {}
    total = len(sent_ns)
    for seq, end in zip(seqs, ends, strict=True):
        if 0 <= seq < total and seq not in first_end:
            first_end[seq] = end
    if not first_end:
        return None
    waits = sorted(end + wall_minus_perf_ns - max(sent_ns[seq], t0_wall) for seq, end in first_end.items())
    return waits[min(len(waits) - 1, int(0.99 * len(waits)))] / 1e6


def measure(
    peer: str,
    data: dict[str, Any] | None,
    error: str | None,
    keys: Sequence[str],
    placed: Placement,
    acked: bytearray | None,
    hot_rate: float,
) -> dict[str, Any]:
    """One run's row (see the module docstring); ``data`` is OUT.json's,
    ``error`` the run's (its own, or the runner's crash)."""
    row: dict[str, Any] = {"peer": peer, "error": error}
    if data is None:
        return row | {"rate": 0.0, "of_bound": 0.0, "handled": 0, "calls": 0, "capped": False, "config": {}}
    seqs, starts, ends = data["seq"], data["start_ns"], data["end_ns"]
    total = len(keys)
    result = check(keys, seqs, starts, ends)
    handled = bytearray(total)
    for seq in seqs:
        if 0 <= seq < total:
            handled[seq] = 1
    distinct = sum(handled)
    seconds = max(1, max(ends) - min(starts)) / 1e9 if ends else float("nan")  # 1 ns at least
    rate = distinct / seconds if ends else 0.0
    capped = bool(data.get("capped"))
    return row | {
        "rate": rate,
        "of_bound": rate / hot_rate,
        "seconds": seconds,
        "handled": distinct,
        "calls": len(seqs),
        "first_call_ms": (min(starts) - data["t0_ns"]) / 1e6 if starts else None,
        "p99_ms": p99_ms(seqs, ends, data["wall_minus_perf_ns"], data["t0_ns"], placed.sent_ns),
        "cpu_s": data.get("cpu_s"),
        "peak_rss_mb": data["peak_rss_kb"] / 1024 if data.get("peak_rss_kb") else None,
        "capped": capped,
        "lost": lost_count(handled, acked, complete=not capped and error is None),
        # how many messages the group's commit covers (a peer that never commits: 0)
        "committed": sum(acked) if acked is not None else None,
        "duplicates": result.duplicates,
        "order_violations": result.order_violations,
        "overlaps": result.overlaps,
        "config": data.get("config", {}),
    }
