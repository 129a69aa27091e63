"""Member factories for the ProcessSupervisor tests.

They run in spawned member processes, which import this module by name
(the tests directory is on the spawned interpreter's ``sys.path``), so they
are module-level functions taking plain, picklable arguments
(``functools.partial`` binds them).  This module imports little: every
member imports it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from lite_push import ConsumeFromWhere, ConsumerConfig, LitePushConsumer, MessageExt

if TYPE_CHECKING:
    from lite_push.sources.redis import RedisBroker

#: The members' Redis session (seconds): a killed member's queues move on
#: within it.
SESSION = 3.0


def _consumer(broker: RedisBroker, log: str, index: int, sleep: float, metrics: bool, lanes: int) -> LitePushConsumer:
    """A consumer of group ``g`` on topic ``T`` whose listener appends
    ``pid queue offset key start_ns end_ns`` per message to ``log`` (the
    format of ``member_runs.read_log``)."""
    logging.basicConfig(level=logging.WARNING, format=f"member {index} %(levelname)s %(name)s: %(message)s")
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    pid = os.getpid()

    def listener(msgs: list[MessageExt]) -> None:
        for m in msgs:
            start = time.time_ns()
            if sleep:
                time.sleep(sleep)
            os.write(fd, f"{pid} {m.queue_id} {m.queue_offset} {m.keys} {start} {time.time_ns()}\n".encode())

    config = ConsumerConfig(
        group="g",
        lanes=lanes,
        commit_interval=0.05,
        poll_timeout=0.02,
        revoke_timeout=1.0,
        metrics_port=0 if metrics else None,
    )
    source = broker.pull_consumer("g", consume_from=ConsumeFromWhere.FIRST_OFFSET)
    consumer = LitePushConsumer(config, source=source, listener=listener)
    consumer.subscribe("T")
    return consumer


def _broker(url: str, namespace: str) -> RedisBroker:
    from lite_push.sources.redis import RedisBroker

    return RedisBroker(url, namespace=namespace, session_timeout=SESSION, heartbeat_interval=0.3)


@contextmanager
def redis_member(
    url: str,
    namespace: str,
    log: str,
    index: int,
    *,
    sleep: float = 0.0,
    metrics: bool = True,
    lanes: int = 4,
) -> Iterator[LitePushConsumer]:
    """The factory's context-manager form: the consumer of :func:`_consumer`,
    and its broker closed after it."""
    broker = _broker(url, namespace)
    try:
        yield _consumer(broker, log, index, sleep, metrics, lanes)
    finally:
        broker.close()


def plain_redis_member(url: str, namespace: str, log: str, index: int) -> LitePushConsumer:
    """The factory's plain form: just the consumer (without metrics)."""
    return _consumer(_broker(url, namespace), log, index, 0.0, False, 4)


def failing_member(index: int) -> LitePushConsumer:
    """A member whose factory fails every time (a listener that does not import)."""
    raise ImportError(f"no module named 'handlers' (member {index})")


def fixed_port_member(port: int, index: int) -> LitePushConsumer:
    """A member whose consumer wants a fixed metrics port: refused when the
    supervisor serves the members' metrics."""
    from lite_push import EmbeddedBroker

    broker = EmbeddedBroker()
    broker.create_topic("T", 1)
    consumer = LitePushConsumer(
        ConsumerConfig(group="g", metrics_port=port), source=broker.pull_consumer("g"), listener=lambda msgs: None
    )
    consumer.subscribe("T")
    return consumer


def embedded_member(index: int) -> LitePushConsumer:
    """A member with an in-memory broker of its own (topic ``T``, group
    ``members``), its metrics on a free port: for the supervisor's endpoint."""
    from lite_push import EmbeddedBroker

    broker = EmbeddedBroker()
    broker.create_topic("T", 1)
    consumer = LitePushConsumer(
        ConsumerConfig(group="members", metrics_port=0),
        source=broker.pull_consumer("members"),
        listener=lambda msgs: None,
    )
    consumer.subscribe("T")
    return consumer
