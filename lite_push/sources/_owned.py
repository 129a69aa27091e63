"""The queues one member owns, as every source's consumer keeps them.

:class:`OwnedQueues` is a part of its own, shared by a consumer and its
message model (``_member_model``): the model decides which queues the member
owns and adds or drops them here (telling the rebalance listener); the
consumer reads and pauses them.  Both belong to the consumer's thread, so
nothing here takes a lock, except what a broker's close changes under its
own (``closed``, see each source).

:class:`QueueControl` is the consumer's side of it: the PullSource methods
``assignment``, ``pause``, ``resume`` and ``paused``, written once.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from typing import Generic, Protocol, TypeVar

from .._errors import NotSubscribedError, SourceClosedError
from .._types import MessageQueue
from .contract import RebalanceListener

__all__ = ["OwnedQueues", "QueueControl", "QueueState"]

logger = logging.getLogger(__name__)


class QueueState(Protocol):
    """What every source keeps of an owned queue (and more of its own)."""

    mq: MessageQueue
    paused: bool


S = TypeVar("S", bound=QueueState)


class OwnedQueues(Generic[S]):
    """The queues a member of ``group`` owns now, each with its state
    (``states``), the unpaused ones in queue order (``active``, rebuilt by
    :meth:`rebuild`), the rebalance listener, and whether the member is
    closed.  ``who`` is what log lines name (its repr: the consumer)."""

    __slots__ = ("group", "client_id", "who", "states", "active", "listener", "closed")

    def __init__(self, group: str, client_id: str, who: object) -> None:
        self.group = group
        self.client_id = client_id
        self.who = who
        self.states: dict[MessageQueue, S] = {}
        #: The unpaused owned queues, sorted: what a poll reads.
        self.active: list[S] = []
        self.listener: RebalanceListener | None = None
        #: The member is closed: it owns nothing and takes nothing more.
        self.closed = False

    def check_open(self) -> None:
        """``SourceClosedError`` once the member is closed."""
        if self.closed:
            raise SourceClosedError(f"consumer {self.client_id!r} of group {self.group!r} is closed")

    def get(self, queue: MessageQueue) -> S:
        """The state of an owned ``queue``; ``NotSubscribedError`` if not owned."""
        st = self.states.get(queue)
        if st is None:
            raise NotSubscribedError(f"{queue} is not assigned to consumer {self.client_id!r}")
        return st

    def add(self, states: Iterable[S]) -> list[MessageQueue]:
        """Own the queues of ``states`` (the listener is not told); return them."""
        added = []
        for st in states:
            self.states[st.mq] = st
            added.append(st.mq)
        if added:
            self.rebuild()
        return added

    def drop(self, queues: Iterable[MessageQueue]) -> None:
        """Own ``queues`` no more (the listener is not told)."""
        for q in queues:
            self.states.pop(q, None)
        self.rebuild()

    def clear(self) -> None:
        """Own nothing (the member closed)."""
        self.states.clear()
        self.active = []

    def rebuild(self) -> None:
        """``active`` := the unpaused owned queues, in queue order."""
        self.active = [st for _, st in sorted(self.states.items()) if not st.paused]

    def notify(self, what: str, queues: list[MessageQueue]) -> None:
        """Call the rebalance listener's ``what`` (``on_assigned`` or
        ``on_revoked``); log (never raise) its errors."""
        listener = self.listener
        if listener is None:
            return
        try:
            getattr(listener, what)(queues)
        except Exception:
            logger.exception("rebalance listener %s(%s) of %r raised", what, [str(q) for q in queues], self.who)

    def pause(self, queues: Collection[MessageQueue]) -> None:
        """Pause the owned ones of ``queues`` (see :meth:`PullSource.pause`)."""
        changed = False
        for q in queues:
            st = self.states.get(q)
            if st is not None and not st.paused:
                st.paused = changed = True
        if changed:
            self.rebuild()

    def resume(self, queues: Collection[MessageQueue]) -> None:
        """Resume the paused ones of ``queues``."""
        changed = False
        for q in queues:
            st = self.states.get(q)
            if st is not None and st.paused:
                st.paused = False
                changed = True
        if changed:
            self.rebuild()

    def paused(self) -> frozenset[MessageQueue]:
        return frozenset(q for q, st in self.states.items() if st.paused)


class QueueControl(Generic[S]):
    """Mixin for a source's consumer that keeps its queues in ``_owned``:
    :meth:`PullSource.assignment`, ``pause``, ``resume``, ``paused`` and
    ``rebalance_listener``."""

    _owned: OwnedQueues[S]

    @property
    def rebalance_listener(self) -> RebalanceListener | None:
        """See :attr:`PullSource.rebalance_listener`."""
        return self._owned.listener

    def assignment(self) -> frozenset[MessageQueue]:
        self._owned.check_open()
        return frozenset(self._owned.states)

    def pause(self, queues: Collection[MessageQueue]) -> None:
        self._owned.check_open()
        self._owned.pause(queues)

    def resume(self, queues: Collection[MessageQueue]) -> None:
        self._owned.check_open()
        self._owned.resume(queues)

    def paused(self) -> frozenset[MessageQueue]:
        self._owned.check_open()
        return self._owned.paused()
