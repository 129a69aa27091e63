"""The message model as a strategy: how one member stores its offsets and
which queues it owns.

A consumer of the embedded or the Redis source picks its model once, at
construction, from ``message_model``, and then asks it instead of asking
which model it runs:

* CLUSTERING (each source's own ``clustering.Clustering``): the member owns
  its share of the group's queues, which the group's rebalance moves;
  offsets, queue locks and retries are the group's, at the broker; a
  session says how long the queues are certainly its own.
* BROADCASTING (:class:`Broadcasting`, here: the same for every source):
  the member owns every queue of its topics, outside any group; its offsets
  are its own, in a local file (:mod:`.local_offsets`); no other member
  reads "its" copy, so every lock is granted, and it has no session and no
  retry topic (the runtime retries its failures itself).

A model shares the consumer's :class:`~._owned.OwnedQueues`: ``refresh``
brings the owned set to what the model says, on the consumer's thread, and
tells the rebalance listener.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import logging
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar, Generic, Protocol

from .._errors import ConfigError, LitePushError
from .._types import MessageExt, MessageQueue, OffsetAndMetadata
from ._common import initial_position
from ._owned import OwnedQueues, S
from .contract import ConsumeFromWhere, MessageModel
from .local_offsets import LocalOffsetStore, default_offset_file

__all__ = ["Broadcasting", "MemberModel", "StoredLog", "check_message_model", "open_offset_store"]

logger = logging.getLogger(__name__)


class StoredLog(Protocol):
    """Where a source's queues keep their messages, as a start position
    needs it."""

    def stored_range(self, queue: MessageQueue) -> tuple[int, int]:
        """``(lo, hi)``: the first stored offset of ``queue`` and the next one."""
        ...

    def first_stored_at(self, queue: MessageQueue, lo: int, hi: int, timestamp: int) -> int:
        """The first offset in ``[lo, hi)`` stored at or after ``timestamp``
        (epoch ms), ``hi`` if none."""
        ...


class MemberModel(abc.ABC):
    """How one member stores its offsets and which queues it owns; the
    consumer's calls of the same names (see :class:`~.contract.PullSource`)
    land here once the consumer has checked it is open and its arguments."""

    #: CLUSTERING or BROADCASTING.
    message_model: ClassVar[MessageModel]
    #: Pub/sub channels (Redis) whose messages should end a waiting poll,
    #: beside the member's topics' own.
    channels: tuple[str, ...] = ()

    @property
    def offset_store(self) -> LocalOffsetStore | None:
        """The local offsets file (BROADCASTING), else None."""
        return None

    @property
    @abc.abstractmethod
    def session_timeout(self) -> float | None:
        """As :attr:`PullSource.session_timeout`."""

    @abc.abstractmethod
    def owned_for(self) -> dict[MessageQueue, float]:
        """As :meth:`PullSource.owned_for`."""

    @abc.abstractmethod
    def subscribe(self, topic: str) -> None:
        """The member subscribed to ``topic`` (new to it)."""

    def stale(self) -> bool:
        """Whether :meth:`refresh` has work to do now (cheap; a waiting
        poll asks)."""
        return False

    def renew_in(self) -> float | None:
        """Seconds until :meth:`refresh` is due to renew the member's
        session (a waiting poll wakes up for it by then), ``None`` when
        nothing is scheduled (the default)."""
        return None

    def watch(self, pipe: Any) -> int:
        """Queue on a source's pipelined read (Redis) what :meth:`refresh`
        needs to see; return how many replies that adds (none by default)."""
        return 0

    @abc.abstractmethod
    def refresh(self, replies: Sequence[Any] = (), rebalance: bool = True) -> bool:
        """Bring the owned queues to what the model says (``replies``: what
        :meth:`watch` queued); return whether they changed.  ``rebalance``
        False (a poll on the event loop's thread, ``poll_nowait``): only
        renew the membership, never change the owned queues or call the
        rebalance listener; return whether a rebalance is due."""

    @abc.abstractmethod
    def commit(self, entries: Mapping[MessageQueue, OffsetAndMetadata]) -> None:
        """Store the offsets of the owned ones of ``entries``."""

    @abc.abstractmethod
    def committed(self, queue: MessageQueue) -> OffsetAndMetadata | None: ...

    @abc.abstractmethod
    def lock(self, queues: Collection[MessageQueue], lease: float) -> frozenset[MessageQueue]: ...

    @abc.abstractmethod
    def unlock(self, queues: Collection[MessageQueue]) -> None: ...

    @abc.abstractmethod
    def send_back(self, items: Sequence[tuple[MessageExt, int]]) -> list[BaseException | None]: ...

    @abc.abstractmethod
    def close(self) -> None:
        """The member closes: give up what the model holds (the owned
        queues are still listed; nothing is committed, no listener runs)."""


def check_message_model(message_model: object, offset_file: object) -> None:
    """``ConfigError`` naming the field for a bad ``message_model`` or an
    ``offset_file`` given to a CLUSTERING member."""
    if not isinstance(message_model, MessageModel):
        raise ConfigError("message_model", f"must be a MessageModel, got {message_model!r}")
    if offset_file is not None and message_model is not MessageModel.BROADCASTING:
        raise ConfigError("offset_file", "is only used with message_model=BROADCASTING")


def open_offset_store(offset_file: str | os.PathLike[str] | None, broker_name: str, group: str) -> LocalOffsetStore:
    """A BROADCASTING member's offsets file, opened and locked (default
    :func:`~.local_offsets.default_offset_file`)."""
    path = offset_file if offset_file is not None else default_offset_file(broker_name, group)
    return LocalOffsetStore(path, broker_name=broker_name, group=group)


class Broadcasting(MemberModel, Generic[S]):
    """BROADCASTING: the member owns every queue of its topics, from its
    offset in ``store`` (its local file), else from ``consume_from`` --
    stored in the file at once, so a restart before the first commit starts
    there too.

    ``queues_of(topic)`` lists a topic's queues, ``log`` finds start
    positions, ``reader(queue, position)`` makes an owned queue's state.
    ``lock`` (the embedded broker's: taking the queues then excludes its
    close) is held while queues are taken."""

    message_model = MessageModel.BROADCASTING

    def __init__(
        self,
        owned: OwnedQueues[S],
        store: LocalOffsetStore,
        log: StoredLog,
        queues_of: Callable[[str], Sequence[MessageQueue]],
        reader: Callable[[MessageQueue, int], S],
        consume_from: ConsumeFromWhere,
        consume_timestamp: int | None,
        lock: contextlib.AbstractContextManager[Any] | None = None,
    ) -> None:
        self._owned = owned
        self._store = store
        self._log = log
        self._queues_of = queues_of
        self._reader = reader
        self._consume_from = consume_from
        self._consume_timestamp = consume_timestamp
        self._lock = lock if lock is not None else contextlib.nullcontext()
        self._topics: list[str] = []
        #: A topic was subscribed whose queues are not taken yet.
        self._pending = False

    @property
    def offset_store(self) -> LocalOffsetStore:
        return self._store

    @property
    def session_timeout(self) -> None:
        return None

    def owned_for(self) -> dict[MessageQueue, float]:
        return {}  # no sessions: ownership never lapses

    def subscribe(self, topic: str) -> None:
        self._topics.append(topic)
        self._pending = True  # the next poll takes the topic's queues

    def stale(self) -> bool:
        return self._pending

    def refresh(self, replies: Sequence[Any] = (), rebalance: bool = True) -> bool:
        """Take every queue of the subscribed topics not owned yet; then
        ``on_assigned``."""
        if not self._pending or not rebalance:
            return self._pending
        owned = self._owned
        with self._lock:
            if owned.closed:
                return False
            new = sorted(q for t in self._topics for q in self._queues_of(t) if q not in owned.states)
            owned.add(self._reader(q, pos) for q, pos in self.starts(new).items())
            self._pending = False
        if new:
            owned.notify("on_assigned", new)
        return bool(new)

    def starts(self, queues: Collection[MessageQueue]) -> dict[MessageQueue, int]:
        """Where the member starts on each of ``queues``: its offset in the
        file, clamped to the stored range, else ``consume_from``'s position
        (written to the file)."""
        starts: dict[MessageQueue, int] = {}
        fresh: dict[MessageQueue, OffsetAndMetadata] = {}
        for q in queues:
            lo, hi = self._log.stored_range(q)
            om = self._store.get(q)
            if om is None:
                first_at = functools.partial(self._log.first_stored_at, q, lo, hi)
                pos = initial_position(self._consume_from, self._consume_timestamp, lo, hi, first_at)
                fresh[q] = OffsetAndMetadata(pos)
            else:
                pos = om.offset
            starts[q] = min(max(pos, lo), hi)
        if fresh:
            try:
                self._store.commit(fresh)
            except OSError as e:
                logger.warning("%r: storing the start offsets in %s failed: %s", self._owned.who, self._store.path, e)
        return starts

    def commit(self, entries: Mapping[MessageQueue, OffsetAndMetadata]) -> None:
        """Write the owned queues' offsets to the file (others' are ignored)."""
        states = self._owned.states
        owned = {q: om for q, om in entries.items() if q in states}
        if len(owned) < len(entries):
            logger.debug("%r: %d commit(s) ignored: not its queues", self._owned.who, len(entries) - len(owned))
        if owned:
            self._store.commit(owned)

    def committed(self, queue: MessageQueue) -> OffsetAndMetadata | None:
        return self._store.get(queue)

    def lock(self, queues: Collection[MessageQueue], lease: float) -> frozenset[MessageQueue]:
        return frozenset(queues)  # no other member reads "our" copy

    def unlock(self, queues: Collection[MessageQueue]) -> None:
        pass

    def send_back(self, items: Sequence[tuple[MessageExt, int]]) -> list[BaseException | None]:
        refused = LitePushError(
            f"{self._owned.who!r} is BROADCASTING: failed messages are retried by the member, not sent back"
        )
        return [refused] * len(items)

    def close(self) -> None:
        self._store.close()
