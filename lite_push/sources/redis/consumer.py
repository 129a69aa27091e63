"""RedisPullConsumer: a member of a consumer group on Redis Streams.

It reads its owned queues' streams (one pipelined round trip per poll, with
the group's version and the due-retry move), decodes the entries
(:mod:`.codec`) and leaves everything about the group -- heartbeats, owner
keys, start positions, commits, locks -- to its :class:`~.membership.Membership`.

Blocking: a poll with nothing to read waits on a ``threading.Event``, at
most a short slice (0.25 s, and never past the timeout or the next due
retry), then reads again.  The event is set by ``wakeup()`` and by a
per-consumer :class:`~.notifier.Notifier` subscribed to the group's events
channel and to the notify channel of every subscribed topic (and of the
group's retry topic).

Errors: a dropped connection is logged once per episode; the poll returns []
after a back-off, and the next one resumes at the positions it had (nothing
is lost: positions move only after a successful read).  A rebalance that
fails half way keeps the revoked queues' owner keys in ``_unreleased`` and
releases them on the next attempt (their on_revoked is not called twice).
"""

from __future__ import annotations

import gc
import logging
import math
import os
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

from ..._errors import ConfigError, SourceClosedError, UnknownTopicError
from ..._types import MessageExt, MessageQueue, OffsetAndMetadata, PollBatch
from ...rebalance.allocate import AVERAGELY, AllocateStrategy
from .._base import ConsumeFromWhere, MessageModel, PullSource, RebalanceListener, is_retry_or_dlq_topic, retry_topic
from .._common import (
    QueueStates,
    check_lease,
    check_message_model,
    commit_entries,
    no_send_back,
    open_offset_store,
    parse_tag_expression,
)
from .connection import CONN_ERRORS, Outage
from .membership import Membership
from .notifier import Notifier
from .reading import SCAN_EXTRA, QueueReader, read_into

if TYPE_CHECKING:
    from .broker import RedisBroker

__all__ = ["RedisPullConsumer"]

logger = logging.getLogger(__name__)

#: Longest sleep of a waiting poll between two reads (seconds); pub/sub
#: notifications usually end it sooner.
_WAIT_SLICE = 0.25
_MIN_WAIT = 0.001
#: A poll that may read at least this many entries runs with the cyclic GC
#: paused while it parses and decodes them.
_GC_PAUSE_MIN = 256


def _check_arguments(group: object, consume_from: object, client_id: object, allocate: object) -> None:
    """A consumer's arguments, checked at construction: ``ConfigError``
    naming the first bad one."""
    if not isinstance(group, str) or not group:
        raise ConfigError("group", f"must be a non-empty string, got {group!r}")
    if not isinstance(consume_from, ConsumeFromWhere):
        raise ConfigError("consume_from", f"must be a ConsumeFromWhere, got {consume_from!r}")
    if client_id is not None and (not isinstance(client_id, str) or not client_id):
        raise ConfigError("client_id", f"must be a non-empty string, got {client_id!r}")
    if not callable(allocate):
        raise ConfigError("allocate", f"must be an allocation strategy, got {allocate!r}")


