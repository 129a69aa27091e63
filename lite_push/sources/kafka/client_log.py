"""Where librdkafka's own log lines go: the ``lite_push.sources.kafka.librdkafka``
logger, at DEBUG, through a filter that keeps them readable.

librdkafka logs through a Python logger when its ``logger`` property is set
(every client lite_push makes sets it to :data:`LIBRDKAFKA_LOG`).  What it
says is for whoever looks into the client: lite_push reports a failure in
its own words (the exception a call raises, which ``lite-push`` prints as
one line; a consumer's commit or poll that keeps failing, logged once per
episode).  So every line of librdkafka's, an ERROR of its own included
(a cluster that refuses connections: ``FAIL ... Connect to ... failed:
Connection refused``), is logged at DEBUG by :class:`LibrdkafkaLog`, with
librdkafka's level at the start of the text (``librdkafka ERROR: FAIL
[rdkafka#producer-1] ...``): ``lite-push consume --log-level DEBUG`` shows
them, as does ``logging.getLogger("lite_push.sources.kafka.librdkafka")
.setLevel(logging.DEBUG)`` with a handler.

Left alone librdkafka repeats itself: a cluster that refuses connections
gives one "Connect ... failed" line per attempt, hundreds before a metadata
request gives up.  :class:`RepeatFilter` lets a given message through once
per :data:`REPEAT_WINDOW` seconds and counts what it held back; and it drops
the producer's warning about a consumer property in the settings every
client shares (``KafkaBroker(config=...)`` goes to the producer too).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

__all__ = ["LIBRDKAFKA_LOG", "LIBRDKAFKA_LOGGER", "REPEAT_WINDOW", "LibrdkafkaLog", "LogSink", "RepeatFilter"]

#: Seconds during which a repeated librdkafka message is held back.
REPEAT_WINDOW = 10.0
#: At most this many distinct messages are remembered (then the oldest go).
_MEMORY = 256


class RepeatFilter(logging.Filter):
    """Lets a record through unless the same text passed within the window."""

    def __init__(self, window: float = REPEAT_WINDOW) -> None:
        super().__init__()
        self.window = window
        self._last: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "is a consumer property and will be ignored by this producer" in text:
            return False
        # librdkafka's lines carry the client's name and thread: compare without them
        key = text.split("]: ", 1)[-1]
        now = time.monotonic()
        with self._lock:
            seen = self._last.get(key)
            if seen is not None and now - seen[0] < self.window:
                self._last[key] = (seen[0], seen[1] + 1)
                return False
            if len(self._last) >= _MEMORY:
                self._last.pop(next(iter(self._last)))
            self._last[key] = (now, 0)
        if seen is not None and seen[1]:
            record.msg = f"{text} (and {seen[1]} more like it in {self.window:g}s)"
            record.args = None
        return True


class LogSink(Protocol):
    """What a librdkafka client's ``logger`` must do: a ``logging.Logger``
    or a :class:`LibrdkafkaLog`."""

    def log(self, level: int, msg: str, *args: object) -> None:
        """Log ``msg % args`` at Python's ``level``."""
        ...


class LibrdkafkaLog:
    """A librdkafka client's ``logger``: each line, whatever librdkafka's
    level, goes to ``logger`` at DEBUG, that level named at its start.
    (confluent-kafka, and the compiled fetch client, call :meth:`log` as
    they would a ``logging.Logger``'s.)"""

    __slots__ = ("logger",)

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def log(self, level: int, msg: str, *args: object) -> None:
        """One line of librdkafka's at Python's ``level`` (its own mapped
        as confluent-kafka maps it: 3, error, is ERROR), ``msg % args``."""
        if self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug(f"librdkafka {logging.getLevelName(level)}: {msg}", *args)


#: Where every librdkafka client of lite_push logs (at DEBUG).
LIBRDKAFKA_LOGGER = logging.getLogger("lite_push.sources.kafka.librdkafka")
LIBRDKAFKA_LOGGER.addFilter(RepeatFilter())
#: The ``logger`` property of every librdkafka client of lite_push.
LIBRDKAFKA_LOG = LibrdkafkaLog(LIBRDKAFKA_LOGGER)
