"""``dead_letter_order="key"`` on the Redis and Kafka sources (a
redis-server and librdkafka's mock cluster, started by the tests on
127.0.0.1): a dead-lettered key holds its later messages, a new member of
the group still holds it (it reads the dead-letter topic back), and
``resend_key`` runs the held messages in order, then releases the key.
The same case on the embedded broker, and the rest, is in
``test_dlq_key_order.py``."""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import wait_for

from lite_push import ConfigError, ConsumerConfig, LitePushConsumer, MessageExt, held_keys, resend_key
from lite_push.dlq import iter_dead_letters
from lite_push.sources import Balance, ConsumeFromWhere
from lite_push.sources.redis import RedisBroker
from lite_push.sources.redis_server import RedisServer

FIRST = ConsumeFromWhere.FIRST_OFFSET
#: The mock's rebalances take the session less a second: keep it short.
KAFKA_SESSION = 3.0


class Listener:
    """Records the bodies that ran per key; fails ``K-0`` while ``broken``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ran: dict[str | None, list[bytes]] = defaultdict(list)
        self.broken = True

    def __call__(self, msgs: list[MessageExt]) -> None:
        for m in msgs:
            if self.broken and m.body == b"K-0":
                raise ValueError("cannot process K-0")
            with self.lock:
                self.ran[m.keys].append(m.body)

    def bodies(self, key: str) -> list[bytes]:
        with self.lock:
            return list(self.ran[key])

    def others(self) -> int:
        with self.lock:
            return sum(len(v) for k, v in self.ran.items() if k != "K")


def _send(broker: Any, start: int, n: int) -> None:
    """``n`` messages to T's queue 0 (K every 4th, bodies ``key-i``) and as
    many of key x to queue 1."""
    keys = ("K", "a", "b", "c")
    span = range(start, start + n)
    items = [{"body": f"{keys[i % 4]}-{i}".encode(), "keys": keys[i % 4], "queue_id": 0} for i in span]
    items += [{"body": b"x-%d" % i, "keys": "x", "queue_id": 1} for i in span]
    broker.send_batch("T", items)


def _consumer(source: Any, listener: Listener, **cfg: Any) -> LitePushConsumer:
    cfg.setdefault("poll_timeout", 0.02)
    cfg.setdefault("commit_interval", 0.05)
    config = ConsumerConfig(group="g", lanes=4, max_reconsume_times=0, dead_letter_order="key", **cfg)
    consumer = LitePushConsumer(config, source=source, listener=listener)
    consumer.subscribe("T")
    return consumer


def _the_core_case(broker: Any, member: Any, **cfg: Any) -> None:
    """K held by one member, still held by the next, released by resend_key."""
    _send(broker, 0, 12)
    first = Listener()
    with _consumer(member("c1"), first, **cfg) as c:
        wait_for(lambda: c.stats().dead_lettered == 3 and first.others() == 21, 60, lambda: f"{c.stats()}")
        assert c.stats().held_key_names == ("K",)
    assert first.bodies("K") == []
    second = Listener()
    second.broken = False  # fixed: but K's messages must wait for their dead letters
    with _consumer(member("c2"), second, **cfg) as c:
        _send(broker, 12, 8)  # K-12, K-16
        wait_for(lambda: second.others() == 14 and c.stats().dead_lettered == 2, 60, lambda: f"{c.stats()}")
        assert second.bodies("K") == []
        [held] = held_keys(broker, "g")
        assert (held.key, held.letters, held.first_origin) == ("K", 5, "T/0/0")
        assert [d.message.body for d in iter_dead_letters(broker, "g")] == [b"K-%d" % i for i in (0, 4, 8, 12, 16)]
        resend_key(broker, "g", "K")
        wait_for(lambda: len(second.bodies("K")) == 5, 60, lambda: f"{second.bodies('K')}")
        _send(broker, 20, 4)  # K-20 runs: K is free again
        wait_for(lambda: len(second.bodies("K")) == 6, 60, lambda: f"{second.bodies('K')}")
        assert c.stats().held_keys == 0
    assert second.bodies("K") == [b"K-%d" % i for i in (0, 4, 8, 12, 16, 20)]
    assert held_keys(broker, "g") == []


# -- Redis ------------------------------------------------------------------------------


@pytest.fixture
def redis_broker(redis_server: RedisServer) -> Iterator[RedisBroker]:
    b = RedisBroker(
        redis_server.url, namespace=f"k-{uuid.uuid4().hex[:12]}", session_timeout=5.0, heartbeat_interval=0.5
    )
    yield b
    b.close()


def test_the_core_case_on_redis(redis_broker):
    redis_broker.create_topic("T", 2)
    _the_core_case(
        redis_broker,
        lambda cid: redis_broker.pull_consumer("g", consume_from=FIRST, client_id=cid),
        revoke_timeout=3.0,
    )


def test_a_redis_source_balanced_by_message_refuses_key_order(redis_broker):
    redis_broker.create_topic("T", 2)
    source = redis_broker.pull_consumer("g", consume_from=FIRST, balance=Balance.MESSAGE)
    with pytest.raises(ConfigError, match="dead_letter_order.*balances by message"):
        _consumer(source, Listener(), revoke_timeout=3.0)
    source.close()


# -- Kafka ------------------------------------------------------------------------------


@pytest.fixture
def kafka_broker() -> Iterator[Any]:
    from lite_push.sources.kafka import KafkaBroker
    from lite_push.sources.kafka.mock_cluster import MockKafkaCluster

    with MockKafkaCluster() as cluster:
        b = KafkaBroker(cluster.bootstrap, topic_creator=cluster.create_topic, session_timeout=KAFKA_SESSION)
        yield b
        b.close()


def test_the_core_case_on_kafka(kafka_broker):
    kafka_broker.create_topic("T", 2)
    _the_core_case(
        kafka_broker,
        lambda cid: kafka_broker.pull_consumer("g", consume_from=FIRST, client_id=cid),
        revoke_timeout=2.0,  # + fence_margin inside the 3 s session
    )