class RedisPullConsumer(QueueStates[QueueReader], PullSource):
    """A member of a consumer group on a :class:`RedisBroker`; see
    :class:`~lite_push.sources.PullSource`.  Owned by one thread; only
    :meth:`wakeup` may be called from others."""

    _broker: RedisBroker

    def __init__(
        self,
        broker: RedisBroker,
        group: str,
        *,
        consume_from: ConsumeFromWhere = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp: int | None = None,
        client_id: str | None = None,
        allocate: AllocateStrategy = AVERAGELY,
        message_model: MessageModel = MessageModel.CLUSTERING,
        offset_file: str | os.PathLike[str] | None = None,
    ) -> None:
        check_message_model(message_model, offset_file)
        _check_arguments(group, consume_from, client_id, allocate)
        broker.check_open()
        self._broker = broker
        self._conn = broker.conn
        self._group = group
        self._cid: str = client_id if client_id is not None else broker.new_client_id()
        timeout = broker.session_timeout
        self._members = Membership(broker.conn, group, self._cid, timeout, consume_from, consume_timestamp)
        self._store_malformed = partial(broker.retries.store_malformed, group)  # entries a poll cannot decode
        self._allocate = allocate
        self._listener: RebalanceListener | None = None
        self._filters: dict[str, frozenset[str] | None] = {}
        self._states: dict[MessageQueue, QueueReader] = {}
        self._active: list[QueueReader] = []
        self._rr = 0
        self._seen_version: bytes | None = None
        self._pending = False
        # revoked after on_revoked, whose owner keys could not be deleted yet
        self._unreleased: set[MessageQueue] = set()
        self._last_rebalance = -math.inf
        self._locks: set[MessageQueue] = set()
        self._wakeup_flag = False
        self._event = threading.Event()
        self._closed = False
        self._outage = Outage(self)
        self._notifier: Notifier | None = None
        # BROADCASTING: every queue, offsets in a local file (opened last:
        # it locks the file, and nothing above may fail after that)
        self._store = None
        broker.register(self)
        try:
            self._store = open_offset_store(message_model, offset_file, broker.broker_name, group)
        except BaseException:
            broker.unregister(self)
            raise

    # -- identity -------------------------------------------------------------

    @property
    def group(self) -> str:
        return self._group

    @property
    def client_id(self) -> str:
        return self._cid

    @property
    def session_timeout(self) -> float | None:
        return None if self._store is not None else self._broker.session_timeout

    def owned_for(self) -> dict[MessageQueue, float]:  # BROADCASTING: no sessions
        return {} if self._store is not None else self._members.owned_for(self._states)

    def queue_count(self, topic: str) -> int | None:
        t = self._broker.cached_topic(topic)  # cached by subscribe; no Redis call
        return len(t.queues) if t is not None else None

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"<RedisPullConsumer {self._group!r}/{self._cid!r}{' closed' if self._closed else ''}>"

    def _check_open(self) -> None:
        if self._closed:
            raise SourceClosedError(f"consumer {self._cid!r} of group {self._group!r} is closed")

    # -- subscription ---------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*") -> None:
        self._check_open()
        tags = parse_tag_expression(expression)
        broker = self._broker
        try:
            broker.topic(topic)
        except UnknownTopicError:
            if not is_retry_or_dlq_topic(topic):
                raise
            broker.ensure_topic(topic, 1)
        new = topic not in self._filters
        if new:
            if self._notifier is None:
                self._notifier = Notifier(self._conn.client, self._event, f"lite-push-redis-notify-{self._cid}")
                if self._store is None:
                    self._notifier.add(self._members.channel)
                    self._notifier.add(self._conn.notify_channel(retry_topic(self._group)))
            self._notifier.add(self._conn.notify_channel(topic))
        self._filters[topic] = tags
        for st in self._states.values():
            if st.mq.topic == topic:
                st.tags = tags
        if new:
            if self._store is not None:
                self._pending = True  # the next poll takes the topic's queues
            else:
                self._members.heartbeat(sorted(self._states), self._filters)  # join: bumps the version
                self._seen_version = None

    def set_rebalance_listener(self, listener: RebalanceListener | None) -> None:
        self._check_open()
        self._listener = listener

    # -- polling --------------------------------------------------------------

    def poll(self, timeout: float, max_per_queue: int = 32) -> list[PollBatch]:
        """See :meth:`PullSource.poll`.  With a tag filter, at most
        ``4 * max_per_queue + 256`` messages of a queue are scanned per call."""
        self._check_open()
        if type(max_per_queue) is not int or max_per_queue < 1:
            raise ValueError(f"max_per_queue must be an int >= 1, got {max_per_queue!r}")
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            self._event.clear()
            if self._wakeup_flag:
                self._wakeup_flag = False
                return []
            try:
                batches, wait_hint = self._poll_once(max_per_queue)
            except CONN_ERRORS as e:
                wait = self._outage.lost(e, deadline - time.monotonic())
                if wait > 0:
                    self._event.wait(wait)
                self._wakeup_flag = False
                return []
            self._outage.ok()
            if batches is None:  # the assignment changed: read again at once
                continue
            if batches:
                return batches
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self._check_open()
            self._event.wait(max(_MIN_WAIT, min(remaining, _WAIT_SLICE, wait_hint)))
            self._check_open()

    def _poll_once(self, max_per_queue: int) -> tuple[list[PollBatch] | None, float]:
        broker = self._broker
        if self._store is not None and self._pending and self._assign_all():
            self._check_open()
            return None, 0.0
        subscribed = bool(self._filters) and self._store is None
        pipe = self._conn.pipeline(reader=True)
        if subscribed:
            pipe.get(self._members.version_key)
        broker.retries.move_due(pipe, self._group)
        active = self._active
        n = len(active)
        if n:
            start = self._rr % n
            self._rr = start + 1
            order = active[start:] + active[:start]
        else:
            order = []
        for st in order:
            count = max_per_queue if st.tags is None else 4 * max_per_queue + SCAN_EXTRA
            pipe.xrange(st.log_key, f"{st.pos + 1}-0", "+", count=count)
        # Parsing and decoding a big read only creates live objects: the
        # cyclic GC is paused meanwhile (else it runs a collection every
        # few hundred entries and costs a third of the read).
        pause = n * max_per_queue >= _GC_PAUSE_MIN and gc.isenabled()
        if pause:
            gc.disable()
        try:
            res = pipe.execute()
        finally:
            if pause:
                gc.enable()
        i = 0
        if subscribed:
            version = res[0]
            i = 1
            now = time.monotonic()
            if (
                version != self._seen_version
                or self._pending
                or now - self._members.last_heartbeat >= broker.heartbeat_interval
                or now - self._last_rebalance >= broker.rebalance_interval
            ):
                if self._rebalance():
                    self._check_open()
                    return None, 0.0
        _moved, nxt = res[i]
        nxt = float(nxt)
        wait_hint = _WAIT_SLICE
        if nxt >= 0:
            wait_hint = max(_MIN_WAIT, nxt / 1000.0 - broker.clock.time())
        out: list[PollBatch] = []
        if pause:
            gc.disable()
        try:
            read_into(out, order, res[i + 1 :], max_per_queue, broker.namespace, self._states, self._store_malformed)
        finally:
            if pause:
                gc.enable()
        return out, wait_hint

    # -- rebalance ------------------------------------------------------------

    def _release(self) -> None:
        """Release the queues revoked (after their on_revoked); kept for the
        next rebalance if Redis fails."""
        if self._unreleased:
            qs = list(self._unreleased)
            self._members.release(qs)
            self._unreleased.difference_update(qs)

    def _rebalance(self) -> bool:
        """Bring the owned set to the target; return whether it changed."""
        broker = self._broker
        self._release()  # what a failed rebalance left
        version, lost, by_topic = self._members.heartbeat(sorted(self._states), self._filters)
        self._last_rebalance = time.monotonic()
        target: set[MessageQueue] = set()
        for topic in self._filters:
            queues = broker.topic(topic).queues
            cids = sorted(set(by_topic.get(topic, ())) | {self._cid})
            share = self._allocate(self._group, self._cid, queues, cids)
            target.update(q for q in share if q.topic == topic)
        lost_set = set(lost)
        drop = [q for q in self._states if q not in target and q not in lost_set]
        revoked = sorted(lost + drop)
        changed = False
        if lost:
            logger.warning("group %r: %r lost %s (its session expired)", self._group, self._cid, [str(q) for q in lost])
        if revoked:
            self._notify("on_revoked", revoked)
            for q in revoked:
                self._states.pop(q, None)
            self._members.forget(revoked)
            self._rebuild_active()
            self._unreleased.update(drop)
            changed = True
            self._release()
        new = sorted(q for q in target if q not in self._states)
        taken: list[MessageQueue] = []
        if new:
            taken = self._members.acquire(new)
            # all positions first: if Redis fails here, nothing is half taken
            # (the owner keys are ours; the next attempt takes them again)
            positions = [self._members.start_position(q, broker) for q in taken]
            self._members.say_skipped()
            for q, pos in zip(taken, positions, strict=True):
                log_key = self._conn.queue_key(q.topic, q.queue_id, "log")
                self._states[q] = QueueReader(q, log_key, pos, self._filters.get(q.topic))
        self._pending = len(taken) < len(new)
        self._seen_version = version
        if changed or taken:
            self._rebuild_active()
        if taken:
            self._notify("on_assigned", taken)
            changed = True
        return changed

    def _assign_all(self) -> bool:
        """BROADCASTING: own every queue of the subscribed topics, each from
        its offset in the local file, else from ``consume_from`` (stored in
        the file at once, so a restart before the first commit starts there
        too).  Return whether queues were added."""
        broker = self._broker
        new = sorted(q for topic in self._filters for q in broker.topic(topic).queues if q not in self._states)
        assert self._store is not None
        starts = self._members.local_starts(new, self._store, broker)
        for q, pos in starts.items():
            log_key = self._conn.queue_key(q.topic, q.queue_id, "log")
            self._states[q] = QueueReader(q, log_key, pos, self._filters.get(q.topic))
        self._pending = False
        if new:
            self._rebuild_active()
            self._notify("on_assigned", new)
        return bool(new)

    # -- queue control: assignment, pause, resume (QueueStates) ---------------

    def seek(self, queue: MessageQueue, offset: int) -> None:
        """Next poll of ``queue`` starts at ``offset`` clamped to the stored range."""
        self._check_open()
        st = self._owned(queue)
        lo, hi = self._broker.min_offset(queue), self._broker.max_offset(queue)
        st.pos = min(max(int(offset), lo), hi)

    def position(self, queue: MessageQueue) -> int:
        self._check_open()
        return self._owned(queue).pos

    # -- offsets --------------------------------------------------------------

    def commit(self, offsets: Mapping[MessageQueue, OffsetAndMetadata | int]) -> None:
        """Store offsets of the queues whose owner key holds this member."""
        self._check_open()
        entries = commit_entries(offsets)
        if self._store is not None:
            self._commit_local(entries)
            return
        if not entries:
            return
        stored = self._members.commit(entries)
        if stored < len(entries):
            logger.debug("%r: %d commit(s) ignored: not its queues", self, len(entries) - stored)

    def committed(self, queue: MessageQueue) -> OffsetAndMetadata | None:
        self._check_open()
        if self._store is not None:
            return self._store.get(queue)
        return self._broker.committed(self._group, queue)

    # -- broker-side queue locks ----------------------------------------------

    def lock(self, queues: Collection[MessageQueue], lease: float) -> frozenset[MessageQueue]:
        self._check_open()
        check_lease(lease)
        qs = list(dict.fromkeys(queues))
        if not qs:
            return frozenset()
        if self._store is not None:  # BROADCASTING: no other member reads "our" copy
            return frozenset(qs)
        held = self._members.lock(qs, lease)
        self._locks |= held
        return held

    def unlock(self, queues: Collection[MessageQueue]) -> None:
        self._check_open()
        qs = list(dict.fromkeys(queues))
        if not qs or self._store is not None:
            return
        self._members.unlock(qs)
        self._locks.difference_update(qs)

    # -- failures -------------------------------------------------------------

    @property
    def delay_levels(self) -> tuple[float, ...]:
        return self._broker.delay_levels

    def send_back(self, items: Sequence[tuple[MessageExt, int]]) -> list[BaseException | None]:
        """See :meth:`PullSource.send_back`: the copies wait in the group's
        schedule until due, then a poll moves them to ``%RETRY%<group>``."""
        self._check_open()
        if self._store is not None:
            return [no_send_back(self)] * len(items)
        return self._broker.retries.store_retries(self._group, items)

    def send_to_dlq(self, items: Sequence[tuple[MessageExt, str, str]]) -> list[BaseException | None]:
        self._check_open()
        return self._broker.retries.store_dead_letters(self._group, items)

    # -- lifecycle ------------------------------------------------------------

    def wakeup(self) -> None:
        self._wakeup_flag = True
        self._event.set()

    def close(self) -> None:
        """Leave the group: owned queues and locks are released at once
        (nothing is committed, no listener runs)."""
        if self._closed:
            return
        self._closed = True
        self._broker.unregister(self)
        self._event.set()
        if self._notifier is not None:
            self._notifier.stop()
        try:
            if self._store is not None:
                self._store.close()
            else:
                owned = (*self._states, *self._unreleased)
                self._members.leave(owned, self._locks, member=bool(self._filters))
        except CONN_ERRORS as e:
            logger.warning("%r: leaving the group failed (%s); its session will expire", self, e)
        self._states.clear()
        self._active = []
        self._locks.clear()

    def __enter__(self) -> RedisPullConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
