"""How the pull side runs: the pull thread, or a task on the event loop.

``_pull.loop``'s two drivers need different homes:

* the thread executor's pull side is a thread of its own
  (``lite-push-pull-<group>``) running :meth:`PullLoop.run`;
* the asyncio executor's is a task on the running loop
  (:meth:`PullLoop.run_on_loop`) with a :class:`PullHelper`, one thread of
  the same name on which it runs what may block, one call at a time.

Either way the consumer's shutdown sequence (``finish``) runs where the
pull side ends (the thread, or the helper), and the helper ends after it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from .loop import PullLoop

__all__ = ["PullHelper", "PullRunner"]

T = TypeVar("T")


class PullHelper:
    """The helper thread of the pull task (``lite-push-pull-<group>``):
    runs the calls that may block, one at a time, for the task on ``loop``,
    which awaits each (:class:`RunBlocking`)."""

    def __init__(self, group: str, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lite-push-pull-{group}")

    def __call__(self, call: Callable[[], T], /) -> Awaitable[T]:
        return self._loop.run_in_executor(self._pool, call)

    def close(self) -> None:
        """No more calls (the one running, if any, finishes)."""
        self._pool.shutdown(wait=False)


class PullRunner:
    """Starts ``pull`` and says whether it runs (see the module docstring)."""

    __slots__ = ("_group", "_helper", "_pull", "_run")

    def __init__(self, pull: PullLoop, group: str) -> None:
        self._pull = pull
        self._group = group
        self._run: threading.Thread | asyncio.Task[None] | None = None
        self._helper: PullHelper | None = None

    def start(self, finish: Callable[[bool], None], on_loop: bool) -> None:
        """Start pulling, ``finish(crashed)`` at the end: on a thread of its
        own, or (``on_loop``: call on the loop's thread) as a task on the
        running loop."""
        name = f"lite-push-pull-{self._group}"
        if on_loop:
            loop = asyncio.get_running_loop()
            helper = self._helper = PullHelper(self._group, loop)

            def finished(crashed: bool) -> None:
                try:
                    finish(crashed)
                finally:
                    helper.close()  # this is its thread: it ends after this call

            self._run = loop.create_task(self._pull.run_on_loop(finished, helper), name=name)
        else:
            self._run = threading.Thread(target=self._pull.run, args=(finish,), name=name, daemon=True)
            self._run.start()

    @property
    def started(self) -> bool:
        return self._run is not None

    def alive(self) -> bool:
        """Whether the pull side runs (not before it started)."""
        run = self._run
        if isinstance(run, threading.Thread):
            return run.is_alive()
        return run is not None and not run.done()
