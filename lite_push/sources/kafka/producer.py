"""The Kafka broker's one producer: records produced and then waited for
together, with one flush.

Thread-safe: a lock keeps one sender's records and flush together.  A full
local queue is drained by serving delivery reports, never by failing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException, Producer

from .codec import Record

__all__ = ["Sender"]


class Sender:
    """Produces through ``producer``; a flush waits up to ``send_timeout``
    seconds; ``check_open`` raises once the broker is closed."""

    def __init__(self, producer: Producer, send_timeout: float, check_open: Callable[[], None]) -> None:
        self._producer = producer
        self._send_timeout = send_timeout
        self._check_open = check_open
        self._lock = threading.Lock()

    def produce(self, records: list[Record]) -> list[BaseException | None]:
        """Produce ``records`` and wait for all of them (one flush);
        ``None`` per stored record, else why not."""
        return [d[0] for d in self.deliver(records)]

    def deliver(self, records: list[Record]) -> list[tuple[BaseException | None, int, int]]:
        """Produce ``records``, wait for all of them (one flush), and say
        per record ``(error or None, partition, offset)``."""
        self._check_open()
        out: list[tuple[BaseException | None, int, int]] = [(TimeoutError("not delivered in time"), -1, -1)] * len(
            records
        )

        def delivered(i: int) -> Callable[[Any, Any], None]:
            def cb(err: Any, msg: Any) -> None:
                out[i] = (None, msg.partition(), msg.offset()) if err is None else (KafkaException(err), -1, -1)

            return cb

        producer = self._producer
        with self._lock:
            for i, (topic, partition, key, value, headers) in enumerate(records):
                kwargs: dict[str, Any] = {"key": key, "value": value, "headers": headers, "on_delivery": delivered(i)}
                if partition is not None:
                    kwargs["partition"] = partition
                while True:
                    try:
                        producer.produce(topic, **kwargs)
                        break
                    except BufferError:  # the local queue is full: let deliveries drain it
                        producer.poll(0.05)
                    except (KafkaException, TypeError, ValueError) as e:
                        out[i] = (e, -1, -1)
                        break
            producer.flush(self._send_timeout)
        return out

    def close(self) -> int:
        """Deliver what the producer holds (up to ``send_timeout``); return
        how many records were left undelivered."""
        left: int = self._producer.flush(self._send_timeout)
        return left
