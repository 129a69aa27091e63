"""A turn of the pull side, and the calls in it that may block.

A turn (everything the pull side does after a poll) is a generator: it
yields each call that may block (storing failures, a commit, a lock
renewal) and is sent back what the call returned.  The pull thread makes
each call inline; the task on the event loop hands it to its helper thread
and awaits it (``_pull.loop``).  The parts of a turn (``_pull.upkeep``,
``_pull.commit_schedule``, ``_pull.broker_locks``) yield the same way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Protocol, TypeVar

__all__ = ["Blocking", "RunBlocking", "Turn"]

#: A call of the pull side that may block (a commit, storing failures, a
#: lock renewal, a back-off): made inline by the pull thread, on the helper
#: thread by the task on the event loop.
Blocking = Callable[[], object]
#: A turn, or a part of one: yields each :data:`Blocking` call and is sent
#: back what it returned.
Turn = Generator[Blocking, object, None]
T = TypeVar("T")


class RunBlocking(Protocol):
    """The task's way to run a call that may block on its helper thread."""

    def __call__(self, call: Callable[[], T], /) -> Awaitable[T]: ...
