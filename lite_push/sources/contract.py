"""The source contract: what the runtime needs from a message log.

A source behaves like RocketMQ's ``DefaultLitePullConsumer`` or Kafka's
``KafkaConsumer``: the group's queues are spread over its members by an
allocation strategy, the member polls batches from the queues it owns, pauses
and resumes queues for flow control, and commits the next offset to consume.
That is balancing by queue (:attr:`Balance.QUEUE`, every source); a source
may balance by message instead (:attr:`Balance.MESSAGE`, the Redis source):
:attr:`PullSource.balance` says what changes for polls and commits.

Threading: a source is owned by one thread (lite_push's pull thread).  Only
:meth:`PullSource.wakeup` may be called from another thread.  Rebalance
callbacks run inside :meth:`PullSource.poll`, on the owning thread, so the
owner may commit from ``on_revoked`` before the queue is released to another
member.  Inside ``on_revoked`` the revoked queues are still owned
(``position``, ``seek`` and ``commit`` work on them); inside ``on_assigned``
the new queues are owned and ``position`` tells where they start.

Liveness: a member that does not poll for longer than the source's session
timeout may be evicted; its queues then move without its ``on_revoked``
running first, and its later commits of them are ignored.  Callbacks must
therefore return well within the session timeout (lite_push bounds its
``on_revoked`` by ``revoke_timeout``).  :meth:`PullSource.owned_for` says how
long ownership is certain, so a member stops starting work on its queues
before another member may take them (fencing).

Failures: a consumer hands a message it could not process back to the source.
:meth:`PullSource.send_back` stores a copy in the group's retry topic
``%RETRY%<group>`` that becomes visible only after a delay (RocketMQ's delay
levels), with ``reconsume_times`` one higher; :meth:`PullSource.send_to_dlq`
stores it at once in the dead-letter topic ``%DLQ%<group>``.  Both copies carry
the bookkeeping properties named below, so a dead letter says where it came
from (``lite_push.dlq`` reads them).  Retry and dead-letter topics have one
queue and exist as soon as anything was sent to them or anyone subscribed to
them; they are read with the normal API, or by offset without joining a
group through :meth:`PullSource.dead_letter_reader` (a
:class:`DeadLetterReader`).

Dead letters that keep a key's order (``dead_letter_order="key"``) carry
:data:`HELD_KEY` (and, when the key was held already, :data:`HELD_BEHIND`);
``lite_push.dlq.resend_key`` marks its copies with :data:`RESENT_OF` and
writes a release record (:data:`RELEASED_KEY`) into the dead-letter topic.
``lite_push.dlq.record_resent`` (``lite-push dlq resend``) writes a resend
record (:data:`RESENT_LETTERS`) there after sending dead letters back.
"""

from __future__ import annotations

import abc
import datetime
import enum
from collections.abc import Collection, Mapping, Sequence
from typing import Literal, Protocol, TypeAlias, runtime_checkable

from .._types import MessageExt, MessageQueue, OffsetAndMetadata, PollBatch
from .retry_topics import (
    BOOKKEEPING_PROPERTIES,
    DEFAULT_DELAY_LEVELS,
    DLQ_EXCEPTION,
    DLQ_GROUP,
    DLQ_PREFIX,
    DLQ_REASON,
    HELD_BEHIND,
    HELD_KEY,
    ORIGIN_MESSAGE_ID,
    ORIGIN_OFFSET,
    ORIGIN_QUEUE_ID,
    ORIGIN_TOPIC,
    REAL_TOPIC,
    RECONSUME_TIME,
    RELEASED_KEY,
    RELEASED_THROUGH,
    RESENT_LETTERS,
    RESENT_OF,
    RESENT_TO,
    RETRY_PREFIX,
    RETRY_TOPIC,
    TIMER_DELIVER_MS,
    dlq_topic,
    is_retry_or_dlq_topic,
    origin_properties,
    reconsume_times_of,
    retry_topic,
)

