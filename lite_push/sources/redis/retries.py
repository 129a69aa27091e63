"""Retries and dead letters on Redis.

A retry waits in its group's schedule (a sorted set of due times and two
hashes of bodies and metadata, under the retry queue's hash tag) until the
MOVE_DUE script, run by every poll of the group, moves it to the group's
retry stream.  A dead letter goes straight to ``%DLQ%<group>``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..._types import MessageExt
from .._common import BrokerClock, dead_letter_item, retry_item
from ..contract import dlq_topic, retry_topic
from .codec import encode_meta
from .connection import Connection
from .topics import TopicCatalog

__all__ = ["Retries"]

logger = logging.getLogger(__name__)

#: Delayed retries moved per MOVE_DUE call.
MOVE_LIMIT = 1000


class Retries:
    """Stores a broker's retries and dead letters, and moves due retries.
    ``clock.time()`` gives the due times; ``delay_levels`` are the seconds
    each level waits; a copy's body may have ``max_message_size`` bytes."""

    def __init__(
        self,
        conn: Connection,
        topics: TopicCatalog,
        clock: BrokerClock,
        delay_levels: tuple[float, ...],
        max_message_size: int,
    ) -> None:
        self._conn = conn
        self._topics = topics
        self._clock = clock
        self.delay_levels = delay_levels
        self._max_size = max_message_size

    def store_retries(self, group: str, items: Sequence[tuple[MessageExt, int]]) -> list[BaseException | None]:
        """``send_back`` of a consumer of ``group``: each copy waits in the
        group's schedule until its delay level's time is up."""
        levels = self.delay_levels
        target = retry_topic(group)
        now_ms = int(self._clock.time() * 1000)
        results: list[BaseException | None] = [None] * len(items)
        built: list[int] = []
        sched: list[Any] = []
        for i, item in enumerate(items):
            try:
                message, level, props = retry_item(item, levels, self._max_size)
                sched += (
                    uuid.uuid4().hex,
                    now_ms + round(levels[level - 1] * 1000),
                    message.body,
                    encode_meta(message, props),
                )
            except Exception as e:
                results[i] = e
            else:
                built.append(i)
        if not built:
            return results
        try:
            self._topics.ensure(target, 1)
            keys = [self._conn.queue_key(target, 0, what) for what in ("sched", "sbody", "smeta")]
            self._conn.run(self._conn.schedule, keys, sched)
        except Exception as e:
            logger.warning(
                "storing %d retr%s for group %r failed: %s", len(built), "y" if len(built) == 1 else "ies", group, e
            )
            for i in built:
                results[i] = e
        return results

    def store_dead_letters(
        self, group: str, items: Sequence[tuple[MessageExt, str, str]]
    ) -> list[BaseException | None]:
        """``send_to_dlq`` of a consumer of ``group``."""
        target = dlq_topic(group)
        results: list[BaseException | None] = [None] * len(items)
        built: list[int] = []
        a: list[bytes] = []
        for i, item in enumerate(items):
            try:
                message, props = dead_letter_item(item, group, self._max_size)
                a.append(message.body)
                a.append(encode_meta(message, props))
            except Exception as e:
                results[i] = e
            else:
                built.append(i)
        if not built:
            return results
        try:
            self._topics.ensure(target, 1)
            self._conn.append(target, {0: a})
        except Exception as e:
            logger.warning("storing %d dead letter(s) for group %r failed: %s", len(built), group, e)
            for i in built:
                results[i] = e
        return results

    def store_malformed(self, group: str, bad: Sequence[tuple[MessageExt, str]]) -> None:
        """Entries a poll could not decode (stand-ins with their reasons,
        from :func:`~lite_push.sources.redis.codec.decode`): each stored in
        the group's dead-letter queue with its reason, then logged at ERROR,
        once, naming its queue and its entry id (the reason does); a body
        over ``max_message_size`` is left out (the reason says so).  Raises
        the first failure to store one (the poll then fails and reads them
        again; they are logged once they are stored)."""
        limit = self._max_size
        bad = [
            (m, reason)
            if len(m.body) <= limit
            else (replace(m, body=b""), f"{reason} (its body of {len(m.body)} bytes, over max_message_size, left out)")
            for m, reason in bad
        ]
        results = self.store_dead_letters(group, [(m, reason, "") for m, reason in bad])
        for (m, reason), err in zip(bad, results, strict=True):
            if err is None:
                logger.error("group %r: queue %s, offset %d: %s; dead-lettered", group, m.queue, m.queue_offset, reason)
        for err in results:
            if err is not None:
                raise err

    def move_due(self, pipe: Any, group: str, *, loaded: bool = False) -> Any:
        """Run (or queue on ``pipe``) MOVE_DUE for ``group``: returns (how
        many moved, the next due time in ms or -1).  ``loaded``: see
        :meth:`~.connection.Connection.run`."""
        target = retry_topic(group)
        return self._conn.run(
            self._conn.move_due,
            [
                self._conn.queue_key(target, 0, "sched"),
                self._conn.queue_key(target, 0, "sbody"),
                self._conn.queue_key(target, 0, "smeta"),
                self._conn.queue_key(target, 0, "seq"),
                self._conn.queue_key(target, 0, "log"),
            ],
            [int(self._clock.time() * 1000), MOVE_LIMIT, self._conn.notify_channel(target)],
            pipe,
            loaded=loaded,
        )

    def next_due_in(self, reply: Any) -> float | None:
        """Seconds from now until the next retry is due, per a MOVE_DUE
        ``reply`` (None: nothing is scheduled)."""
        _moved, nxt = reply
        nxt = float(nxt)
        return None if nxt < 0 else nxt / 1000.0 - self._clock.time()
