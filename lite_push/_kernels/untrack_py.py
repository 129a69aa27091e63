"""Pure-Python twin of ``lite_push._kernels.untrack_c``: :func:`untrack_all` leaves
its objects as they are (Python cannot take an object out of the cyclic
garbage collector's lists; the compiled twin does, a batch in one pass).

Why the compiled one does it: a consumer holds every message it polled and
has not finished -- thousands, with a backlog -- and each is a tracked
container (a slotted dataclass), so every full collection walks all of
them, and a full collection comes every few hundred thousand allocations.
A message cannot be part of a reference cycle (its fields are strings,
numbers, bytes and a dict of strings), so nothing is lost by leaving it to
its reference count alone.  Measured in ``benchmarks/RESULTS.md`` (issue
31): on the Kafka source with 40,000 messages in flight, full collections
took about a fifth of the consumer's CPU.
"""

from __future__ import annotations

from typing import Any

__all__ = ["untrack_all"]


def untrack_all(objs: list[Any]) -> None:
    """Nothing (the compiled twin untracks ``objs``; see the module)."""
