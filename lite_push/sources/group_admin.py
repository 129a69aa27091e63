"""A consumer group as an operator sees it: who is in it, where it stands
on each queue, and moving its committed offsets while it is empty.

What ``lite-push group describe`` and ``group reset-offsets`` read and
write, on every source.  Each broker makes one for a group
(``broker.group_admin(group)``): the embedded broker's
(:mod:`.embedded.group_admin`), Redis's (:mod:`.redis.group_admin`) and
Kafka's (:mod:`.kafka.group_admin`).  It reads and writes outside the
group: it joins nothing and commits as no member.

A reset writes plain offsets (no offset map): the group's next owner of
each queue reads from there, as a new member reads from a committed
offset.  It is refused while the group has live members
(:class:`~lite_push.GroupActiveError`), as Kafka refuses to reset the
offsets of an active group: a live member would commit over them.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .._types import MessageQueue

__all__ = ["GroupAdmin", "GroupMember"]


@dataclass(frozen=True, slots=True)
class GroupMember:
    """A live member of a consumer group, as its source records it.

    ``topics``: the topics it subscribed to (empty when the source does not
    record them); ``last_heartbeat``: seconds since its last heartbeat
    (``None`` when the source does not record it); ``host``: where it runs,
    when the source says (Kafka)."""

    client_id: str
    topics: tuple[str, ...] = ()
    last_heartbeat: float | None = None
    host: str | None = None


class GroupAdmin(abc.ABC):
    """One consumer group of one source, read and changed from outside it.

    Offsets are those of :meth:`~lite_push.sources.PullSource.committed`:
    the next offset the group reads on a queue.  Every method takes the
    queues it is asked about and answers for those only."""

    def __init__(self, group: str) -> None:
        #: The group's name.
        self.group = group

    @abc.abstractmethod
    def members(self) -> list[GroupMember]:
        """The group's live members, sorted by client id.
        :class:`~lite_push.AdminNotSupportedError` when the source cannot
        tell."""

    @abc.abstractmethod
    def topics(self) -> list[str]:
        """The topics the source records the group consuming, sorted: its
        members' subscriptions where the source keeps them, and the topics
        it has committed offsets on (empty when it can list neither)."""

    def known(self) -> bool:
        """Whether the source has a record of the group: committed offsets,
        or members and their subscriptions (a group no member ever joined
        nor committed for is unknown).  By default: whether :meth:`topics`
        names any."""
        return bool(self.topics())

    @abc.abstractmethod
    def committed(self, queues: Sequence[MessageQueue]) -> dict[MessageQueue, int]:
        """The committed offset of each of ``queues`` that has one."""

    @abc.abstractmethod
    def owners(self, queues: Sequence[MessageQueue]) -> dict[MessageQueue, tuple[str, ...]]:
        """The client ids of the live members that own each of ``queues``
        now (several for a group balanced by message); a queue nobody owns
        is left out.  :class:`~lite_push.AdminNotSupportedError` when the
        source cannot tell."""

    def in_flight(self, queues: Sequence[MessageQueue]) -> dict[MessageQueue, int] | None:
        """How many messages of each of ``queues`` were delivered to a
        member and not yet acknowledged, where the source knows it (a Redis
        group balanced by message); ``None`` where only the members know
        (the default)."""
        return None

    @abc.abstractmethod
    def offsets_at(self, queues: Sequence[MessageQueue], timestamp: int) -> dict[MessageQueue, int]:
        """For each of ``queues``, the offset of the first message stored at
        or after ``timestamp`` (epoch ms); the queue's end when there is
        none."""

    @abc.abstractmethod
    def reset(self, offsets: Mapping[MessageQueue, int]) -> None:
        """Make ``offsets`` the group's committed offsets (without an offset
        map; other queues are left as they are).  Raises
        :class:`~lite_push.GroupActiveError` naming the members while the
        group has live ones, and changes nothing then."""
