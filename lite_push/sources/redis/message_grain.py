"""Message-grain balancing (``Balance.MESSAGE``) on Redis: one member's side.

Every member of the group takes part in every queue of its topics; the
server (:mod:`.grain_scripts`) decides, message by message, who gets what:
a key with delivered, unacknowledged messages stays with its member, a free
key goes to whoever asks.  A member asks, in each poll, for up to
``max_per_queue`` messages of each of its unpaused queues (one DISPATCH
script per queue, pipelined with the poll), so a slower member, whose
queues the runtime pauses sooner, gets less.

Per queue the member keeps a token (``<client id>/<generation>``), the
offsets delivered to it and not yet acknowledged, and when it last renewed
its session there.  ``owned_for`` is that renewal (taken when the call was
sent) plus the session timeout: the runtime starts no listener call of the
queue past it, and the server gives the member's messages and keys to
others only after it (the fence rule of queue mode, per key).

A commit is turned into acknowledgements: of the offsets delivered to this
member, those below the committed offset or finished in its offset map
(one ACK script per queue, pipelined: one round trip per commit).  A
member whose session lapsed (its DISPATCH, RENEW or ACK says so) gives the
queue up (``on_revoked``, without effect on the server: its late
acknowledgements are ignored) and joins it again with a new token
(``on_assigned``).

The member reads each queue's stream itself (:mod:`.grain_ahead`) and
proposes what it read to DISPATCH, which answers with what it delivered.
Round trips: a poll is one (the dispatches of all queues, pipelined; a
paused queue's session renewal rides along every ``heartbeat_interval``),
plus one before it when a queue's read-ahead is shorter than a proposal
(the reads of those queues, pipelined); a commit is one; joining a queue is two (its cursor, then the join); the
group registry's heartbeat and the copy of each queue's committed position
to the group's offsets hash (for a member of the other balance, or a tool)
are two more every ``heartbeat_interval``.  A reclaim costs no round trip
of its own: the first DISPATCH after a session lapsed does it, in time
linear in the queue's records (``benchmarks/grain_costs.py`` measures
each call).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from ..._errors import ConfigError
from ..._state.offset_map import OffsetMapError
from ..._state.offset_map import decode as decode_map
from ..._types import MessageExt, MessageQueue, OffsetAndMetadata, PollBatch
from .._member_model import MemberModel
from .._owned import OwnedQueues
from ..contract import Balance, MessageModel, retry_topic
from . import grain_scripts
from .connection import Connection
from .grain_ready import ReadyBatches
from .grain_share import SCAN_EXTRA, Share, text
from .lost_data import LostData
from .membership import Membership, certain_for
from .reading import QueueReader
from .retries import Retries
from .topics import TopicCatalog

__all__ = ["MessageGrain", "ahead_size", "grain_keys", "grain_position"]

logger = logging.getLogger(__name__)

#: Messages one DISPATCH may park (their key held by another member) before
#: the cursor stops moving: the group's buffer ahead of slow holders.
PARK_LIMIT = 4096
#: Records one ACK call names (Lua unpacks them onto its stack).
ACK_CHUNK = 500


def ahead_size(want: int) -> int:
    """How many entries a member keeps read ahead of a queue, at least,
    when it asks for ``want`` messages a poll."""
    return 4 * want + SCAN_EXTRA


def grain_keys(conn: Connection, group: str, queue: MessageQueue) -> list[str]:
    """The keys of ``queue``'s message-grain state for ``group``, in the
    order of :data:`.grain_scripts.GRAIN_KEYS` (the first is the queue's
    stream)."""
    t, q = queue.topic, queue.queue_id
    return [conn.queue_key(t, q, "log")] + [
        conn.queue_key(t, q, f"mg:{group}:{w}") for w in grain_scripts.GRAIN_KEYS[1:]
    ]


def grain_position(conn: Connection, group: str, queue: MessageQueue) -> OffsetAndMetadata | None:
    """The committed position of ``queue`` for ``group`` balanced by
    message: its lowest offset no member acknowledged (None: never read)."""
    pos = int(conn.run(conn.grain_position, grain_keys(conn, group, queue), []))
    return None if pos < 0 else OffsetAndMetadata(pos)


class MessageGrain(MemberModel):
    """``Balance.MESSAGE`` for one member: ``membership`` is its entry in
    the group's registry (and where start positions are fixed),
    ``reader(queue, position)`` makes an owned queue's state (its ``pos``
    is the member's high-water mark of the queue)."""

    message_model = MessageModel.CLUSTERING

    def __init__(
        self,
        owned: OwnedQueues[QueueReader],
        membership: Membership,
        conn: Connection,
        topics: TopicCatalog,
        retries: Retries,
        reader: Callable[[MessageQueue, int], QueueReader],
        tags: Callable[[str], frozenset[str] | None],
    ) -> None:
        if "\t" in owned.client_id:
            raise ConfigError("client_id", f"must not contain a tab with Balance.MESSAGE, got {owned.client_id!r}")
        self._owned = owned
        self._members = membership
        self._conn = conn
        self._topics = topics
        self._retries = retries
        self._reader = reader
        self._ttl_ms = max(1, round(membership.session_timeout * 1000))
        self._tags = tags
        self._subscribed: list[str] = []
        self._shares: dict[MessageQueue, Share] = {}
        self._generation = 0
        self._pending = False
        self._evicted: set[MessageQueue] = set()
        #: What the last :meth:`queue_reads` queued besides the dispatches,
        #: and when it was sent.
        self._renewing: list[MessageQueue] = []
        self._resyncing: list[MessageQueue] = []
        #: The reads ahead the poll carries, each with where it starts.
        self._reading: list[tuple[QueueReader, str]] = []
        self._sent = 0.0
        #: A poll's reply was lost: the next one asks each queue what was
        #: delivered to this member that it does not know of.
        self._resync = False
        #: What was delivered and not handed to the runtime yet.
        self._batches = ReadyBatches(owned.who)
        #: Says so when the server lost the group's data (a FLUSHALL, ...).
        self._lost_data = LostData(conn, owned.group)
        self.channels = (membership.channel, conn.notify_channel(retry_topic(owned.group)))

    @property
    def session_timeout(self) -> float:
        return self._members.session_timeout

    def owned_for(self) -> dict[MessageQueue, float]:
        ttl = certain_for(self._members.session_timeout)
        now = time.monotonic()
        return {q: s.renewed + ttl - now for q, s in self._shares.items()}

    def subscribe(self, topic: str) -> None:
        """Record the group's balance (``ConfigError`` when its live members
        use the other), join its registry on ``topic`` too; the next poll
        joins the topic's queues."""
        self._members.claim_balance(Balance.MESSAGE)
        self._subscribed.append(topic)
        self._members.heartbeat([], self._subscribed)
        self._pending = True

    def stale(self) -> bool:
        return self._pending or bool(self._evicted)

    def renew_in(self) -> float | None:
        """Seconds until the group registry's heartbeat is due (once subscribed)."""
        return self._members.heartbeat_in() if self._subscribed else None

    # -- joining and leaving queues -------------------------------------------------

    def refresh(self, replies: Sequence[Any] = (), rebalance: bool = True) -> bool:
        """Give up the queues whose session lapsed, join the subscribed
        topics' queues not joined yet, and renew the registry entry when
        its interval is up; return whether the owned queues changed (with
        ``rebalance`` False: whether any of that is due, left undone)."""
        if not rebalance:
            due = self._members.heartbeat_in() <= 0
            return self.stale() or (due and bool(self._subscribed))
        owned = self._owned
        changed = False
        if self._evicted:
            lost = sorted(q for q in self._evicted if q in owned.states)
            self._evicted.clear()
            if lost:
                if not self._lost_data.check(self._subscribed):  # the server lost the group's data: said
                    logger.warning(
                        "group %r: %r's session lapsed on %s; its messages there went to others, it joins again",
                        owned.group,
                        owned.client_id,
                        [str(q) for q in lost],
                    )
                owned.notify("on_revoked", lost)
                owned.drop(lost)
                for q in lost:
                    del self._shares[q]
                    self._batches.drop(q)  # the others have them now
                changed = self._pending = True
        if self._members.heartbeat_in() <= 0 and self._subscribed:
            self._members.heartbeat([], self._subscribed)
            self._members.store_positions({q: s.base for q, s in self._shares.items()})
        if self._pending:
            new = sorted(q for t in self._subscribed for q in self._topics.get(t).queues if q not in owned.states)
            if new:
                self._join(new)
                owned.notify("on_assigned", new)
                changed = True
            self._pending = False
        return changed

    def _join(self, queues: list[MessageQueue]) -> None:
        conn = self._conn
        keys = {q: grain_keys(conn, self._owned.group, q) for q in queues}
        pipe = conn.pipeline()
        for q in queues:
            pipe.exists(keys[q][1])
        read = pipe.execute()
        starts = {
            q: 0 if int(e) else self._members.start_position(q, self._topics) for q, e in zip(queues, read, strict=True)
        }
        self._members.say_skipped()
        pipe = conn.pipeline()
        tokens = {}
        for q in queues:
            self._generation += 1
            tokens[q] = f"{self._owned.client_id}/{self._generation}"
            join = [tokens[q], self._ttl_ms, 0, PARK_LIMIT, "1", starts[q], starts[q]]  # want 0: only join
            conn.run(conn.grain_dispatch, keys[q], join, pipe)
        sent = time.monotonic()
        replies = pipe.execute()
        states = []
        for q, r in zip(queues, replies, strict=True):
            base = int(r[1])
            self._shares[q] = Share(tokens[q], keys[q], sent, base, text(r[2]))
            states.append(self._reader(q, base))
        self._owned.add(states)

    # -- reading -----------------------------------------------------------------------

    def replies_lost(self) -> None:
        """A poll failed: its dispatches may have delivered messages whose
        reply never came.  The next poll asks for them (RESYNC)."""
        self._resync = True

    def queue_reads(self, pipe: Any, order: Sequence[QueueReader], want: int, *, loaded: bool = False) -> int:
        """Queue on the poll's pipeline a DISPATCH of up to ``want``
        messages for each queue of ``order``, proposing what its read-ahead
        holds (topped up first, in a round trip of its own, where it is
        shorter than a proposal), a session renewal for each paused queue
        due one (after a lost reply, first a RESYNC of every owned queue),
        and the next read ahead of each queue of ``order`` short of
        :func:`ahead_size` entries; return how many replies that adds.
        ``loaded``: bare EVALSHAs (see :meth:`.Connection.run`)."""
        conn, ttl, shares = self._conn, self._ttl_ms, self._shares
        self._resyncing.clear()
        if self._resync:
            for q, s in shares.items():
                conn.run(conn.grain_resync, s.keys, [s.token, *map(str, s.records)], pipe, loaded=loaded)
                self._resyncing.append(q)
        short = [st for st in order if len(shares[st.mq].ahead) < want + shares[st.mq].extra]
        if short:
            self._read_ahead(short, want)
        for st in order:
            s = shares[st.mq]
            s.proposed, args = s.ahead.proposal(want + s.extra)
            conn.run(conn.grain_dispatch, s.keys, [s.token, ttl, want, PARK_LIMIT, "0", 0, *args], pipe, loaded=loaded)
        n = len(order)
        self._renewing.clear()
        now = time.monotonic()
        for q, st in self._owned.states.items():
            s = shares[q]
            if (st.paused or q in self.stalled) and now - s.renewed >= self._members.heartbeat_interval / 2:
                conn.run(conn.grain_renew, s.keys, [s.token, ttl], pipe, loaded=loaded)
                self._renewing.append(q)
        size = ahead_size(want)
        self._reading = [(st, shares[st.mq].ahead.read_from()) for st in order if len(shares[st.mq].ahead) < size]
        for st, start in self._reading:
            pipe.xrange(st.log_key, "(" + start, "+", count=size)
        self._sent = now
        return len(self._resyncing) + n + len(self._renewing) + len(self._reading)

    def _read_ahead(self, short: Sequence[QueueReader], want: int) -> None:
        """Read on, past what each queue of ``short`` holds read ahead (one
        round trip)."""
        pipe = self._conn.pipeline(reader=True)
        reads = [(st, self._shares[st.mq].ahead.read_from()) for st in short]
        for st, start in reads:
            pipe.xrange(st.log_key, "(" + start, "+", count=ahead_size(want))
        self._keep_read(reads, pipe.execute())

    def _keep_read(self, reads: Sequence[tuple[QueueReader, str]], replies: Sequence[Any]) -> None:
        ns = self._conn.namespace
        for (st, start), entries in zip(reads, replies, strict=True):
            share = self._shares.get(st.mq)
            if share is not None:
                share.ahead.add(ns, st.mq, entries, self._tags(st.mq.topic), start)

    def collect(
        self,
        order: Sequence[QueueReader],
        replies: Sequence[Any],
        store_malformed: Callable[[list[tuple[MessageExt, str]]], None],
    ) -> None:
        """Turn what :meth:`queue_reads` queued into batches, ready for
        :meth:`take_ready`, recording what was delivered and which sessions
        lapsed.  Entries that cannot be decoded go to ``store_malformed``
        (the dead-letter queue); until they are stored they stay this
        member's, unacknowledged."""
        shares, sent, ns = self._shares, self._sent, self._conn.namespace
        r = len(self._resyncing)
        n = len(order)
        w = len(self._renewing)
        for q, ok in zip(self._renewing, replies[r + n : r + n + w], strict=True):
            if int(ok):
                shares[q].renewed = sent
            else:
                self._evicted.add(q)
        got: dict[MessageQueue, tuple[list[MessageExt], list[tuple[MessageExt, str]]]] = {}
        for q, rep in zip(self._resyncing, replies[:r], strict=True):
            if not int(rep[0]):
                self._evicted.add(q)
                continue
            msgs, qbad = [], []
            for rid, entries in rep[1]:
                m, b = shares[q].delivered(ns, q, int(rid), entries, [])
                msgs += m
                qbad += b
            got[q] = msgs, qbad
        self._resync = False
        for st, rep in zip(order, replies[r : r + n], strict=True):
            q = st.mq
            s = shares[q]
            if not int(rep[0]):
                self._evicted.add(q)
                s.lapsed(rep)
                continue
            s.renewed = sent
            msgs, qbad = s.dispatched(ns, q, rep)
            if msgs or qbad:
                if q in got:  # resynced too
                    msgs, qbad = got[q][0] + msgs, got[q][1] + qbad
                got[q] = msgs, qbad
        self._keep_read(self._reading, replies[r + n + w :])
        for q in self._evicted:
            got.pop(q, None)
        self._batches.put(got, self._owned.states, shares, self._resyncing, store_malformed)

    def take_ready(self) -> list[PollBatch]:
        """The batches collected and not handed to the runtime yet
        (:class:`.ReadyBatches`)."""
        return self._batches.take(self._shares)

    @property
    def stalled(self) -> set[MessageQueue]:
        """Queues whose ready messages wait past a jump of offsets (not
        dispatched meanwhile, their sessions renewed as paused ones)."""
        return self._batches.stalled

    # -- acknowledging -------------------------------------------------------------------

    def commit(self, entries: Mapping[MessageQueue, OffsetAndMetadata]) -> None:
        """Acknowledge, per queue, the offsets delivered to this member
        below the committed offset or finished in its offset map."""
        conn = self._conn
        pipe = conn.pipeline()
        sent: list[tuple[MessageQueue, Share, list[int]]] = []
        for q, om in entries.items():
            s = self._shares.get(q)
            if s is None or not s.rid_of:
                continue
            fin = None
            if om.metadata:
                try:
                    fin = decode_map(om.metadata, om.offset)
                except OffsetMapError as e:
                    logger.debug("%r: commit of %s: metadata is not an offset map (%s)", self._owned.who, q, e)
            excluded = s.unstored | self._batches.waiting(q)  # not in the runtime yet: not its to acknowledge
            for args, offs in s.ack_calls(om.offset, fin, excluded, ACK_CHUNK):
                conn.run(conn.grain_ack, s.keys, [s.token, *args], pipe)
                sent.append((q, s, offs))
        if not sent:
            return
        for (q, s, offs), r in zip(sent, pipe.execute(), strict=True):
            s.acked(offs)
            s.base = int(r[1])
            refused = len(offs) - int(r[0])
            if refused > 0:
                logger.debug("%r: %d acknowledgement(s) of %s ignored: its session lapsed", self._owned.who, refused, q)
            if not int(r[2]):
                self._evicted.add(q)

    def committed(self, queue: MessageQueue) -> OffsetAndMetadata | None:
        """The group's committed position of ``queue``: its lowest offset
        not acknowledged by any member."""
        return grain_position(self._conn, self._owned.group, queue)

    # -- locks, retries, leaving -------------------------------------------------------

    def lock(self, queues: Collection[MessageQueue], lease: float) -> frozenset[MessageQueue]:
        return self._members.lock(queues, lease)

    def unlock(self, queues: Collection[MessageQueue]) -> None:
        self._members.unlock(queues)

    def send_back(self, items: Sequence[tuple[MessageExt, int]]) -> list[BaseException | None]:
        """The copies wait in the group's schedule until due, then a poll
        moves them to ``%RETRY%<group>`` (the runtime retries a
        message-grain member's failures itself, so only tools call this)."""
        return self._retries.store_retries(self._owned.group, items)

    def close(self) -> None:
        """Leave every queue (its delivered messages go to the others at
        once: the member's listener calls have ended) and the registry."""
        conn = self._conn
        if self._shares:
            pipe = conn.pipeline()
            for s in self._shares.values():
                conn.run(conn.grain_quit, s.keys, [s.token], pipe)
            pipe.execute()
        self._members.store_positions({q: s.base for q, s in self._shares.items()})
        self._shares.clear()
        self._members.leave((), member=bool(self._subscribed))
