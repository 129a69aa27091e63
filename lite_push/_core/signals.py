"""SIGINT and SIGTERM as a request to stop; a second one to stop at once.

:class:`StopOnSignal` is what ``lite-push consume``, ``run()`` and
:meth:`lite_push.ProcessSupervisor.run` install on the main thread while
they run, and restore after.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["EXIT_INTERRUPTED", "StopOnSignal"]

logger = logging.getLogger(__name__)

#: The exit status of a process stopped at once by a second signal (a
#: shell's 128 + SIGINT).
EXIT_INTERRUPTED = 130


class StopOnSignal:
    """SIGINT/SIGTERM set :attr:`event` (and call ``on_signal`` with the
    signal's name); a second one sets :attr:`again` (and calls
    ``on_again``): stop at once.  The handler does this from a short helper
    thread: the main thread may be inside ``event.wait()`` holding the
    event's lock when the handler runs, and ``Event.set`` in the handler
    itself could then deadlock.  Later signals are logged and otherwise
    ignored."""

    def __init__(
        self, on_signal: Callable[[str], None] | None = None, on_again: Callable[[str], None] | None = None
    ) -> None:
        self.event = threading.Event()
        #: Set by a second signal: the stop should not wait any longer.
        self.again = threading.Event()
        #: The name of the first signal received (``"SIGTERM"``), else ``None``.
        self.signal_name: str | None = None
        self._on_signal = on_signal
        self._on_again = on_again
        self._count = 0
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Handle SIGINT and SIGTERM (main thread only)."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        """Put the handlers :meth:`install` replaced back."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        self._count += 1
        if self._count == 1:
            self.signal_name = name
            threading.Thread(target=self._notify, args=(self.event, self._on_signal, name), daemon=True).start()
        elif self._count == 2:
            threading.Thread(target=self._notify, args=(self.again, self._on_again, name), daemon=True).start()
        else:
            logger.warning("%s: already stopping at once", name)

    @staticmethod
    def _notify(event: threading.Event, call: Callable[[str], None] | None, name: str) -> None:
        event.set()
        if call is not None:
            call(name)
