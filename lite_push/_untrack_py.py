"""Pure-Python twin of ``lite_push._untrack_c``: :func:`untracked` returns
its argument unchanged (Python cannot take an object out of the cyclic
garbage collector's lists; the compiled twin does).

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

from typing import TypeVar

__all__ = ["untracked"]

T = TypeVar("T")


def untracked(obj: T) -> T:
    """``obj`` itself (the compiled twin untracks it; see the module)."""
    return obj
