"""The Redis source's notifier: a thread that wakes a waiting poll when a
message or a membership change is published."""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis

__all__ = ["Notifier"]

logger = logging.getLogger(__name__)


class Notifier:
    """A daemon thread on its own pub/sub connection: every message on the
    subscribed channels (new messages of a topic, membership changes of the
    group) sets the consumer's event, so a waiting poll reads at once.
    Channels are added from the owning thread through a list the notifier
    thread subscribes from (a PubSub is not thread-safe).  Losing the
    connection only makes polls fall back to their wait slices."""

    def __init__(self, client: redis.Redis, event: threading.Event, name: str) -> None:
        # Any: redis-py's pubsub() is unannotated
        self._client: Any = client
        self._event = event
        self._lock = threading.Lock()
        self._new: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, channel: str) -> None:
        """Subscribe to ``channel`` too (from the owning thread)."""
        with self._lock:
            self._new.append(channel)

    def stop(self) -> None:
        """End the thread (it exits within a fraction of a second)."""
        self._stop.set()

    def _run(self) -> None:
        ps = self._client.pubsub(ignore_subscribe_messages=True)
        channels: set[str] = set()
        down = False
        try:
            while not self._stop.is_set():
                try:
                    with self._lock:
                        new, self._new = self._new, []
                    new = [c for c in new if c not in channels]
                    if new:
                        ps.subscribe(*new)
                        channels.update(new)
                    if not channels:
                        self._stop.wait(0.05)
                        continue
                    msg = ps.get_message(timeout=0.2)
                    if down:
                        down = False
                        self._event.set()
                    if msg is not None:
                        self._event.set()
                except Exception as e:
                    if self._stop.is_set():
                        break
                    if not down:
                        logger.debug("pub/sub connection lost (%s); reconnecting", e)
                        down = True
                    try:
                        ps.close()
                    except Exception:
                        pass
                    ps = self._client.pubsub(ignore_subscribe_messages=True)
                    with self._lock:
                        self._new.extend(channels)
                    channels = set()
                    self._stop.wait(0.2)
        finally:
            try:
                ps.close()
            except Exception:
                pass