__all__ = [
    "BOOKKEEPING_PROPERTIES",
    "DEFAULT_DELAY_LEVELS",
    "DLQ_EXCEPTION",
    "DLQ_GROUP",
    "DLQ_PREFIX",
    "DLQ_REASON",
    "HELD_BEHIND",
    "HELD_KEY",
    "ORIGIN_MESSAGE_ID",
    "ORIGIN_OFFSET",
    "ORIGIN_QUEUE_ID",
    "ORIGIN_TOPIC",
    "REAL_TOPIC",
    "RECONSUME_TIME",
    "RELEASED_KEY",
    "RELEASED_THROUGH",
    "RESENT_LETTERS",
    "RESENT_OF",
    "RESENT_TO",
    "RETRY_PREFIX",
    "RETRY_TOPIC",
    "TIMER_DELIVER_MS",
    "Balance",
    "ConsumeFrom",
    "ConsumeFromWhere",
    "DeadLetterReader",
    "MessageModel",
    "PullSource",
    "RebalanceListener",
    "dlq_topic",
    "is_retry_or_dlq_topic",
    "origin_properties",
    "reconsume_times_of",
    "retry_topic",
]


@runtime_checkable
class DeadLetterReader(Protocol):
    """Anything whose stored messages can be read by offset range without
    joining a consumer group (an ``EmbeddedBroker``, a ``RedisBroker``, a
    ``KafkaBroker``, and what :meth:`PullSource.dead_letter_reader`
    returns)."""

    def queues(self, topic: str) -> list[MessageQueue]:
        """The queues of ``topic``; ``UnknownTopicError`` when it has none."""
        ...

    def messages(self, queue: MessageQueue, start: int = 0, stop: int | None = None) -> list[MessageExt]:
        """The stored messages of ``queue`` at offsets ``[start, stop)``."""
        ...


class ConsumeFromWhere(enum.Enum):
    """Where a group that has no committed offset for a queue starts."""

    #: The end of the queue at the moment the group first owns it.
    LAST_OFFSET = "LAST_OFFSET"
    #: The first message still stored.
    FIRST_OFFSET = "FIRST_OFFSET"
    #: The first message stored at or after ``consume_timestamp`` (ms).
    TIMESTAMP = "TIMESTAMP"


#: Where a new group starts, as ``pull_consumer(consume_from=...)`` takes
#: it: a :class:`ConsumeFromWhere`, ``"first"`` or ``"last"`` (as the
#: command line's ``--from``), or a :class:`~datetime.datetime` (the first
#: message stored at or after it; a naive one is local time).
ConsumeFrom: TypeAlias = ConsumeFromWhere | Literal["first", "last"] | datetime.datetime


class MessageModel(enum.Enum):
    """How a group's members share its queues (RocketMQ's ``MessageModel``)."""

    #: Each queue is owned by one member at a time (allocated by the
    #: strategy, moved on rebalance); the group's offsets live in the broker.
    CLUSTERING = "CLUSTERING"
    #: Every member reads every queue and keeps its own offsets in a local
    #: file (:mod:`lite_push.sources.local_offsets`).  No rebalance, no queue
    #: locks, no retry topic: a failed message is retried by the member that
    #: failed it.
    BROADCASTING = "BROADCASTING"


class Balance(enum.Enum):
    """How a CLUSTERING group spreads its messages over its members
    (:attr:`PullSource.balance`); a source that cannot balance one way
    refuses it at construction with a ``ConfigError`` naming ``balance``."""

    #: By queue (the default; every source): one queue, one member.  The
    #: allocation strategy decides which member owns which queue; a revoke
    #: drains and commits before the next owner starts (RocketMQ 4.x).
    QUEUE = "QUEUE"
    #: By message (the Redis source only): any member may receive any
    #: message of any queue; a key is held by one member while that member
    #: has delivered, unacknowledged messages of it, and goes to whichever
    #: member asks next once it has none (RocketMQ 5's message-grain
    #: balancing, with a per-key hold instead of its per-queue lock).  The
    #: key is the message's ``keys``, as the producer set it, so a consumer
    #: on such a source refuses a ``key_extractor``.
    MESSAGE = "MESSAGE"


