"""The topics of one Kafka cluster as lite_push sees them: how many
partitions each has (cached once read), and creating them.

A broker with the admin API creates topics with ``CreateTopics``; a
``creator`` replaces that (librdkafka's mock cluster has no admin API: its
``create_topic``).  A cluster that answers ``CreateTopics`` with "not
supported" gets a :class:`~lite_push.LitePushError` that says how to create
the topic with Kafka's own ``kafka-topics.sh``.  Partition counts come from
the metadata of every topic, never of one by name, so asking never
auto-creates a topic.  Kafka's internal topics (``__consumer_offsets``,
``__transaction_state``, ...: every name that starts with ``__``) are not
lite_push topics: :meth:`TopicCatalog.names` leaves them out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from ..._errors import ConfigError, LitePushError, UnknownTopicError
from ..._types import MessageQueue
from .client_log import LIBRDKAFKA_LOG
from .codec import kafka_topic, lite_topic

__all__ = ["INTERNAL_PREFIX", "TopicCatalog"]

#: Kafka's own topics (``__consumer_offsets``, ``__transaction_state``) start
#: with this; they are not listed as lite_push topics.
INTERNAL_PREFIX = "__"

#: What a cluster without topic creation through the admin API answers
#: ``CreateTopics`` with (librdkafka's mock cluster: ``_UNSUPPORTED_FEATURE``).
_UNSUPPORTED = frozenset({KafkaError._UNSUPPORTED_FEATURE, KafkaError.UNSUPPORTED_VERSION})


class TopicCatalog:
    """The topics of a cluster.  ``client`` (the broker's producer) answers
    metadata requests; ``admin_settings`` make the admin client of
    ``CreateTopics`` unless ``creator`` is given; queues name
    ``broker_name``; ``check_open`` raises once the broker is closed.
    Thread-safe."""

    def __init__(
        self,
        client: Any,
        admin_settings: Mapping[str, Any],
        creator: Callable[[str, int], None] | None,
        broker_name: str,
        check_open: Callable[[], None],
    ) -> None:
        self._client = client
        self._admin_settings = dict(admin_settings)
        self._creator = creator
        self._broker_name = broker_name
        self._check_open = check_open
        self._lock = threading.Lock()
        self._partitions: dict[str, int] = {}

    def create_topic(self, topic: str, partitions: int) -> list[MessageQueue]:
        """Create ``topic`` (its lite_push name) with ``partitions``
        partitions and return its queues.  Idempotent when the topic exists
        with that many partitions; ``ConfigError`` naming ``partitions`` when
        it exists with another count (an existing topic is left as it is);
        ``LitePushError`` saying how to create it with ``kafka-topics.sh``
        when the cluster does not support ``CreateTopics``."""
        self._check_open()
        if type(partitions) is not int or partitions < 1:
            raise ValueError(f"partitions must be an int >= 1, got {partitions!r}")
        queues = self._ensure(topic, partitions)
        if len(queues) != partitions:
            raise ConfigError("partitions", f"topic {topic!r} exists with {len(queues)} partitions, not {partitions}")
        return queues

    def _ensure(self, topic: str, partitions: int) -> list[MessageQueue]:
        """The queues of ``topic``, created with ``partitions`` partitions
        unless it exists (with whatever count it has)."""
        name = kafka_topic(topic)
        if self.partition_count(topic) is None:
            self._create(topic, name, partitions)
            deadline = time.monotonic() + 10.0
            while self.partition_count(topic, fresh=True) is None:
                if time.monotonic() > deadline:
                    raise UnknownTopicError(topic)
                time.sleep(0.05)
        return self.queues(topic)

    def _create(self, topic: str, name: str, partitions: int) -> None:
        if self._creator is not None:
            try:
                self._creator(name, partitions)
            except Exception as e:
                if "exists" not in str(e).lower():
                    raise
            return
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.cimpl import NewTopic

        admin = AdminClient({**self._admin_settings, "logger": LIBRDKAFKA_LOG})  # type: ignore[dict-item]
        futures = admin.create_topics([NewTopic(name, partitions)], operation_timeout=10.0, request_timeout=15.0)
        try:
            futures[name].result(timeout=20.0)
        except KafkaException as e:
            err = e.args[0] if e.args else None
            if not isinstance(err, KafkaError):
                raise
            if err.code() in _UNSUPPORTED:
                servers = self._admin_settings.get("bootstrap.servers", "HOST:PORT")
                raise LitePushError(
                    f"topic {topic!r}: this Kafka cluster does not support creating topics through the admin API "
                    f"({err.name()}); create it with Kafka's own tool: kafka-topics.sh --bootstrap-server {servers} "
                    f"--create --topic {name} --partitions {partitions} (librdkafka's mock cluster, as python -m "
                    f"lite_push.sources.kafka.mock_cluster runs it: start it with --topic {name}:{partitions})"
                ) from None
            if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise

    def ensure_topic(self, topic: str, partitions: int = 1) -> None:
        """Create ``topic`` unless it exists (retry and dead-letter topics),
        whatever count an existing one has."""
        if self.partition_count(topic) is None:
            self._check_open()
            self._ensure(topic, partitions)

    def names(self) -> list[str]:
        """Every topic's lite_push name, sorted (retry and dead-letter topics
        under their ``%RETRY%`` / ``%DLQ%`` names; Kafka's internal topics
        left out); the partition counts read are cached."""
        self._check_open()
        md = self._client.list_topics(timeout=10.0)
        counts = {t: len(m.partitions) for t, m in md.topics.items() if m.error is None and m.partitions}
        with self._lock:
            self._partitions.update(counts)
        return sorted(lite_topic(t) for t in counts if not t.startswith(INTERNAL_PREFIX))

    def partition_count(self, topic: str, *, fresh: bool = False, client: Any = None) -> int | None:
        """How many partitions ``topic`` (lite_push name) has, or None when
        it does not exist; through ``client`` (a consumer about to join: its
        first connection is then made before the join needs it), else
        through the broker's producer."""
        name = kafka_topic(topic)
        if not fresh and name in self._partitions:
            return self._partitions[name]
        md = (client or self._client).list_topics(timeout=10.0)
        counts = {t: len(m.partitions) for t, m in md.topics.items() if m.error is None and m.partitions}
        with self._lock:
            self._partitions.update(counts)
        return counts.get(name)

    def queues(self, topic: str) -> list[MessageQueue]:
        """The queues of ``topic``, sorted; ``UnknownTopicError`` if none."""
        n = self.partition_count(topic)
        if n is None:
            raise UnknownTopicError(topic)
        return [MessageQueue(topic, self._broker_name, i) for i in range(n)]
