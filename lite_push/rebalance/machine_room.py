"""The machine-room strategies: RocketMQ's ``AllocateMachineRoomNearby``
and ``AllocateMessageQueueByMachineRoom``, which allocate by the machine room
(idc) a queue's broker and a consumer are in."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from .._types import MessageQueue
from ._strategy import AllocateStrategy, checked_inputs

__all__ = ["AllocateByMachineRoom", "AllocateMachineRoomNearby", "MachineRoomResolver"]

# --------------------------------------------------------------------------
# By machine room


def _idc_of(broker_name: str) -> str | None:
    """The machine room (idc) of a broker named ``"idc@broker"``, or ``None``
    when the name is not of that form.  Follows RocketMQ's
    ``brokerName.split("@")`` with its length-2 test, including Java's
    dropping of trailing empty strings (so ``"idc@broker@"`` counts and
    ``"idc@"`` does not)."""
    parts = broker_name.split("@")
    while len(parts) > 1 and not parts[-1]:
        parts.pop()
    return parts[0] if len(parts) == 2 else None


class AllocateByMachineRoom:
    """RocketMQ's ``AllocateMessageQueueByMachineRoom`` (``"MACHINE_ROOM"``).

    Only queues of brokers named ``"<idc>@<broker>"`` with ``<idc>`` in
    ``consumer_idcs`` are allocated; other queues are left to no one.  Of
    those ``p`` queues (in sorted order) over ``n`` consumers, RocketMQ's
    arithmetic: ``mod, rem = divmod(p, n)``; the consumer at index ``i``
    takes the block ``[i * mod, i * mod + mod)`` and, if ``i < rem``, also
    the leftover queue ``i + mod * n``.  5 queues over 2 consumers: q0 q1
    q4, q2 q3.

    Raises ``TypeError``/``ValueError`` for a ``consumer_idcs`` that is a
    single string, empty, or holds a name that is empty or contains ``"@"``
    (it could match no broker).  When called, the empty arguments
    :func:`allocate_averagely` rejects raise ``ValueError`` here too
    (RocketMQ does not check them in this strategy).
    """

    __slots__ = ("_idcs",)

    def __init__(self, consumer_idcs: Iterable[str]) -> None:
        if isinstance(consumer_idcs, str):
            raise TypeError(f"consumer_idcs must be a collection of idc names, not the string {consumer_idcs!r}")
        idcs = frozenset(consumer_idcs)
        for idc in idcs:
            if not isinstance(idc, str):
                raise TypeError(f"idc names must be strings, got {idc!r}")
            if not idc or "@" in idc:
                raise ValueError(
                    f"bad idc name {idc!r}: brokers are named '<idc>@<broker>', so an idc is non-empty without '@'"
                )
        if not idcs:
            raise ValueError("consumer_idcs is empty: the group would serve no machine room")
        self._idcs = idcs

    @property
    def name(self) -> str:
        return "MACHINE_ROOM"

    @property
    def consumer_idcs(self) -> frozenset[str]:
        """The machine rooms this group serves."""
        return self._idcs

    def serves(self, mq: MessageQueue) -> bool:
        """Whether ``mq`` is on a broker in one of :attr:`consumer_idcs`."""
        return _idc_of(mq.broker_name) in self._idcs

    def __call__(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        checked = checked_inputs(consumer_group, current_cid, mq_all, cid_all)
        if checked is None:
            return []
        mqs, cids = checked
        served = [mq for mq in mqs if self.serves(mq)]
        n, index = len(cids), cids.index(current_cid)
        mod, rem = divmod(len(served), n)
        result = served[index * mod : index * mod + mod]
        if rem > index:
            result.append(served[index + mod * n])
        return result

    def __repr__(self) -> str:
        return f"AllocateByMachineRoom({sorted(self._idcs)!r})"


# --------------------------------------------------------------------------
# Machine room nearby


@runtime_checkable
class MachineRoomResolver(Protocol):
    """Where queues and consumers are deployed, for
    :class:`AllocateMachineRoomNearby` (RocketMQ's
    ``AllocateMachineRoomNearby.MachineRoomResolver``).

    Both methods must return a non-empty room name, and must be pure: every
    member of the group has to get the same answers."""

    def broker_deploy_in(self, mq: MessageQueue) -> str:
        """The machine room of the broker holding ``mq``."""
        ...

    def consumer_deploy_in(self, cid: str) -> str:
        """The machine room of the consumer with client id ``cid``."""
        ...


class AllocateMachineRoomNearby:
    """RocketMQ's ``AllocateMachineRoomNearby``
    (``"MACHINE_ROOM_NEARBY-" + strategy.name``): a wrapper that keeps
    consumers on the queues of their own machine room.

    The queues and the consumers are grouped by room with ``resolver``.  The
    queues of a room that has consumers are allocated among that room's
    consumers only, with ``strategy``; the queues of each room with no
    consumer are allocated among all consumers, again with ``strategy``.  A
    consumer's share is its part of its own room's queues followed by its
    parts of the consumer-less rooms' queues, rooms in sorted order.

    If ``strategy`` hands every queue of its input to exactly one of its
    consumers (AVG, AVG_BY_CIRCLE, CONSISTENT_HASH do) and ``resolver`` is
    pure, the shares of all members partition all the queues, with no
    condition on the rooms.

    Raises ``TypeError`` at construction when ``strategy`` or ``resolver``
    lacks what it needs, and ``ValueError`` when called if the resolver gives
    an empty room for a queue or a consumer (as RocketMQ does), or for the
    empty arguments :func:`allocate_averagely` rejects.
    """

    __slots__ = ("_resolver", "_strategy")

    def __init__(self, strategy: AllocateStrategy, resolver: MachineRoomResolver) -> None:
        if not isinstance(strategy, AllocateStrategy):
            raise TypeError(f"strategy must be an allocation strategy (callable, with a name), got {strategy!r}")
        if not isinstance(resolver, MachineRoomResolver):
            raise TypeError(
                f"resolver must have broker_deploy_in(mq) and consumer_deploy_in(cid) methods, got {resolver!r}"
            )
        self._strategy = strategy
        self._resolver = resolver

    @property
    def name(self) -> str:
        return f"MACHINE_ROOM_NEARBY-{self._strategy.name}"

    @property
    def strategy(self) -> AllocateStrategy:
        """The strategy that allocates within a room."""
        return self._strategy

    @property
    def resolver(self) -> MachineRoomResolver:
        return self._resolver

    @staticmethod
    def _room(room: object, what: str) -> str:
        if not isinstance(room, str) or not room:
            raise ValueError(f"machine room is empty for {what}: the resolver returned {room!r}")
        return room

    def __call__(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        checked = checked_inputs(consumer_group, current_cid, mq_all, cid_all)
        if checked is None:
            return []
        mqs, cids = checked
        queues_in: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            queues_in.setdefault(self._room(self._resolver.broker_deploy_in(mq), f"queue {mq}"), []).append(mq)
        consumers_in: dict[str, list[str]] = {}
        for cid in cids:
            room = self._room(self._resolver.consumer_deploy_in(cid), f"consumer {cid!r}")
            consumers_in.setdefault(room, []).append(cid)

        result: list[MessageQueue] = []
        here = self._room(self._resolver.consumer_deploy_in(current_cid), f"consumer {current_cid!r}")
        local = queues_in.pop(here, None)
        if local:
            result.extend(self._strategy(consumer_group, current_cid, local, consumers_in[here]))
        for room in sorted(queues_in):
            if room not in consumers_in:  # no consumer there: everyone shares its queues
                result.extend(self._strategy(consumer_group, current_cid, queues_in[room], cids))
        return result

    def __repr__(self) -> str:
        return f"AllocateMachineRoomNearby({self._strategy!r}, {self._resolver!r})"
