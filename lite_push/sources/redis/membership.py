"""A member's session in its consumer group on Redis: heartbeats, taking and
releasing queues, start positions, commits, queue locks, leaving.

Every call is one Lua script (or a few plain commands) on the group's hash
tag, so it runs on one cluster slot; sessions expire on the server's clock,
so members on different machines agree on them.  The keys and the hand-off
protocol are described in the package docstring.

The heartbeat schedule is here too (:meth:`Membership.heartbeat_in`): a
heartbeat is due once :data:`HEARTBEAT_SHARE` of ``heartbeat_interval`` has
passed since the last one was sent, not the whole interval.  The member
notices it is due at its next read (a waiting poll wakes up for it), and the
heartbeat itself takes a round trip: sent when the interval was up, a
healthy member's last heartbeat was always older than the interval when the
next one landed, and ``group describe`` showed it so.  Renewing early keeps
that age under the interval, as Kafka's consumer heartbeats at a third of
its session timeout; the session timeout, and so when a silent member's
queues move, is unchanged.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import orjson

from ..._errors import ConfigError
from ..._types import MessageQueue, OffsetAndMetadata
from .._common import initial_position, warn_skipped_start
from .._member_model import StoredLog
from ..contract import Balance, ConsumeFromWhere
from .connection import Connection, qfield

__all__ = [
    "CLOCK_DRIFT",
    "CLOCK_DRIFT_FLOOR",
    "HEARTBEAT_SHARE",
    "Membership",
    "certain_for",
    "owner_key",
    "read_committed",
]

logger = logging.getLogger(__name__)

#: The share of ``heartbeat_interval`` after which the next heartbeat is due
#: (counted from when the last one was sent): the rest of the interval
#: covers the read that notices it and the heartbeat's round trip.
HEARTBEAT_SHARE = 0.75
#: A session's expiry runs on the server's clock, a fence on this process's
#: monotonic one, and the two need not run at the same rate: a fence closes
#: this share of the session, plus ``CLOCK_DRIFT_FLOOR`` seconds, before the
#: expiry as last set (Redlock's drift allowance: 1 % of the TTL plus 2 ms).
CLOCK_DRIFT = 0.01
CLOCK_DRIFT_FLOOR = 0.002


def certain_for(ttl: float) -> float:
    """Seconds after a renewal of ``ttl`` seconds (sent then) for which the
    key is certainly still set, the drift allowance taken off."""
    return ttl * (1.0 - CLOCK_DRIFT) - CLOCK_DRIFT_FLOOR


def owner_key(conn: Connection, group: str, q: MessageQueue) -> str:
    """The key naming the member of ``group`` that owns ``q`` (expires
    with that member's session)."""
    return conn.group_key(group, f"owner:{qfield(q)}")


def read_committed(conn: Connection, group: str, queue: MessageQueue) -> OffsetAndMetadata | None:
    """What ``group`` committed for ``queue`` (one HGET)."""
    raw = conn.client.hget(conn.group_key(group, "offsets"), qfield(queue))
    if raw is None:
        return None
    off, meta = orjson.loads(raw)
    return OffsetAndMetadata(off, meta)


class Membership:
    """The group side of one :class:`~lite_push.sources.redis.RedisPullConsumer`.

    ``session_timeout``: how long the group keeps it without a heartbeat;
    ``heartbeat_interval``: the longest its last heartbeat gets before the
    next one lands, while it polls; ``monotonic``: the clock of the
    heartbeat schedule and of :meth:`owned_for` (``time.monotonic``)."""

    def __init__(
        self,
        conn: Connection,
        group: str,
        cid: str,
        session_timeout: float,
        consume_from: ConsumeFromWhere,
        consume_timestamp: int | None,
        *,
        heartbeat_interval: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._conn = conn
        self.group = group
        self.cid = cid
        #: How long the group keeps this member without a heartbeat (seconds).
        self.session_timeout = session_timeout
        #: The longest its last heartbeat gets before the next one lands, while it polls.
        self.heartbeat_interval = heartbeat_interval
        self._ttl_ms = max(1, round(session_timeout * 1000))
        self._beat_every = heartbeat_interval * HEARTBEAT_SHARE
        self._monotonic = monotonic
        #: Per owned queue, ``monotonic()`` just before the call that
        #: last set its owner key's expiry (acquire or heartbeat): the key
        #: is this member's until at least then + the session timeout.
        self._renewed: dict[MessageQueue, float] = {}
        #: The orderly locks this member holds.
        self._locked: set[MessageQueue] = set()
        self._consume_from = consume_from
        self._consume_timestamp = consume_timestamp
        self._k_members = conn.group_key(group, "members")
        self._k_subs = conn.group_key(group, "subs")
        self._k_beats = conn.group_key(group, "beats")
        self.version_key = conn.group_key(group, "version")
        self._k_offsets = conn.group_key(group, "offsets")
        self._k_initial = conn.group_key(group, "initial")
        #: The pub/sub channel announcing the group's membership changes.
        self.channel = conn.group_key(group, "events")
        #: ``monotonic()`` just before the last successful heartbeat was sent.
        self.last_heartbeat = -float("inf")
        #: Per topic, the stored messages a new group's LAST_OFFSET start
        #: skipped on the queues this member positioned (said by
        #: :meth:`say_skipped`, once per topic).
        self._skipped: dict[str, int] = {}
        self._said: set[str] = set()

    def _owner_key(self, q: MessageQueue) -> str:
        return owner_key(self._conn, self.group, q)

    def _lock_key(self, q: MessageQueue) -> str:
        return self._conn.group_key(self.group, f"lock:{qfield(q)}")

    # -- membership and ownership ------------------------------------------------

    def heartbeat_in(self) -> float:
        """Seconds until the next heartbeat is due (zero or less: due now):
        :data:`HEARTBEAT_SHARE` of the heartbeat interval after the last one
        was sent."""
        return self.last_heartbeat + self._beat_every - self._monotonic()

    def heartbeat(
        self, owned: Sequence[MessageQueue], topics: Collection[str]
    ) -> tuple[bytes, list[MessageQueue], dict[str, list[str]]]:
        """Run HEARTBEAT: drop expired members, (re)add this one subscribed
        to ``topics``, renew the owner keys of ``owned``.  Returns (the
        group's version, the owned queues lost, topic -> member ids)."""
        sent = self._monotonic()
        version, flags, subs = self._conn.heartbeat(
            keys=[self._k_members, self._k_subs, self.version_key, self._k_beats, *(self._owner_key(q) for q in owned)],
            args=[self.cid, self._ttl_ms, orjson.dumps(sorted(topics)), self.channel],
        )
        self.last_heartbeat = sent
        lost = []
        renewed = self._renewed
        for q, f in zip(owned, flags, strict=True):
            if int(f):
                renewed[q] = sent
            else:
                lost.append(q)
                renewed.pop(q, None)
        by_topic: dict[str, list[str]] = {}
        for j in range(0, len(subs), 2):
            cid = subs[j].decode()
            for topic in orjson.loads(subs[j + 1]):
                by_topic.setdefault(topic, []).append(cid)
        if isinstance(version, int):
            version = str(version).encode()
        return version, lost, by_topic

    def acquire(self, queues: Sequence[MessageQueue]) -> list[MessageQueue]:
        """Take the owner keys of ``queues`` that are free (or already
        this member's); return those taken."""
        sent = self._monotonic()
        flags = self._conn.acquire(keys=[self._owner_key(q) for q in queues], args=[self.cid, self._ttl_ms])
        taken = [q for q, f in zip(queues, flags, strict=True) if int(f)]
        for q in taken:
            self._renewed[q] = sent
        return taken

    def owned_for(self, queues: Collection[MessageQueue]) -> dict[MessageQueue, float]:
        """Seconds from now for which each of ``queues`` is certainly this
        member's (its owner key's expiry as last set, at the earliest, less
        the drift allowance)."""
        ttl = certain_for(self._ttl_ms / 1000.0)
        now = self._monotonic()
        renewed = self._renewed
        return {q: renewed.get(q, -float("inf")) + ttl - now for q in queues}

    def forget(self, queues: Collection[MessageQueue]) -> None:
        """``queues`` are no longer owned (revoked or released)."""
        for q in queues:
            self._renewed.pop(q, None)

    def release(self, queues: Collection[MessageQueue]) -> None:
        """Compare-and-delete the owner keys of ``queues`` (bumps the version)."""
        self._conn.release(
            keys=[self.version_key, *(self._owner_key(q) for q in queues)], args=[self.cid, self.channel]
        )

    def leave(self, owned: Collection[MessageQueue], member: bool) -> None:
        """Release ``owned`` and the orderly locks held at once and, when
        subscribed (``member``), leave the group's registry."""
        locked, self._locked = self._locked, set()
        keys = [self._owner_key(q) for q in owned] + [self._lock_key(q) for q in locked]
        if member:
            self._conn.leave(
                keys=[self._k_members, self._k_subs, self.version_key, self._k_beats, *keys],
                args=[self.cid, self.channel],
            )
        elif keys:
            self._conn.unlock(keys=keys, args=[self.cid])

    def claim_balance(self, balance: Balance) -> None:
        """Record ``balance`` as the group's (joining its registry), or
        raise ``ConfigError`` naming both when a live member uses the other."""
        got = self._conn.claim_balance(
            keys=[self._k_members, self._conn.group_key(self.group, "balance")],
            args=[self.cid, balance.value, self._ttl_ms],
        )
        recorded = got.decode() if isinstance(got, bytes) else str(got)
        if recorded != balance.value:
            raise ConfigError(
                "balance",
                f"group {self.group!r} balances by {recorded} (its live members use Balance.{recorded}); "
                f"this member asked for Balance.{balance.value}: every member of a group uses the same balance",
            )

    def store_positions(self, positions: Mapping[MessageQueue, int]) -> None:
        """Copy the group's committed positions (message-grain members:
        the lowest unacknowledged offsets) to the group's offsets hash, for
        a member of the other balance and for tools; a position there is
        only ever raised (another member's copy may be newer)."""
        if positions:
            args: list[Any] = []
            for q, off in positions.items():
                args += (qfield(q), int(off))
            self._conn.raise_positions(keys=[self._k_offsets], args=args)

    # -- positions -----------------------------------------------------------------

    def start_position(self, q: MessageQueue, stored: StoredLog) -> int:
        """Where this member reads ``q`` from when it takes it: the group's
        committed offset, else the position fixed when the group first owned
        it (by ``consume_from``), clamped to the stored range."""
        client = self._conn.client
        lo, hi = stored.stored_range(q)
        field = qfield(q)
        raw = client.hget(self._k_offsets, field)
        if raw is not None:
            return min(max(int(orjson.loads(raw)[0]), lo), hi)
        init = client.hget(self._k_initial, field)
        if init is None:
            first_at = functools.partial(stored.first_stored_at, q, lo, hi)
            pos = initial_position(self._consume_from, self._consume_timestamp, lo, hi, first_at)
            if client.hsetnx(self._k_initial, field, str(pos)) and self._consume_from is ConsumeFromWhere.LAST_OFFSET:
                self._skipped[q.topic] = self._skipped.get(q.topic, 0) + hi - lo
            init = client.hget(self._k_initial, field)
        return min(max(int(init), lo), hi)

    def say_skipped(self) -> None:
        """One WARNING per topic where this member fixed a new group's
        LAST_OFFSET start over stored messages."""
        for topic, skipped in self._skipped.items():
            if skipped and topic not in self._said:
                self._said.add(topic)
                warn_skipped_start(self.group, topic, skipped)
        self._skipped.clear()

    # -- offsets and locks -----------------------------------------------------------

    def commit(self, entries: Mapping[MessageQueue, OffsetAndMetadata]) -> int:
        """Store the offsets of the queues whose owner key holds this member
        (late commits of a lost queue are fenced); return how many."""
        keys = [self._owner_key(q) for q in entries]
        args: list[Any] = [self.cid]
        for q, om in entries.items():
            args += (qfield(q), orjson.dumps([om.offset, om.metadata]))
        return int(self._conn.commit(keys=[self._k_offsets, *keys], args=args))

    def committed(self, queue: MessageQueue) -> OffsetAndMetadata | None:
        """The group's committed offset of ``queue``."""
        return read_committed(self._conn, self.group, queue)

    def lock(self, queues: Collection[MessageQueue], lease: float) -> frozenset[MessageQueue]:
        """Take or renew the orderly locks of ``queues``; return those held
        (released by :meth:`leave` if not unlocked before)."""
        qs = list(queues)
        flags = self._conn.lock(keys=[self._lock_key(q) for q in qs], args=[self.cid, max(1, round(lease * 1000))])
        held = frozenset(q for q, f in zip(qs, flags, strict=True) if int(f))
        self._locked |= held
        return held

    def unlock(self, queues: Collection[MessageQueue]) -> None:
        """Release this member's orderly locks of ``queues``."""
        qs = list(queues)
        self._conn.unlock(keys=[self._lock_key(q) for q in qs], args=[self.cid])
        self._locked.difference_update(qs)
