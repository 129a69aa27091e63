"""The Kafka source: the source contract against librdkafka's mock cluster
(a real Kafka protocol server, started by the tests in a helper process on
127.0.0.1 and stopped by its PID), plus what only the Kafka source does:
topic names, record decoding, the metadata limit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lite_push import MessageQueue
from lite_push.sources import ConsumeFromWhere, PullSource
from lite_push.sources.kafka import KafkaBroker, KafkaPullConsumer
from lite_push.sources.kafka.mock_cluster import MockKafkaCluster
from lite_push.testing import SourceContract, SourceHarness

FIRST = ConsumeFromWhere.FIRST_OFFSET
#: Short sessions keep the group's rebalances quick (heartbeats every 10 %).
SESSION = 2.0


class KafkaHarness(SourceHarness):
    """A fresh mock cluster per harness, so tests never see each other's topics."""

    allocates_by_strategy = False  # Kafka's cooperative-sticky assignor decides
    finds_offsets_by_time = False  # the mock answers ListOffsets by time with -1

    def __init__(self) -> None:
        self.cluster = MockKafkaCluster().start()
        self.broker = KafkaBroker(
            self.cluster.bootstrap, topic_creator=self.cluster.create_topic, session_timeout=SESSION
        )
        self.consumers: list[KafkaPullConsumer] = []

    def create_topic(self, topic: str, queue_count: int) -> list[MessageQueue]:
        return self.broker.create_topic(topic, queue_count)

    def send(self, topic, body, *, keys=None, tags=None, queue_id=None, properties=None):  # type: ignore[no-untyped-def]
        r = self.broker.send(topic, body, keys=keys, tags=tags, queue_id=queue_id, properties=properties)
        return r.queue, r.offset

    def advance_clock(self, seconds: float) -> None:
        """Nothing to move: the Kafka source stores a send-back at once (the
        runtime holds it for its delay)."""

    def consumer(self, group, *, consume_from=FIRST, consume_timestamp=None, client_id=None) -> PullSource:  # type: ignore[no-untyped-def]
        c = self.broker.pull_consumer(
            group, consume_from=consume_from, consume_timestamp=consume_timestamp, client_id=client_id
        )
        self.consumers.append(c)
        return c

    def close(self) -> None:
        for c in self.consumers:
            c.close()
        self.broker.close()
        self.cluster.stop()


@pytest.fixture
def harness() -> Iterator[KafkaHarness]:
    h = KafkaHarness()
    yield h
    h.close()


class TestKafkaContract(SourceContract):
    pass
