"""The grid's shapes: which messages every peer consumes.

* ``kpipe-1ms``, ``kpipe-10ms``, ``kpipe-100ms``: KPipe's published grid
  (8 partitions, 1,000 keys, each message's key drawn uniformly from the
  1,000, a constant 1 / 10 / 100 ms of I/O per message);
* ``io5`` (100 uniform keys, 4 partitions, 5 ms) and ``io1`` (10,000 keys,
  Zipf s = 1.1, 8 partitions, 1 ms): ``bench_kafka.py``'s shapes
  (``workloads.py``), longer.

Keys and costs by ``seq`` come from the generator's functions
(``redraw.draw``, as ``bench_kafka.py`` draws them), so the first messages
of a longer ``io5`` are ``bench_kafka.py``'s ``io5``.  The message counts are
chosen for about 10 s of lite_push (the fastest consumer) on this 2-core
machine (it ran at 30-45k msg/s on ``kpipe-1ms``, 22-40k on ``kpipe-10ms``,
7.2k on ``kpipe-100ms``, 14.7k on ``io5``, 5.2k on ``io1``); slower peers are
stopped by the orchestrator's ``--cap``.  The hot-key bound of a shape
depends a little on its message count (the hottest key's share shrinks
towards ``1 / keys`` as the count grows): ``io5`` at 150,000 messages is
about 18,000 msg/s where ``bench_kafka.py``'s 2,000 gave 11,111.
"""

from __future__ import annotations

from dataclasses import dataclass

from partition import hot_key_rate
from redraw import draw
from workloads import Workload, get_workload

__all__ = ["SHAPES", "Messages", "messages_of"]


def _kpipe(ms: int, messages: int) -> Workload:
    return Workload(
        f"kpipe-{ms}ms", messages, 8, 1000, skew="uniform", cost="constant", cost_ms=float(ms), body_size=64
    )


#: The shapes by name, at their default message counts.
SHAPES: dict[str, Workload] = {
    w.name: w
    for w in (
        _kpipe(1, 400_000),
        _kpipe(10, 300_000),
        _kpipe(100, 90_000),
        get_workload("io5").replace(messages=150_000),
        get_workload("io1").replace(messages=60_000),
    )
}


@dataclass(frozen=True)
class Messages:
    """One shape's messages: ``keys[seq]``, ``costs_us[seq]``, and the
    hot-key bound over all of them (``partition.hot_key_rate``)."""

    workload: Workload
    keys: list[str]
    costs_us: list[int]
    hot_key_rate: float

    @property
    def name(self) -> str:
        return self.workload.name


def messages_of(name: str, count: int | None = None) -> Messages:
    """The messages of shape ``name`` (``count`` of them when given)."""
    try:
        workload = SHAPES[name]
    except KeyError:
        raise SystemExit(f"unknown shape {name!r}; known: {', '.join(SHAPES)}") from None
    if count is not None:
        workload = workload.replace(messages=count)
    keys, costs = draw(workload)
    return Messages(workload, keys, costs, hot_key_rate(keys, costs))
