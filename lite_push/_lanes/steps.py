"""Steps: how a lane worker tells its executor which listener calls to make.

A lane's :class:`~lite_push._lanes.worker.LaneWorker` decides what the
listener is called with; the executor (threads or asyncio) only makes the
calls.  Between the two runs a *steps* generator: it yields the messages of
each call and is sent back ``(exception, result)`` of that call.  Instead of
messages it may yield one of two markers, which the executor answers by
waiting and then sending back anything:

* :data:`FENCED`: the queue's ownership is not certain now; wait
  :data:`FENCE_WAIT` and look again;
* :data:`PAUSE`: ``max_rate`` says the next call starts later, at the
  worker's ``gate.pause_until``.
"""

from __future__ import annotations

from collections.abc import Generator

from .._types import MessageExt

__all__ = ["FENCED", "FENCE_WAIT", "PAUSE", "Outcome", "Steps", "no_steps"]

#: What a listener call came to: ``(exception, None)`` when it raised, else
#: ``(None, result)``.
Outcome = tuple[BaseException | None, object]

#: Listener calls to make: yields the messages of each call, is sent back
#: the :data:`Outcome` of it.
Steps = Generator[list[MessageExt], Outcome, None]

#: Yielded by steps instead of messages: the queue's ownership is not
#: certain now; wait :data:`FENCE_WAIT` and send back anything.
FENCED: list[MessageExt] = []
#: Seconds a fenced lane waits before it looks again.
FENCE_WAIT = 0.01
#: Yielded by steps instead of messages: ``max_rate`` says the next call
#: starts at the worker's ``gate.pause_until``; wait, send back anything.
PAUSE: list[MessageExt] = []


def no_steps() -> Steps:
    """Steps that make no call."""
    return
    yield  # a generator that yields nothing
