"""``queue_ranges``: a topic's queues and their stored offsets, the same on
the embedded broker, Redis and Kafka (librdkafka's mock cluster)."""

from __future__ import annotations

import pytest

from lite_push import UnknownTopicError
from lite_push.cli.queues import QueueRange, queue_ranges
from lite_push.sources import EmbeddedBroker
from lite_push.sources.kafka import KafkaBroker
from lite_push.sources.kafka.mock_cluster import MockKafkaCluster
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer


def _fill(b: EmbeddedBroker | RedisBroker | KafkaBroker) -> None:
    b.create_topic("T", 3)
    b.send_batch("T", [{"body": b"x", "queue_id": q} for q in (0, 0, 2, 0)])


def _check(b: EmbeddedBroker | RedisBroker | KafkaBroker) -> None:
    _fill(b)
    ranges = queue_ranges(b, "T")
    assert [(r.queue.queue_id, r.first, r.end) for r in ranges] == [(0, 0, 3), (1, 0, 0), (2, 0, 1)]
    assert all(isinstance(r, QueueRange) and r.queue.topic == "T" for r in ranges)
    with pytest.raises(UnknownTopicError):
        queue_ranges(b, "nope")


def test_embedded() -> None:
    with EmbeddedBroker() as b:
        _check(b)


def test_redis(redis_server: RedisServer) -> None:
    with RedisBroker(redis_server.url, namespace="qr") as b:
        _check(b)


def test_kafka() -> None:
    with MockKafkaCluster() as cluster:
        b = KafkaBroker(cluster.bootstrap, topic_creator=cluster.create_topic)
        try:
            _check(b)
        finally:
            b.close()
