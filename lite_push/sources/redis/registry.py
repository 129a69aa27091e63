"""The open consumers of one Redis broker: a client id is used by one open
consumer of a group at a time, and the broker closes them all when it
closes."""

from __future__ import annotations

import threading
from typing import Protocol

from ..._errors import ConfigError

__all__ = ["OpenConsumers"]


class Member(Protocol):
    """A consumer as the registry sees it."""

    @property
    def group(self) -> str: ...

    @property
    def client_id(self) -> str: ...

    def close(self) -> None: ...


class OpenConsumers:
    """The open consumers of a broker.  Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[Member] = set()

    def add(self, consumer: Member) -> None:
        """An open consumer; ``ConfigError`` if another open one of its
        group has its client id."""
        with self._lock:
            if any(c.group == consumer.group and c.client_id == consumer.client_id for c in self._open):
                raise ConfigError(
                    "client_id",
                    f"{consumer.client_id!r} is already used by an open consumer of group {consumer.group!r}",
                )
            self._open.add(consumer)

    def discard(self, consumer: Member) -> None:
        """A consumer closed."""
        with self._lock:
            self._open.discard(consumer)

    def snapshot(self) -> list[Member]:
        """The consumers open now."""
        with self._lock:
            return list(self._open)
