"""What the contract suite needs from a source (:class:`SourceHarness`), and
:class:`SkewedClock`, a clock to give a source whose delays can be moved."""

from __future__ import annotations

import abc
import time
from collections.abc import Mapping

from .._types import MessageQueue
from ..sources import ConsumeFrom, ConsumeFromWhere, PullSource

__all__ = ["SkewedClock", "SourceHarness"]

FIRST = ConsumeFromWhere.FIRST_OFFSET


class SourceHarness(abc.ABC):
    """One source under test, fresh for each test: it creates topics, stores
    messages and makes members of consumer groups.

    A test module provides one as the ``harness`` fixture, which closes it
    after the test.  Everything the harness made must be independent of
    other tests (a new broker, or a new namespace on a shared server)."""

    @abc.abstractmethod
    def create_topic(self, topic: str, queue_count: int) -> list[MessageQueue]:
        """Create ``topic``; return its queues sorted."""

    @abc.abstractmethod
    def send(
        self,
        topic: str,
        body: bytes,
        *,
        keys: str | None = None,
        tags: str | None = None,
        queue_id: int | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> tuple[MessageQueue, int]:
        """Store one message (on queue ``queue_id`` when given, else where the
        source's producer puts it); return its queue and offset."""

    @abc.abstractmethod
    def advance_clock(self, seconds: float) -> None:
        """Move the source's wall clock -- what the delays of
        :meth:`PullSource.send_back` are measured on -- ``seconds`` ahead
        (see :class:`SkewedClock`).  A source without delayed delivery
        (``delayed_delivery`` False) may do nothing."""

    @abc.abstractmethod
    def consumer(
        self,
        group: str,
        *,
        consume_from: ConsumeFrom = FIRST,
        consume_timestamp: int | None = None,
        client_id: str | None = None,
    ) -> PullSource:
        """A new, unsubscribed member of ``group`` with no rebalance listener
        (closed by :meth:`close` if the test did not).  ``client_id`` names
        the member: the suite relies on "member-a" sorting before "member-b"
        when :attr:`allocates_by_strategy`."""

    #: The source shares queues out with lite_push's allocation strategy
    #: (AVERAGELY over sorted client ids: "member-a" gets the first half).
    #: False: the broker's assignor decides (Kafka's cooperative-sticky), so
    #: the suite checks only that the members split the queues evenly.
    allocates_by_strategy = True
    #: The broker can find the first offset at or after a time (False:
    #: librdkafka's mock cluster answers ListOffsets by time with -1).
    finds_offsets_by_time = True

    def now_ms(self) -> int:
        """The source's clock for store timestamps, in ms."""
        return time.time_ns() // 1_000_000

    @abc.abstractmethod
    def close(self) -> None:
        """Close every member and the broker the harness made."""


class SkewedClock:
    """Real time, except that :meth:`advance` moves the wall clock
    (``time()``) ahead: delayed messages fall due without sleeping, while
    ``monotonic()`` (session timeouts, lock leases) stays real, so the rest
    of the suite runs as on the system clock.

    Give it to the source's broker (``EmbeddedBroker(clock=...)``,
    ``RedisBroker(clock=...)``) and call :meth:`advance` from
    :meth:`SourceHarness.advance_clock`."""

    def __init__(self) -> None:
        self._skew = 0.0

    def monotonic(self) -> float:
        """``time.monotonic()``, never moved."""
        return time.monotonic()

    def time(self) -> float:
        """``time.time()`` plus every :meth:`advance` so far."""
        return time.time() + self._skew

    def advance(self, seconds: float) -> None:
        """Move :meth:`time` ``seconds`` ahead."""
        self._skew += seconds
