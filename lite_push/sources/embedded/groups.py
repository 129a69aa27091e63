"""The embedded broker's group coordinator: consumer groups, their members,
who owns which queue, committed offsets and queue locks.

Rebalance and the queue hand-off
--------------------------------

Membership of a group starts at subscribe() and ends at close() (or when the
member misses its session timeout).  On every membership change the
coordinator recomputes each member's *target* (the allocation strategy over
the topic's sorted queues and the sorted client ids of the members subscribed
to it) and bumps the group's version.  The *owner* map (queue -> client id)
changes only in the owning member's own poll():

1. a member whose owned queue left its target calls its listener's
   on_revoked (it commits there, still the owner), then releases the queue
   (:meth:`GroupCoordinator.release`), which bumps the version and wakes the
   waiting pollers;
2. a member takes a target queue only when the owner map has no entry for
   it (:meth:`GroupCoordinator.take_free`), reading the start position
   (committed offset, else the group's first-ownership position from
   ConsumeFromWhere), then calls on_assigned.

So two live members never own one queue at once, and the new owner starts at
what the old one committed in on_revoked.  :meth:`GroupCoordinator.commit`
stores only offsets of queues the committer owns.  Liveness: every poll
stamps the member's ``last_seen`` (injectable clock); a poll that sees another
member silent for longer than its session timeout evicts it (drops it from
the group and its owner entries) -- the one case where the queues move before
their old owner ran on_revoked.  The evicted member's next poll sees its
queues gone, calls on_revoked (its commits are fenced off by then: ignored),
and rejoins.

Everything here runs under the broker's one lock (``lock``), except
:meth:`GroupCoordinator.save_offsets`, which writes offsets.json under its
own lock with a version, so a late, older snapshot never overwrites a newer
one.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import threading
from collections.abc import Collection, Mapping
from typing import Protocol

from ..._errors import ConfigError
from ..._types import MessageQueue, OffsetAndMetadata
from ...rebalance.allocate import AllocateStrategy
from .._common import BrokerClock, initial_position, warn_skipped_start
from ..contract import ConsumeFromWhere
from .log import LogStore

__all__ = ["SCHEDULE_GROUP", "Group", "GroupCoordinator", "Member", "OffsetsSnapshot"]

logger = logging.getLogger(__name__)

#: The internal group whose committed offsets on the schedule topic say what
#: was already delivered; no consumer may use this group name.
SCHEDULE_GROUP = "%SCHEDULE%"

#: offsets.json's content: group -> (topic, queue id) -> (offset, metadata).
OffsetsSnapshot = dict[str, dict[tuple[str, int], tuple[int, str]]]


class Closable(Protocol):
    """A consumer as the coordinator sees it: closed when the broker closes."""

    def mark_closed(self) -> None: ...


class Member:
    """A group member as the broker sees it (guarded by the broker lock,
    except ``last_seen``, which its own poll stamps without it)."""

    __slots__ = (
        "cid",
        "topics",
        "allocate",
        "consume_from",
        "consume_timestamp",
        "session_timeout",
        "last_seen",
        "target",
        "expired",
    )

    def __init__(
        self,
        cid: str,
        allocate: AllocateStrategy,
        consume_from: ConsumeFromWhere,
        consume_timestamp: int | None,
        session_timeout: float,
        now: float,
    ) -> None:
        self.cid = cid
        self.topics: set[str] = set()
        self.allocate = allocate
        self.consume_from = consume_from
        self.consume_timestamp = consume_timestamp
        self.session_timeout = session_timeout
        self.last_seen = now
        self.target: frozenset[MessageQueue] = frozenset()
        self.expired = False


class Group:
    """A consumer group's shared state (guarded by the broker lock)."""

    __slots__ = (
        "name",
        "clients",
        "members",
        "owner",
        "committed",
        "initial",
        "version",
        "next_check",
        "locks",
        "started",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.clients: set[str] = set()  # client ids of the open consumers
        self.members: dict[str, Member] = {}  # subscribed, live members
        self.owner: dict[MessageQueue, str] = {}  # the hand-off's source of truth
        self.committed: dict[MessageQueue, OffsetAndMetadata] = {}
        self.initial: dict[MessageQueue, int] = {}  # start position fixed when first owned
        self.version = 0  # bumped on every target change and release
        self.next_check = float("-inf")  # next session-expiry scan (clock time)
        self.locks: dict[MessageQueue, tuple[str, float]] = {}  # queue -> (client id, lease end)
        self.started: set[str] = set()  # topics whose first start position was fixed (and said)


class GroupCoordinator:
    """The consumer groups of one embedded broker."""

    def __init__(self, log: LogStore, clock: BrokerClock, session_timeout: float) -> None:
        self._log = log
        self.lock = log.lock
        self._cond = log.cond
        self._clock = clock
        self.session_timeout = session_timeout
        self._groups: dict[str, Group] = {}
        self._consumers: set[Closable] = set()
        self._client_seq = itertools.count(1)
        self._offsets_io_lock = threading.Lock()
        self._offsets_version = 0

    # -- groups and members ---------------------------------------------------

    def group(self, name: str) -> Group:
        """(lock held) The group called ``name``, created empty if new."""
        g = self._groups.get(name)
        if g is None:
            g = self._groups[name] = Group(name)
        return g

    def find(self, name: str) -> Group | None:
        """(lock held) The group called ``name``, if it exists."""
        return self._groups.get(name)

    def new_client_id(self) -> str:
        """A client id unique in this process, increasing with creation order."""
        return f"{self._log.broker_name}@{os.getpid()}@{next(self._client_seq):06d}"

    def check_client_id(self, group: Group, cid: str) -> None:
        """(lock held) ``ConfigError`` when an open consumer of ``group``
        already uses ``cid``."""
        if cid in group.clients:
            raise ConfigError("client_id", f"{cid!r} is already used by an open consumer of group {group.name!r}")

    def register(self, consumer: Closable, group: Group, cid: str) -> None:
        """(lock held) An open consumer of ``group`` (not yet a member)."""
        group.clients.add(cid)
        self._consumers.add(consumer)

    def join(self, group: Group, member: Member) -> None:
        """(lock held) ``member`` subscribed: it is a member of ``group`` now."""
        member.last_seen = self._clock.monotonic()
        group.members[member.cid] = member
        self.recompute(group)

    def rejoin(self, group: Group, member: Member) -> None:
        """(lock held) A member evicted for silence comes back."""
        member.expired = False
        self.join(group, member)
        logger.warning("group %r: member %r rejoins after its session expired", group.name, member.cid)

    def leave(self, consumer: Closable, group: Group, cid: str) -> None:
        """(lock held) A consumer closed: it leaves the group (if it is a
        member), its queue locks and owned queues are released at once."""
        self._consumers.discard(consumer)
        group.clients.discard(cid)
        for q in [q for q, (holder, _end) in group.locks.items() if holder == cid]:
            del group.locks[q]
        if cid in group.members:  # client ids are unique among a group's open consumers
            del group.members[cid]
            for q in [q for q, owner in group.owner.items() if owner == cid]:
                del group.owner[q]
            self.recompute(group)
        self._cond.notify_all()

    def recompute(self, group: Group) -> None:
        """(lock held) New targets for every member; wakes the pollers."""
        by_topic: dict[str, list[str]] = {}
        for m in group.members.values():
            for topic in m.topics:
                by_topic.setdefault(topic, []).append(m.cid)
        for m in group.members.values():
            target: set[MessageQueue] = set()
            for topic in m.topics:
                queues = self._log.topic(topic).queues
                share = m.allocate(group.name, m.cid, queues, sorted(by_topic[topic]))
                target.update(q for q in share if q.topic == topic)
            m.target = frozenset(target)
        self._bump(group)

    def _bump(self, group: Group) -> None:
        group.version += 1
        self._cond.notify_all()

    def check_expiry(self, group: Group, caller: Member, now: float) -> None:
        """Evict every member of ``group`` but ``caller`` that has been
        silent for longer than its session timeout (takes the lock)."""
        with self.lock:
            if now < group.next_check:
                return
            shortest = min((m.session_timeout for m in group.members.values()), default=self.session_timeout)
            group.next_check = now + min(1.0, shortest / 10)
            for m in list(group.members.values()):
                if m is not caller and now - m.last_seen > m.session_timeout:
                    m.expired = True
                    self._evict(group, m, f"missed its session timeout ({m.session_timeout:g} s)")

    def confirm(self, group: Group, member: Member, now: float) -> bool:
        """Stamp ``member``'s heartbeat at ``now`` (takes the lock); return
        whether it is still a member, i.e. owns its queues until at least
        ``now`` + its session timeout (fencing: under the lock, so an
        eviction is either seen here or saw this stamp)."""
        with self.lock:
            member.last_seen = max(member.last_seen, now)
            return not member.expired and group.members.get(member.cid) is member

    def _evict(self, group: Group, member: Member, why: str) -> None:
        group.members.pop(member.cid, None)
        for q in [q for q, cid in group.owner.items() if cid == member.cid]:
            del group.owner[q]
        logger.warning("group %r: member %r %s; its queues are released", group.name, member.cid, why)
        self.recompute(group)

    # -- the owner map --------------------------------------------------------

    def to_give_up(
        self, group: Group, cid: str, owned: Collection[MessageQueue], target: Collection[MessageQueue]
    ) -> tuple[list[MessageQueue], list[MessageQueue]]:
        """(lock held) Of the ``owned`` queues: those the member lost (the
        owner map no longer names it: evicted) and those it must release
        (still its own, but out of its ``target``)."""
        owner = group.owner
        lost = [q for q in owned if owner.get(q) != cid]
        drop = [q for q in owned if q not in target and owner.get(q) == cid]
        return lost, drop

    def take_free(
        self, group: Group, member: Member, owned: Collection[MessageQueue]
    ) -> list[tuple[MessageQueue, int]]:
        """(lock held) Claim every target queue that nobody owns; each with
        the position the member starts at, in queue order."""
        owner = group.owner
        taken = []
        for q in sorted(q for q in member.target if q not in owned and q not in owner):
            owner[q] = member.cid
            taken.append((q, self.start_position(group, member, q)))
        return taken

    def release(self, group: Group, cid: str, queues: Collection[MessageQueue]) -> None:
        """(lock held) Give up ``queues`` (those still the member's own) and
        wake the pollers waiting to take them."""
        for q in queues:
            if group.owner.get(q) == cid:
                del group.owner[q]
        if queues:
            self._bump(group)

    def start_position(self, group: Group, member: Member, q: MessageQueue) -> int:
        """(lock held) Where ``group`` reads ``q`` from when it takes it:
        its committed offset, else the position fixed when the group first
        owned it."""
        log = self._log.log_of(q)
        om = group.committed.get(q)
        if om is not None:
            return min(max(om.offset, 0), len(log))
        pos = group.initial.get(q)
        if pos is None:
            pos = group.initial[q] = self.initial_position(member, q)
            if q.topic not in group.started:
                group.started.add(q.topic)
                self._say_start(group, member, q.topic)
        return min(pos, len(log))

    def _say_start(self, group: Group, member: Member, topic: str) -> None:
        """A new group fixes its first start position on ``topic``: at
        LAST_OFFSET, the messages already stored are skipped; say so once."""
        if member.consume_from is not ConsumeFromWhere.LAST_OFFSET:
            return
        t = self._log.topic(topic)
        skipped = sum(len(log) for q, log in zip(t.queues, t.logs, strict=True) if q not in group.committed)
        if skipped:
            warn_skipped_start(group.name, topic, skipped)

    def initial_position(self, member: Member, q: MessageQueue) -> int:
        """(lock held) Where ``member.consume_from`` starts on ``q``."""
        lo, hi = self._log.stored_range(q)
        first_at = functools.partial(self._log.first_stored_at, q, lo, hi)
        return initial_position(member.consume_from, member.consume_timestamp, lo, hi, first_at)

    # -- offsets and locks ----------------------------------------------------

    def commit(self, group: Group, cid: str, entries: Mapping[MessageQueue, OffsetAndMetadata]) -> int:
        """(lock held) Store the offsets of the queues ``cid`` owns (a member
        that lost a queue, even one that has not noticed yet, cannot commit
        it); return how many were stored."""
        stored = 0
        for q, om in entries.items():
            if group.owner.get(q) == cid:
                group.committed[q] = om
                stored += 1
            else:
                logger.debug("group %r: commit of %s by %r ignored: not its queue", group.name, q, cid)
        return stored

    def lock_queues(
        self, group: Group, cid: str, queues: Collection[MessageQueue], lease: float
    ) -> frozenset[MessageQueue]:
        """(lock held) Take or renew the broker-side lock of each queue that
        is free, ``cid``'s own, or whose lease ran out; return those held."""
        now = self._clock.monotonic()
        locks = group.locks
        held = []
        for q in queues:
            current = locks.get(q)
            if current is None or current[0] == cid or current[1] <= now:
                locks[q] = (cid, now + lease)
                held.append(q)
        return frozenset(held)

    def unlock_queues(self, group: Group, cid: str, queues: Collection[MessageQueue]) -> None:
        """(lock held) Release ``cid``'s locks of ``queues``."""
        locks = group.locks
        for q in queues:
            current = locks.get(q)
            if current is not None and current[0] == cid:
                del locks[q]

    def load_offsets(self, saved: OffsetsSnapshot) -> None:
        """The committed offsets read from offsets.json (at start)."""
        for group_name, entries in saved.items():
            group = self.group(group_name)
            for (topic_name, qid), (offset, metadata) in entries.items():
                t = self._log.get(topic_name)
                if t is None or not 0 <= qid < len(t.queues):
                    logger.warning("offsets for unknown queue %s#%d of group %r ignored", topic_name, qid, group_name)
                    continue
                group.committed[t.queues[qid]] = OffsetAndMetadata(offset, metadata)

    def offsets_snapshot(self) -> tuple[OffsetsSnapshot, int]:
        """(lock held) What offsets.json should say now, and its version."""
        self._offsets_version += 1
        snap = {
            g.name: {(q.topic, q.queue_id): (om.offset, om.metadata) for q, om in g.committed.items()}
            for g in self._groups.values()
            if g.committed
        }
        return snap, self._offsets_version

    @property
    def durable(self) -> bool:
        """Whether committed offsets are written to offsets.json (a durable
        broker)."""
        return self._log.durable

    def save_offsets(self, snapshot: OffsetsSnapshot, version: int) -> None:
        """Write offsets.json (durable brokers; without the broker lock)."""
        files = self._log.files
        if files is None:
            return
        with self._offsets_io_lock:
            files.save_offsets(snapshot, version)

    def close_all(self) -> tuple[OffsetsSnapshot, int]:
        """(lock held) The broker closes: every consumer is closed, every
        group emptied; returns the last offsets snapshot to save."""
        for c in list(self._consumers):
            c.mark_closed()
        self._consumers.clear()
        for g in self._groups.values():
            g.members.clear()
            g.owner.clear()
            g.clients.clear()
        self._cond.notify_all()
        return self.offsets_snapshot()
