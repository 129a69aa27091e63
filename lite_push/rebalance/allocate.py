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

The protocol and the registry are in :mod:`lite_push.rebalance._strategy`, the
machine-room strategies in :mod:`lite_push.rebalance.machine_room`.  Adding a strategy: write the plain function, then
``NAME = register("RocketMQName", function)``; it is then listed in
:data:`STRATEGIES` and found by :func:`get_strategy`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .._types import MessageQueue
from ._hash_ring import HashFunction, HashRing, md5_hash
from ._strategy import (
    STRATEGIES,
    AllocateFn,
    AllocateStrategy,
    add_strategy,
    checked_inputs,
    get_strategy,
    register,
)
from .machine_room import AllocateByMachineRoom, AllocateMachineRoomNearby, MachineRoomResolver

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
    checked = checked_inputs(consumer_group, current_cid, mq_all, cid_all)
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
    checked = checked_inputs(consumer_group, current_cid, mq_all, cid_all)
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
        checked = checked_inputs(consumer_group, current_cid, mq_all, cid_all)
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
CONSISTENT_HASH: AllocateStrategy = add_strategy(AllocateConsistentHash())


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