class RebalanceListener:
    """Told when the queues a member owns change.  Both methods run inside
    :meth:`PullSource.poll` on the owning thread.  The default does nothing."""

    def on_revoked(self, queues: Collection[MessageQueue]) -> None:
        """These queues are about to go to another member.  When this returns,
        the source releases them: commit their final offsets here."""

    def on_assigned(self, queues: Collection[MessageQueue]) -> None:
        """These queues now belong to this member; polls (this one included)
        read them from their committed offset, or from the group's start
        position when it has none."""


class PullSource(abc.ABC):
    """A member of a consumer group on a partitioned log."""

    @property
    def group(self) -> str | None:
        """The consumer group this member belongs to (``None``: a source
        without groups).  A consumer built on the source must name the same
        group: retries go to ``%RETRY%<group>`` of this one."""
        return None

    @property
    def session_timeout(self) -> float | None:
        """Seconds a member may go without renewing its ownership (a
        heartbeat) before the group gives its queues to another member
        (``None``: a source without sessions, whose ownership never lapses).
        A consumer checks at construction that its ``revoke_timeout`` and
        ``fence_margin`` fit inside it."""
        return None

    def owned_for(self) -> Mapping[MessageQueue, float]:
        """Fencing: for each owned queue, how many seconds from now this
        member's ownership is certain (its last successful renewal, taken
        as the moment the renewal was *sent*, plus the session timeout,
        minus now; negative once it lapsed).  Until then no other member
        can own the queue; after it, another may.  Queues left out are
        owned without a time limit (the default: a source without
        sessions).  Called by the owning thread after every poll; the
        runtime starts no listener call for a queue past this time."""
        return {}

    @property
    def delayed_delivery(self) -> bool:
        """Whether :meth:`send_back` holds a copy until its delay level has
        passed (True, the default: RocketMQ, the embedded broker, Redis).
        A source without delayed delivery (Kafka) returns False and stores
        the copy at once; the runtime then holds the failed message on its
        own timer for the delay and calls :meth:`send_back` only when it is
        due, its offset unfinished meanwhile."""
        return True

    @property
    def assignment_is_lock(self) -> bool:
        """Whether owning a queue already excludes every other member of
        the group from it (Kafka: one owner per partition), so
        :meth:`lock` grants exactly the asked queues this member owns and
        the lease is only checked.  False (the default): queue locks are
        taken and renewed at the broker, apart from the assignment."""
        return False

    @property
    def metadata_limit(self) -> int | None:
        """The most commit metadata (the offset map) the source stores, in
        bytes (Kafka: ``offset.metadata.max.bytes``, 4,096 by default), or
        None for no limit.  The consumer pauses a queue before its map
        could outgrow it; :meth:`commit` cuts a longer map to a prefix that
        fits rather than fail."""
        return None

    def queue_count(self, topic: str) -> int | None:
        """How many queues ``topic`` has, if the source can tell cheaply
        (None otherwise).  The runtime uses it to warn when its lanes and
        the producers' hash queue selector leave lanes idle."""
        return None

    @property
    def message_model(self) -> MessageModel:
        """CLUSTERING (the default) or BROADCASTING.  A BROADCASTING member
        owns every queue of its topics, commits to its own local file,
        holds every lock it asks for, and refuses :meth:`send_back` (the
        runtime retries its failures itself)."""
        return MessageModel.CLUSTERING

    @property
    def balance(self) -> Balance:
        """How the group spreads messages over its members: QUEUE (the
        default: one queue, one member) or MESSAGE (see :class:`Balance`).

        A MESSAGE source may deliver to a member, for one queue, offsets
        that are not contiguous (other members take the rest) and, after
        another member's session lapsed, offsets below ones it delivered
        before.  :meth:`commit` then means "acknowledge the messages
        delivered to me below the offset, or finished in the offset map",
        not "everything below it is done"."""
        return Balance.QUEUE

    @abc.abstractmethod
    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume ``topic``.  ``expression`` filters by tag: ``"*"`` (all) or
        ``"TagA || TagB"``.  Filtered messages are skipped by the source; they
        still advance :attr:`PollBatch.next_offset`.  A retry or dead-letter
        topic (a name starting with ``%RETRY%`` or ``%DLQ%``) that does not
        exist yet is created (one queue), so a group can subscribe to them
        before anything was sent there.  Raises ``UnknownTopicError`` for any
        other topic the source does not have and ``ValueError`` for a
        malformed expression."""

    @abc.abstractmethod
    def set_rebalance_listener(self, listener: RebalanceListener | None) -> None:
        """Install the listener told of assignment changes (replaces any)."""

    @property
    @abc.abstractmethod
    def rebalance_listener(self) -> RebalanceListener | None:
        """The listener installed, or None (a consumer refuses a source that
        has one: it installs its own, and refuses to start if another
        replaced it)."""

    @abc.abstractmethod
    def poll(self, timeout: float, max_per_queue: int = 32) -> list[PollBatch]:
        """Return the next messages of the owned, unpaused queues.

        At most ``max_per_queue`` messages per queue and at most one batch per
        queue per call; batches of one queue are contiguous across calls (each
        starts at the previous ``next_offset`` unless :meth:`seek` moved it;
        not so from a source that balances by message: see :attr:`balance`).
        Blocks up to ``timeout`` seconds when nothing is ready; returns ``[]``
        on timeout or after :meth:`wakeup`.  Never blocks longer than
        ``timeout``.  Runs the rebalance listener first when the assignment
        changed.  Raises ``SourceClosedError`` after :meth:`close`."""

    def poll_nowait(self, max_per_queue: int = 32) -> list[PollBatch] | None:
        """What :meth:`poll` would return at once, for the event loop's own
        thread: never waits (beyond a read of what is ready, one round trip
        at most) and never runs the rebalance listener.  ``None`` means
        "call :meth:`poll` now, from a thread that may block": a rebalance
        is due (its listener waits for listener calls that run on that very
        loop), or the source cannot read without waiting.  The same owning
        thread rules as :meth:`poll`: the two are never called at once.
        The default is ``None``: every read goes through :meth:`poll`."""
        return None

    def prefetch(self, max_per_queue: int = 32) -> None:
        """Start the read the next :meth:`poll_nowait` returns, and return
        at once: a source whose reads wait on a server (Redis) sends it now,
        so the server builds the reply while the event loop runs the lanes.
        The next ``poll_nowait`` takes that reply if it still fits (the same
        queues owned, unpaused and read from the same positions, the same
        ``max_per_queue``) and reads afresh otherwise; :meth:`poll` and
        :meth:`close` drop it.  Never raises for a read that failed (the
        next read meets the error).  The same owning thread rules as
        :meth:`poll`.  The default does nothing."""
        return None

    @abc.abstractmethod
    def assignment(self) -> frozenset[MessageQueue]:
        """The queues this member owns now."""

    @abc.abstractmethod
    def pause(self, queues: Collection[MessageQueue]) -> None:
        """Stop returning messages of these queues from :meth:`poll` until they
        are resumed.  The read position is kept.  Queues not owned are
        ignored."""

    @abc.abstractmethod
    def resume(self, queues: Collection[MessageQueue]) -> None:
        """Undo :meth:`pause`.  Queues not paused are ignored."""

    @abc.abstractmethod
    def paused(self) -> frozenset[MessageQueue]:
        """The owned queues that are paused now."""

    @abc.abstractmethod
    def seek(self, queue: MessageQueue, offset: int) -> None:
        """Make the next poll of ``queue`` start at ``offset`` (clamped to the
        stored range).  Raises ``NotSubscribedError`` if not owned."""

    @abc.abstractmethod
    def position(self, queue: MessageQueue) -> int:
        """The offset the next poll of ``queue`` starts at.  Raises
        ``NotSubscribedError`` if not owned."""

    def end_offsets(self, queues: Collection[MessageQueue]) -> dict[MessageQueue, int]:
        """The offset after the last stored message of each queue (what the
        lag metric subtracts the committed offset from).  Callable from any
        thread.  A source that cannot tell leaves queues out (this default
        knows none)."""
        return {}

    @abc.abstractmethod
    def commit(self, offsets: Mapping[MessageQueue, OffsetAndMetadata | int]) -> None:
        """Store, for the group, the next offset to consume of each queue
        (everything below it is done; from a source that balances by message,
        what was delivered to this member below it: see :attr:`balance`).
        A plain ``int`` means no metadata.
        Commits for queues not owned are ignored (a late commit of a revoked
        queue must not move the new owner back).  A group that refuses the
        commit (a Kafka coordinator in a rebalance) raises
        :class:`~lite_push.CommitRefusedError`: nothing was stored."""

    @abc.abstractmethod
    def committed(self, queue: MessageQueue) -> OffsetAndMetadata | None:
        """The group's committed position of ``queue``, or ``None``."""

    def committed_all(self, queues: Collection[MessageQueue]) -> dict[MessageQueue, OffsetAndMetadata]:
        """The group's committed positions of ``queues`` (those with none
        are left out), read from where the group keeps them: what a stop
        reports as committed.  One :meth:`committed` each by default; a
        source with a batch read overrides it."""
        out: dict[MessageQueue, OffsetAndMetadata] = {}
        for q in queues:
            c = self.committed(q)
            if c is not None:
                out[q] = c
        return out

    @abc.abstractmethod
    def lock(self, queues: Collection[MessageQueue], lease: float) -> frozenset[MessageQueue]:
        """Take or renew the group's broker-side lock of each queue for this
        member, for ``lease`` seconds (RocketMQ's ``lockBatchMQ``); return
        the queues it now holds.  A queue locked by another member whose
        lease has not run out is not granted.  Orderly consumers process a
        queue only while they hold its lock."""

    @abc.abstractmethod
    def unlock(self, queues: Collection[MessageQueue]) -> None:
        """Release this member's locks of these queues (others' are kept)."""

    # failures: retry and dead-letter topics

    @property
    @abc.abstractmethod
    def delay_levels(self) -> tuple[float, ...]:
        """The source's delay levels in seconds: level ``n`` (1-based) of
        :meth:`send_back` waits ``delay_levels[n - 1]``.  Non-empty, every
        value positive (default :data:`DEFAULT_DELAY_LEVELS`)."""

    @abc.abstractmethod
    def send_back(self, items: Sequence[tuple[MessageExt, int]]) -> list[BaseException | None]:
        """Store a copy of each failed ``(message, delay_level)`` in this
        member's group retry topic ``%RETRY%<group>`` (created if missing),
        visible there only once the level's delay has passed.

        The copy has the message's body, keys, tags and properties, plus the
        origin bookkeeping (see :func:`origin_properties`: a message that
        came from a retry topic keeps its first origin), and
        ``reconsume_times = message.reconsume_times + 1`` (also stored as
        :data:`RECONSUME_TIME`).  Levels above the last are clamped to the
        last; a level < 1 is a ``ValueError`` for that item.

        Returns one entry per item, in order: ``None`` when the copy is
        stored, else the exception that failed that item (the other items
        are still stored).  The whole batch is stored at once (one lock, one
        write), not message by message.  Raises ``SourceClosedError`` after
        :meth:`close`."""

    @abc.abstractmethod
    def send_to_dlq(self, items: Sequence[tuple[MessageExt, str, str]]) -> list[BaseException | None]:
        """Store each ``(message, reason, exception_text)`` at once in this
        member's group dead-letter topic ``%DLQ%<group>`` (one queue, created
        if missing).  The copy has the message's body, keys, tags and
        properties, the origin bookkeeping (as :meth:`send_back`), and
        :data:`DLQ_REASON`, :data:`DLQ_EXCEPTION` (may be ``""``),
        :data:`DLQ_GROUP` and :data:`RECONSUME_TIME` (the message's
        ``reconsume_times``).  Results and batching as :meth:`send_back`."""

    def dead_letter_reader(self) -> DeadLetterReader | None:
        """What reads this member's group dead-letter topic by offset
        without joining a group (``None``, the default: the source cannot).
        A consumer with ``dead_letter_order="key"`` needs one: it reads the
        held keys back from the dead-letter topic when it gains queues."""
        return None

    # lifecycle

    @abc.abstractmethod
    def wakeup(self) -> None:
        """Make a blocked or the next :meth:`poll` return at once.  The only
        method that may be called from any thread."""

    @abc.abstractmethod
    def close(self) -> None:
        """Leave the group: release the owned queues (without committing;
        commit first) so the other members take them.  Idempotent."""
