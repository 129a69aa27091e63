"""SIGINT and SIGTERM as a request to stop, for a process that drains first.

:class:`StopOnSignal` is what ``lite-push consume`` and
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

__all__ = ["StopOnSignal"]

logger = logging.getLogger(__name__)


class StopOnSignal:
    """SIGINT/SIGTERM set :attr:`event` (and call ``on_signal`` with the
    signal's name).  The handler does both from a short helper thread: the
    main thread may be inside ``event.wait()`` holding the event's lock
    when the handler runs, and ``Event.set`` in the handler itself could
    then deadlock.  A second signal is logged and otherwise ignored."""

    def __init__(self, on_signal: Callable[[str], None] | None = None) -> None:
        self.event = threading.Event()
        #: The name of the first signal received (``"SIGTERM"``), else ``None``.
        self.signal_name: str | None = None
        self._on_signal = on_signal
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
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
            threading.Thread(target=self._notify, name="lite-push-stop", daemon=True).start()
        else:
            logger.warning("%s: already stopping", signal.Signals(signum).name)

    def _notify(self) -> None:
        self.event.set()
        if self._on_signal is not None and self.signal_name is not None:
            self._on_signal(self.signal_name)
