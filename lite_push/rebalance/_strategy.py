"""What an allocation strategy is, and the registry that finds one by name.

:class:`AllocateStrategy` is the protocol every strategy meets (a callable
with a ``name``); :func:`register` names a plain function as a strategy and
lists it in :data:`STRATEGIES`; :func:`get_strategy` finds one by name.
:func:`checked_inputs` holds RocketMQ's argument checks, which every
strategy in :mod:`lite_push.rebalance.allocate` and
:mod:`lite_push.rebalance.machine_room` applies first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from .._types import MessageQueue

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
        return f"<AllocateStrategy {self._name}: {getattr(self._fn, '__name__', repr(self._fn))}>"


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


#: Strategies that need configuration, by name (or name prefix, for
#: ``MACHINE_ROOM_NEARBY-<inner>``): how to build them.
_NEEDS_CONFIGURATION: dict[str, str] = {
    "CONFIG": "AllocateByConfig(queues): the queues this consumer takes",
    "MACHINE_ROOM": "AllocateByMachineRoom(consumer_idcs): the machine rooms (idc names) this group serves",
    "MACHINE_ROOM_NEARBY": (
        "AllocateMachineRoomNearby(inner_strategy, resolver): a MachineRoomResolver placing queues and "
        "consumers in machine rooms, and the strategy that allocates within a room"
    ),
}


def get_strategy(name: str) -> AllocateStrategy:
    """The strategy called ``name``: ``"AVG"``, ``"AVG_BY_CIRCLE"``,
    ``"CONSISTENT_HASH"`` (the default one: 10 virtual nodes, MD5) or one
    added with :func:`register`.

    ``"CONFIG"``, ``"MACHINE_ROOM"`` and ``"MACHINE_ROOM_NEARBY-..."`` need
    configuration: for them the ``ValueError`` names the class to build and
    what it needs.  Any other unknown name: ``ValueError`` listing the known
    ones."""
    try:
        return STRATEGIES[name]
    except KeyError:
        pass
    base = "MACHINE_ROOM_NEARBY" if isinstance(name, str) and name.startswith("MACHINE_ROOM_NEARBY") else name
    how = _NEEDS_CONFIGURATION.get(base)
    if how is not None:
        raise ValueError(
            f"allocation strategy {name!r} needs configuration and cannot be made from its name; "
            f"build it with {how}, and pass that object instead of the name"
        )
    raise ValueError(f"unknown allocation strategy {name!r}; known: {sorted(STRATEGIES)}")


def add_strategy(strategy: AllocateStrategy) -> AllocateStrategy:
    """List a ready-made strategy object in :data:`STRATEGIES` under its name."""
    if strategy.name in STRATEGIES:
        raise ValueError(f"allocation strategy {strategy.name!r} is already defined")
    STRATEGIES[strategy.name] = strategy
    return strategy


def checked_inputs(
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
