"""Queue allocation strategies: which of a topic's queues one group member owns.

A strategy is a pure function of ``(consumer_group, current_cid, mq_all,
cid_all)``.  Every member of a group computes its own share from the same
inputs, so the shares fit together only if every member sees the same sorted
queue list and the same sorted client-id list, and uses the same strategy.
Strategies sort their inputs themselves (RocketMQ's caller sorts; sorting
again is cheap and makes the functions safe to call with any order).

Adding a strategy: write the plain function, then
``NAME = register("RocketMQName", function)``; it is then listed in
:data:`STRATEGIES` and found by :func:`get_strategy`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from .._types import MessageQueue

__all__ = ["AVERAGELY", "STRATEGIES", "AllocateStrategy", "allocate_averagely", "get_strategy", "register"]

logger = logging.getLogger(__name__)

AllocateFn = Callable[[str, str, Sequence[MessageQueue], Sequence[str]], list[MessageQueue]]


@runtime_checkable
class AllocateStrategy(Protocol):
    """An allocation strategy: callable like :func:`allocate_averagely`, with
    a ``name`` (RocketMQ's ``getName()``)."""

    @property
    def name(self) -> str:
        """The strategy's name, e.g. ``"AVG"``."""
        ...

    def __call__(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        """The queues of ``mq_all`` that ``current_cid`` owns among ``cid_all``."""
        ...


class _NamedStrategy:
    """A plain function with a name; what :func:`register` makes."""

    __slots__ = ("_fn", "_name")

    def __init__(self, name: str, fn: AllocateFn) -> None:
        self._name = name
        self._fn = fn

    @property
    def name(self) -> str:
        return self._name

    def __call__(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        return self._fn(consumer_group, current_cid, mq_all, cid_all)

    @property
    def function(self) -> AllocateFn:
        """The plain function behind the strategy."""
        return self._fn

    def __repr__(self) -> str:
        return f"<AllocateStrategy {self._name}: {self._fn.__name__}>"


#: Every strategy defined here, by name.
STRATEGIES: dict[str, AllocateStrategy] = {}


def register(name: str, fn: AllocateFn) -> AllocateStrategy:
    """Make ``fn`` the strategy called ``name`` and list it in
    :data:`STRATEGIES`.  Raises ``ValueError`` if the name is taken."""
    if not name:
        raise ValueError("an allocation strategy needs a name")
    if name in STRATEGIES:
        raise ValueError(f"allocation strategy {name!r} is already defined")
    s = _NamedStrategy(name, fn)
    STRATEGIES[name] = s
    return s


def get_strategy(name: str) -> AllocateStrategy:
    """The strategy called ``name``; ``ValueError`` listing the known ones
    otherwise."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown allocation strategy {name!r}; known: {sorted(STRATEGIES)}") from None


def _checked(
    consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
) -> tuple[list[MessageQueue], list[str]] | None:
    """RocketMQ's argument checks, shared by the strategies.  Returns the
    sorted inputs, or ``None`` when ``current_cid`` is not a member (its
    share is then empty)."""
    if not current_cid:
        raise ValueError("current_cid is empty: a client id is required to allocate queues")
    if not mq_all:
        raise ValueError(f"mq_all is empty: no queues to allocate for group {consumer_group!r}")
    if not cid_all:
        raise ValueError(f"cid_all is empty: no consumers to allocate to in group {consumer_group!r}")
    cids = sorted(cid_all)
    if current_cid not in cids:
        logger.info(
            "[BUG] consumer group %r: client id %r is not in cid_all %r; it gets no queues",
            consumer_group,
            current_cid,
            cids,
        )
        return None
    return sorted(mq_all), cids


def allocate_averagely(
    consumer_group: str,
    current_cid: str,
    mq_all: Sequence[MessageQueue],
    cid_all: Sequence[str],
) -> list[MessageQueue]:
    """RocketMQ's ``AllocateMessageQueueAveragely``: consecutive runs of the
    sorted queues, as even as possible, the first ``len(mq_all) % len(cid_all)``
    consumers taking one more.  8 queues over 3 consumers: q0-q2, q3-q5,
    q6-q7.  With more consumers than queues, the first consumers get one
    queue each and the rest none.

    Raises ``ValueError`` when ``current_cid``, ``mq_all`` or ``cid_all`` is
    empty (as RocketMQ does); a ``current_cid`` not in ``cid_all`` gets ``[]``.
    """
    checked = _checked(consumer_group, current_cid, mq_all, cid_all)
    if checked is None:
        return []
    mqs, cids = checked
    n_mq, n_cid = len(mqs), len(cids)
    index = cids.index(current_cid)
    mod = n_mq % n_cid
    if n_mq <= n_cid:
        average = 1
    elif mod > 0 and index < mod:
        average = n_mq // n_cid + 1
    else:
        average = n_mq // n_cid
    start = index * average if (mod > 0 and index < mod) else index * average + mod
    count = min(average, n_mq - start)
    return [mqs[(start + i) % n_mq] for i in range(count)]


#: The default strategy (RocketMQ's default too), named as RocketMQ names it.
AVERAGELY: AllocateStrategy = register("AVG", allocate_averagely)
