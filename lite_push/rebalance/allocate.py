"""Queue allocation strategies: which of a topic's queues one group member owns.

A strategy is a pure function of ``(consumer_group, current_cid, mq_all,
cid_all)``.  Every member of a group computes its own share from the same
inputs, so the shares fit together only if every member sees the same sorted
queue list and the same sorted client-id list, and uses the same strategy.
Strategies sort their inputs themselves (RocketMQ's caller sorts; sorting
again is cheap and makes the functions safe to call with any order).

RocketMQ's six strategies, under RocketMQ's names (``getName()``):

================================  ==========================================
``"AVG"``                         :data:`AVERAGELY` (:func:`allocate_averagely`)
``"AVG_BY_CIRCLE"``               :data:`AVERAGELY_BY_CIRCLE`
                                  (:func:`allocate_averagely_by_circle`)
``"CONSISTENT_HASH"``             :class:`AllocateConsistentHash`;
                                  :data:`CONSISTENT_HASH` is the default one
                                  (10 virtual nodes, MD5)
``"CONFIG"``                      ``AllocateByConfig(queues)``
``"MACHINE_ROOM"``                ``AllocateByMachineRoom(consumer_idcs)``
``"MACHINE_ROOM_NEARBY-<inner>"`` ``AllocateMachineRoomNearby(inner, resolver)``
================================  ==========================================

The last three need configuration, so :func:`get_strategy` cannot make them
from a name: it raises a ``ValueError`` that says how to build them.  Build
one and pass the object wherever a strategy is taken.

Adding a strategy: write the plain function, then
``NAME = register("RocketMQName", function)``; it is then listed in
:data:`STRATEGIES` and found by :func:`get_strategy`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, runtime_checkable

from .._types import MessageQueue
from ._hash_ring import HashFunction, HashRing, md5_hash

__all__ = [
    "AVERAGELY",
    "AVERAGELY_BY_CIRCLE",
    "CONSISTENT_HASH",
    "STRATEGIES",
    "AllocateByConfig",
    "AllocateByMachineRoom",
    "AllocateConsistentHash",
    "AllocateMachineRoomNearby",
    "AllocateStrategy",
    "HashFunction",
    "MachineRoomResolver",
    "allocate_all",
    "allocate_averagely",
    "allocate_averagely_by_circle",
    "get_strategy",
    "md5_hash",
    "message_queue_key",
    "register",
]

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


def _add(strategy: AllocateStrategy) -> AllocateStrategy:
    """List a ready-made strategy object in :data:`STRATEGIES` under its name."""
    if strategy.name in STRATEGIES:
        raise ValueError(f"allocation strategy {strategy.name!r} is already defined")
    STRATEGIES[strategy.name] = strategy
    return strategy


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


def allocate_all(
    strategy: AllocateStrategy | AllocateFn,
    consumer_group: str,
    mq_all: Sequence[MessageQueue],
    cid_all: Sequence[str],
) -> dict[str, list[MessageQueue]]:
    """Every member's share under ``strategy``, as the members compute them:
    ``{cid: strategy(consumer_group, cid, mq_all, cid_all)}`` for each
    distinct client id, in sorted order.  For checking and debugging an
    allocation; the runtime only ever computes its own share."""
    return {cid: list(strategy(consumer_group, cid, mq_all, cid_all)) for cid in sorted(set(cid_all))}


def allocate_averagely_by_circle(
    consumer_group: str,
    current_cid: str,
    mq_all: Sequence[MessageQueue],
    cid_all: Sequence[str],
) -> list[MessageQueue]:
    """RocketMQ's ``AllocateMessageQueueAveragelyByCircle``: the sorted
    queues dealt out like cards, queue ``i`` to the consumer at index
    ``i % len(cid_all)`` of the sorted client ids.  8 queues over 3
    consumers: q0 q3 q6, q1 q4 q7, q2 q5.  With more consumers than queues,
    the first consumers get one queue each and the rest none.

    Argument checks as :func:`allocate_averagely`.
    """
    checked = _checked(consumer_group, current_cid, mq_all, cid_all)
    if checked is None:
        return []
    mqs, cids = checked
    return mqs[cids.index(current_cid) :: len(cids)]


#: RocketMQ's ``AllocateMessageQueueAveragelyByCircle``.
AVERAGELY_BY_CIRCLE: AllocateStrategy = register("AVG_BY_CIRCLE", allocate_averagely_by_circle)


# --------------------------------------------------------------------------
# Consistent hash


def message_queue_key(mq: MessageQueue) -> str:
    """The key :class:`AllocateConsistentHash` hashes a queue by: RocketMQ's
    ``MessageQueue.toString()``, ``"MessageQueue [topic=T, brokerName=b,
    queueId=3]"``, so that a queue lands on the same point of the ring as it
    does in a RocketMQ client.  (``str(mq)``, ``"T@b#3"``, is lite_push's
    short display form and is not used for hashing.)"""
    return f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"


class AllocateConsistentHash:
    """RocketMQ's ``AllocateMessageQueueConsistentHash`` (``"CONSISTENT_HASH"``).

    Each client id gets ``virtual_node_count`` points on a hash ring, at the
    hashes of ``"<cid>-0"``, ``"<cid>-1"``, ...; a queue belongs to the
    client of the first point at or after the hash of
    :func:`message_queue_key` ``(mq)``, wrapping around.  The hash is
    ``hash_function`` (``str -> int``), by default :func:`md5_hash`
    (RocketMQ's ``MD5Hash``: the first 4 bytes of the MD5 digest, big-endian,
    unsigned).  Client ids are put on the ring in sorted order; should two
    points collide, the later client id takes the point (as RocketMQ's
    ``TreeMap.put`` does with its sorted ``cidAll``).

    The point of it: when a consumer joins, the only queues that move are
    those the newcomer now owns, and when one leaves, only its own queues
    move; every other queue stays where it was.  The shares are uneven,
    though (about ``1/n`` each in expectation, not exactly).

    ``AllocateConsistentHash()`` is RocketMQ's default configuration and is
    what ``get_strategy("CONSISTENT_HASH")`` returns (:data:`CONSISTENT_HASH`).
    Every member of a group must use the same ``virtual_node_count`` and hash
    function.

    Raises ``ValueError`` for a ``virtual_node_count`` below 1 (RocketMQ
    accepts 0, and then allocates no queue to anyone) and, when called,
    for the empty arguments :func:`allocate_averagely` rejects.
    """

    __slots__ = ("_hash_function", "_virtual_node_count")

    def __init__(self, virtual_node_count: int = 10, hash_function: HashFunction | None = None) -> None:
        if isinstance(virtual_node_count, bool) or not isinstance(virtual_node_count, int):
            raise TypeError(f"virtual_node_count must be an int, got {virtual_node_count!r}")
        if virtual_node_count < 1:
            raise ValueError(
                f"virtual_node_count must be at least 1, got {virtual_node_count}: "
                "with no virtual nodes the ring is empty and no queue is allocated"
            )
        if hash_function is not None and not callable(hash_function):
            raise TypeError(f"hash_function must be a callable str -> int, got {hash_function!r}")
        self._virtual_node_count = virtual_node_count
        self._hash_function: HashFunction = md5_hash if hash_function is None else hash_function

    @property
    def name(self) -> str:
        return "CONSISTENT_HASH"

    @property
    def virtual_node_count(self) -> int:
        """Points on the ring per client id."""
        return self._virtual_node_count

    @property
    def hash_function(self) -> HashFunction:
        """The ring hash (:func:`md5_hash` unless another was given)."""
        return self._hash_function

    def ring(self, cid_all: Iterable[str]) -> HashRing:
        """The ring the members of ``cid_all`` are placed on."""
        return HashRing(sorted(cid_all), self._virtual_node_count, self._hash_function)

    def __call__(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        checked = _checked(consumer_group, current_cid, mq_all, cid_all)
        if checked is None:
            return []
        mqs, cids = checked
        ring = self.ring(cids)
        return [mq for mq in mqs if ring.route(message_queue_key(mq)) == current_cid]

    def __repr__(self) -> str:
        return (
            f"AllocateConsistentHash(virtual_node_count={self._virtual_node_count}, "
            f"hash_function={getattr(self._hash_function, '__name__', self._hash_function)!s})"
        )


#: The default consistent-hash strategy: 10 virtual nodes per client, MD5.
CONSISTENT_HASH: AllocateStrategy = _add(AllocateConsistentHash())


# --------------------------------------------------------------------------
# By configuration


class AllocateByConfig:
    """RocketMQ's ``AllocateMessageQueueByConfig`` (``"CONFIG"``): this
    consumer takes exactly ``queues``, whatever the arguments.

    As in RocketMQ, nothing is checked at allocation time: the queues are
    returned even when they are not in ``mq_all`` or the consumer is not in
    ``cid_all``.  Keeping the members' lists disjoint and complete is the
    user's business.  An empty list is allowed (a member that consumes
    nothing).  Raises ``TypeError`` for an element that is not a
    :class:`MessageQueue` and ``ValueError`` for a queue listed twice.
    """

    __slots__ = ("_queues",)

    def __init__(self, queues: Iterable[MessageQueue]) -> None:
        qs = tuple(queues)
        seen: set[MessageQueue] = set()
        for q in qs:
            if not isinstance(q, MessageQueue):
                raise TypeError(f"AllocateByConfig takes MessageQueue objects, got {q!r}")
            if q in seen:
                raise ValueError(f"queue {q} is listed twice in the AllocateByConfig queues")
            seen.add(q)
        self._queues = qs

    @property
    def name(self) -> str:
        return "CONFIG"

    @property
    def queues(self) -> tuple[MessageQueue, ...]:
        """The configured queues, in the order given."""
        return self._queues

    def __call__(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        return list(self._queues)

    def __repr__(self) -> str:
        return f"AllocateByConfig([{', '.join(str(q) for q in self._queues)}])"


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
                raise ValueError(f"bad idc name {idc!r}: brokers are named '<idc>@<broker>', so an idc is non-empty without '@'")
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
        checked = _checked(consumer_group, current_cid, mq_all, cid_all)
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
        checked = _checked(consumer_group, current_cid, mq_all, cid_all)
        if checked is None:
            return []
        mqs, cids = checked
        queues_in: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            queues_in.setdefault(self._room(self._resolver.broker_deploy_in(mq), f"queue {mq}"), []).append(mq)
        consumers_in: dict[str, list[str]] = {}
        for cid in cids:
            consumers_in.setdefault(self._room(self._resolver.consumer_deploy_in(cid), f"consumer {cid!r}"), []).append(cid)

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
